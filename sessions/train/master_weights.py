"""Weights stored in bfloat16, the optimizer's arithmetic in float32: session 6's
recipes of mixed precision (python sessions/s2_train.py --weights bfloat16 [--master]).

    optimizer = in_float32(make_optimizer(tc, steps), master=True)

The course's default keeps float32 weights and casts them to the compute dtype inside
each step: 4 bytes a weight held, and 2 more, a bf16 copy, while the step runs. Stored
in bfloat16 the weights are already the matmuls' operands, but a bfloat16 number has
8 significant bits: a weight near 0.02 moves in steps of 2^-13 (1.2e-4), so an update
smaller than half that, 6e-5, rounds back to the same weight. AdamW's updates are about
the learning rate, and late in a run's decay (or at a small lr) they fall below it.

    master=True    the optimizer holds a float32 copy (4 bytes a weight) and updates it;
                   the bf16 weights are that copy rounded, once a step. Every update
                   counts, as in float32: Megatron-LM's and ZeRO's recipe.
    master=False   the update is added to the bf16 weights themselves, in float32, and
                   rounded: small ones are lost. The JAX scaling book's 10 bytes a
                   parameter (bf16 weights, float32 m and v) count this recipe.

Either way AdamW's m and v are float32 (they are built from the float32 view of the
weights), and the gradients, bf16 as autodiff gives them for bf16 weights, are made
float32 before the optimizer reads them, so the clip's norm sums in float32.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class MasterState(NamedTuple):
    master: optax.Params  # the float32 weights the bf16 ones are rounded from
    inner: optax.OptState  # the optimizer's own state, built on the master


def float32(tree):
    return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def in_float32(inner, *, master):
    """The optax optimizer `inner`, run in float32 for bf16 weights. Its updates, added to
    the bf16 weights by optax.apply_updates (in float32, then rounded to bf16), land them
    on the master rounded (master=True) or on the weights plus the update, rounded."""

    def init(params):
        weights = float32(params)
        state = inner.init(weights)
        return MasterState(weights, state) if master else state

    def update(grads, state, params):
        if not master:
            return inner.update(float32(grads), state, float32(params))
        updates, inner_state = inner.update(float32(grads), state.inner, state.master)
        new_master = optax.apply_updates(state.master, updates)
        # What, added to the bf16 weights, gives the new master rounded to bf16 (t): t - p.
        # Not m - p: where an update is large beside its weight, m - p is not exact in
        # float32, and p + (m - p) may then round to t's neighbour (seen on a Zen 3 with JAX
        # 0.12). t - p may round too, but t is a bf16 value and float32's error is far
        # below half a bf16 place, so p + (t - p) rounds back to t: the weights are the
        # master rounded, exactly.
        to_master = jax.tree.map(
            lambda m, p: m.astype(p.dtype).astype(m.dtype) - p.astype(m.dtype), new_master, params
        )
        return to_master, MasterState(new_master, inner_state)

    return optax.GradientTransformation(init, update)

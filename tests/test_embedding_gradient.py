"""The token embedding's gradient sums in float32 in a bf16 step, on this CPU.

The lookup `table[tokens]` is a gather; its gradient is a scatter-add, each
position's gradient added into its token's row. Cast to bf16 before the lookup,
that sum ran on the first H100 run as bf16 atomics: 0.12x PyTorch's tokens/s,
and the updates of frequent bytes lost (docs/h100-run, sessions/model/transformer.py's
embed). tests/test_step_plans.py reads the course step compiled for h100:1 and
a TPU; these tests hold the same property on any machine: in numbers against a
float64 sum, and in the program this CPU compiles.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from roofline.compiled.scatters import scatters
from sessions.model import transformer
from sessions.model.config import PRESETS, TrainConfig
from sessions.train.step import init_state, loss_fn, make_optimizer, make_train_step
from solutions.bug_bf16_scatter import broken_embedding_grad

CFG = dataclasses.replace(PRESETS["tiny"].model, dtype="bfloat16")  # E=48, S=64
B = 16
SPACE = 32  # the space byte, a fifth to a third of English text


def skewed_batch(seed=0):
    """inputs with SPACE at 30% of the B x S positions, and random targets."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, CFG.vocab, (B, CFG.seq))
    inputs[rng.random(inputs.shape) < 0.3] = SPACE
    targets = rng.integers(0, CFG.vocab, (B, CFG.seq))
    return {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets)}


def test_the_step_s_lookup_gradient_is_the_float64_sum(key, monkeypatch):
    """The bf16 step's loss, differentiated. Its lookup is routed through a
    table of its own, cast to whatever dtype forward hands the lookup (so a
    forward that casts first is caught too), plus a zero probe on its output:
    the table's gradient is then the lookup's alone, not the tied output
    projection's, and the probe's gradient is the cotangent the lookup got.
    Expected: those cotangents summed by numpy into float64 rows.

    In float32, each of the ~300 updates of the space byte's row rounds the
    running sum to 24 bits: error near 1e-7 of the row. Summed in bf16 (8
    bits), an update below half the sum's last place is lost and each add is
    off by up to 2^-9 of the sum: the row off by about 1e-2 of its size."""
    batch = skewed_batch()
    params = transformer.init_params(CFG, key)
    real_embed = transformer.embed

    def loss(table, probe):
        def lookup(p, tokens, cfg, start=0):
            p = {**p, "embed": table.astype(p["embed"].dtype)}  # as forward handed it
            return real_embed(p, tokens, cfg, start) + probe

        monkeypatch.setattr(transformer, "embed", lookup)
        return loss_fn(params, batch, CFG)

    probe = jnp.zeros((B, CFG.seq, CFG.embed), jnp.bfloat16)
    got, cotangent = jax.grad(loss, argnums=(0, 1))(params["embed"], probe)

    expected = np.zeros((CFG.vocab, CFG.embed))
    np.add.at(expected, np.asarray(batch["inputs"]), np.asarray(cotangent, np.float64))
    assert (np.asarray(batch["inputs"]) == SPACE).sum() > 250  # the skew
    assert got.dtype == jnp.float32
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)


def test_the_homework_s_broken_lookup_loses_the_frequent_byte_s_updates():
    """exercises/bug_bf16_scatter.py's premise, on this CPU: the table cast to
    bf16 and then looked up, the space byte's row is far from the float64 sum.
    Unit cotangents: its ~300 updates bring the running sum to about 17, where
    bf16's last place is 0.125, so each add rounds by up to 0.06."""
    rng = np.random.default_rng(0)
    tokens = np.asarray(skewed_batch()["inputs"])
    table = jnp.asarray(rng.standard_normal((CFG.vocab, CFG.embed)), jnp.float32)
    cotangent = rng.standard_normal((*tokens.shape, CFG.embed))
    got = broken_embedding_grad(table, jnp.asarray(tokens), jnp.asarray(cotangent, jnp.bfloat16))
    expected = np.zeros((CFG.vocab, CFG.embed))
    rounded = np.asarray(jnp.asarray(cotangent, jnp.bfloat16), np.float64)  # what it was given
    np.add.at(expected, tokens, rounded)
    assert np.max(np.abs(np.asarray(got, np.float64)[SPACE] - expected[SPACE])) > 0.1


@pytest.fixture(scope="module", params=["float32", "bfloat16"], ids=["f32 weights", "bf16 weights"])
def bf16_step_hlo(key, request):
    """The tiny bf16 training step (loss, gradient, AdamW) compiled on this CPU, its
    weights stored in float32 (the default) or in bf16 with a float32 master."""
    tc = TrainConfig(weights=request.param, master=request.param == "bfloat16")
    optimizer = make_optimizer(tc, total_steps=10)
    state = jax.eval_shape(
        lambda: init_state(key, cfg=CFG, optimizer=optimizer, weights=tc.weights)
    )
    batch = jax.eval_shape(skewed_batch)
    step = make_train_step(CFG, optimizer)
    return step.lower(state, batch).compile().as_text()


def test_a_bf16_step_compiled_here_sums_every_scatter_in_float32(bf16_step_hlo):
    found = scatters(bf16_step_hlo)
    assert (CFG.vocab, CFG.embed) in {s.shape for s in found}  # the lookup's gradient
    assert {s.dtype for s in found} == {"f32"}, found

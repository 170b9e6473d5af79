"""The decode step's head as one kernel (sessions/kernels/decode_head.py): in Mosaic GPU's
interpreter (JAX 0.12, races watched) against XLA's head, the last partials settled, the
final norm and the tied unembedding, as kernel_step runs it without the kernel."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.inference.kernel_step import clock
from sessions.inference.layout import dense_out_in
from sessions.kernels import mosaic
from sessions.kernels.decode_head import head, head_refusal
from sessions.kernels.decode_residual import settle
from sessions.model.config import ModelConfig
from sessions.model.transformer import unembed

BF16 = jnp.bfloat16


def inputs(B, E, V, P, seed=0):
    """(decode weights with a tied table [V, E] and a final norm, x [B, E], P pending
    partials [P, B, E] float32, held logits [B, V]), drawn by NumPy."""
    rng = np.random.default_rng(seed)

    def draw(shape, std, dtype=BF16):
        return jnp.asarray(std * rng.standard_normal(shape, np.float32)).astype(dtype)

    w = {"embed": draw((V, E), 0.5), "final_norm": draw(E, 0.2) + 1}
    return w, draw((B, E), 1.0), draw((P, B, E), 0.3, jnp.float32), draw((B, V), 1, jnp.float32)


# E=768 streams 12 table tiles through 8 slots, refilled; E=128 2, fewer than the slots.
# V=192 is 3 CTAs; P=5 pending partials; B=8 fills wgmma's N.
SHAPES = [
    pytest.param(1, 768, 128, 5, id="B1-E768-V128-P5"),
    pytest.param(8, 128, 192, 2, id="B8-E128-V192-P2"),
]


@pytest.mark.skipif(mosaic.OLD_INTERPRETER, reason="Mosaic GPU's interpreter from JAX 0.12 on")
@pytest.mark.parametrize("B, E, V, P", SHAPES)
def test_the_head_equals_xla_s_and_keeps_the_logits_where_not_live(B, E, V, P, monkeypatch):
    # The interpreter also watches every SMEM access, TMA's included, for a race.
    races = functools.partial(plgpu.InterpretGPUParams, detect_races=True)
    monkeypatch.setattr(mosaic, "interpret_params", races)
    cfg = ModelConfig(embed=E, ff=128, heads=2, head_dim=64, layers=1, vocab=V, dtype="bfloat16")
    w, x, pending, held = inputs(B, E, V, P)
    assert head_refusal(cfg) is None
    # Step i of a call of n from position 3 (kernel_step.clock): live where i < n.
    run = jax.jit(
        lambda i, n: head(
            w, x, pending, held, clock(None, None, (i, jnp.array([3, n]))), cfg, interpret=True
        )
    )
    got = run(1, 2)
    want = unembed(w, settle(x, pending)[:, None], dense=dense_out_in)[:, 0].astype(jnp.float32)
    assert got.dtype == jnp.float32 and got.shape == (B, V)
    # Each logit a dot of E bf16 products in float32, in another order than XLA's, rounded
    # to bf16 once: one bf16 step (2^-7 relative) apart at most, near a rounding edge; the
    # normed tokens, from a mean of squares summed in another order, a step apart too.
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2 * 2.0**-7, atol=1e-3)
    not_live = run(2, 2)
    np.testing.assert_array_equal(np.asarray(not_live), np.asarray(held))


def test_a_head_it_cannot_run_is_refused_in_one_line():
    cfg = ModelConfig(embed=64, ff=128, heads=2, head_dim=64, layers=1, vocab=100)
    assert head_refusal(cfg) == "the vocabulary 100 is no multiple of 64"
    untied = dataclasses.replace(cfg, vocab=128, tied=False)
    assert head_refusal(untied) == "the unembedding is untied"
    assert head_refusal(dataclasses.replace(cfg, vocab=128)) is None

"""The attention half of a decode layer as one Mosaic GPU kernel (sessions/kernels/decode_attention.py):
run in Mosaic GPU's interpreter on this CPU (JAX 0.12, races watched) against XLA's
attention half of kv_cache.decode_step, and compiled for an H100 without one (JAX 0.10)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.inference import kv_cache
from sessions.inference.kernel_step import clock, rope_tables
from sessions.inference.layout import dense_out_in
from sessions.kernels import decode_grid, decode_residual, mosaic
from sessions.kernels.decode_attention import attention_layer, attention_refusal
from sessions.model.config import PRESETS, ModelConfig
from sessions.model.transformer import attention_block, rms_norm
from tests.helpers import need


def rope_at(pos, cfg):
    """The cos and sin tables a RoPE layer's kernel takes at pos (None without RoPE)."""
    return rope_tables(pos, cfg.head_dim, cfg.rope_base) if cfg.rope else None


def make(B, E, H, K, D, T, P, rope, seed=0):
    """A layer in the decode layout (weights [out, in]), a filled cache, x and P pending sums.
    NumPy draws them: no JAX program to compile for the inputs (a dozen per shape)."""
    cfg = ModelConfig(embed=E, heads=H, head_dim=D, kv_heads=K, seq=T, rope=rope, dtype="bfloat16")
    rng = np.random.default_rng(seed)

    def normal(shape, scale=1.0, shift=0.0, dtype=jnp.bfloat16):
        return jnp.asarray((shift + scale * rng.standard_normal(shape, np.float32)).astype(dtype))

    layer = {
        "wq": normal((H, D, E), E**-0.5),
        "wk": normal((K, D, E), E**-0.5),
        "wv": normal((K, D, E), E**-0.5),
        "wo": normal((E, H, D), (H * D) ** -0.5),
        "attn_norm": normal(E, 0.1, 1.0),
    }
    cache = {"k": normal((B, K, D, T)), "v": normal((B, K, T, D))}
    pending = normal((P, B, E), 0.5, dtype=jnp.float32)
    return cfg, layer, cache, normal((B, E)), pending


def xla_half(layer, cache, x, pending, pos, live, cfg):
    """XLA's attention half (kv_cache.decode_step's): the residual summed in float32, one
    pending sum after another, the norm, attention over the cache, and the cache write."""
    x32 = x.astype(jnp.float32)
    for p in pending:
        x32 = x32 + p
    x_now = x32.astype(cfg.dtype)
    attend = kv_cache._attend_with_cache(cache, pos, live)
    normed = rms_norm(x_now[:, None], layer["attn_norm"])
    out, written = attention_block(layer, normed, cfg, attend, dense=dense_out_in, start=pos)
    return x_now, out[:, 0], written


def float64_half(layer, cache, x_now, pos, cfg):
    """The attention half's output [B, E] in float64 NumPy from the same bf16 weights, cache
    and x_now, with no rounding between: the truth both paths approximate."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    (H, D, _), K, B = layer["wq"].shape, layer["wk"].shape[0], x_now.shape[0]
    x = f(x_now)
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * f(layer["attn_norm"])
    q = np.einsum("HDE,BE->BHD", f(layer["wq"]), x).reshape(B, K, H // K, D)
    k, v = (np.einsum("KDE,BE->BKD", f(layer[w]), x) for w in ("wk", "wv"))
    if cfg.rope:  # rotate_half pairs (i, i + D/2), turned by pos * base^(-2i/D)
        theta = pos * cfg.rope_base ** (-np.arange(0, D, 2) / D)
        c, s = np.cos(theta), np.sin(theta)

        def turn(y):
            y1, y2 = y[..., : D // 2], y[..., D // 2 :]
            return np.concatenate([y1 * c - y2 * s, y2 * c + y1 * s], -1)

        q, k = turn(q), turn(k)
    old = np.einsum("BKGD,BKDT->BKGT", q, f(cache["k"])[..., :pos])
    scores = np.concatenate([old, np.einsum("BKGD,BKD->BKG", q, k)[..., None]], -1) * D**-0.5
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("BKGT,BKTD->BKGD", p[..., :pos], f(cache["v"])[:, :, :pos])
    out = out + p[..., pos:] * v[:, :, None]
    return np.einsum("EHD,BHD->BE", f(layer["wo"]), out.reshape(B, H, D))


# (B, E, H, K, D, T, P, rope, pos, live): T 128 in two slices, the second's first 6 slots
# filled, E in two chunks; T 256 in four slices, two of them empty (weight 0 in the merge);
# T 2560 in 8 slices of 5 tiles, slice 0's 5 through a cache ring of 4 (one slot refilled);
# E 2048 (the 1.2B shape's, its tokens in SMEM [8, E]) with heads of 128; two KV heads of
# two query heads each, with RoPE; heads of 128 (two 64-wide blocks); then two steps of one
# program (pos and live are traced), one KV head of two query heads: pos 0, no cache read
# at all (and q unseen: one key), and the last slot, T - 1, with live false (the cache must
# keep what it held).
ONE_KV_HEAD = (3, 64, 2, 1, 64, 64, 1, True)
CASES = [
    pytest.param(2, 128, 2, 2, 64, 128, 2, False, 70, True, id="mha-pos70-2-slices"),
    pytest.param(2, 64, 2, 1, 64, 256, 3, True, 100, True, id="gqa-rope-4-slices-2-empty"),
    pytest.param(1, 64, 2, 1, 64, 2560, 2, True, 330, True, id="8-slices-cache-ring-refilled"),
    pytest.param(1, 2048, 2, 2, 128, 64, 2, False, 9, True, id="e2048-d128"),
    pytest.param(2, 64, 4, 2, 64, 64, 1, True, 37, True, id="gqa-rope-pos37"),
    pytest.param(1, 64, 2, 1, 128, 64, 1, True, 5, True, id="d128-rope-pos5"),
    pytest.param(*ONE_KV_HEAD, 0, True, id="gqa-rope-pos0"),
    pytest.param(*ONE_KV_HEAD, 63, False, id="gqa-rope-last-slot-not-live"),
]


@functools.partial(jax.jit, static_argnames="cfg")
def kernel_half(layer, cache, x, pending, pos, live, cfg):
    """The kernel, interpreted: compiled once per cfg and shapes, for any pos and live."""
    rope = rope_at(pos, cfg)
    where = clock(pos, live)
    return attention_layer(layer, cache, x, pending, where, cfg, rope=rope, interpret=True)


xla_half_jitted = jax.jit(xla_half, static_argnames="cfg")


# JAX 0.10's interpreter reads no plgpu.load and no transposed store (the tokens' turn
# from N to M): the 3.11 leg compiles the kernel for an H100 instead (below).
@pytest.mark.skipif(mosaic.OLD_INTERPRETER, reason="Mosaic GPU's interpreter from JAX 0.12 on")
@pytest.mark.parametrize("B, E, H, K, D, T, P, rope, pos, live", CASES)
def test_the_kernel_equals_xla_in_the_interpreter(
    B, E, H, K, D, T, P, rope, pos, live, monkeypatch
):
    # The interpreter also watches every SMEM access, TMA's included, for a race: a
    # slot refilled before every thread has read it raises (and fails the test).
    races = functools.partial(plgpu.InterpretGPUParams, detect_races=True)
    monkeypatch.setattr(mosaic, "interpret_params", races)
    cfg, layer, cache, x, pending = make(B, E, H, K, D, T, P, rope)
    pos = jnp.int32(pos)
    live = jnp.bool_(live)
    x_now, partials, stats, written = kernel_half(layer, cache, x, pending, pos, live, cfg)
    want_x, want_out, want_cache = xla_half_jitted(layer, cache, x, pending, pos, live, cfg=cfg)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    S = decode_grid.slices(cfg)
    assert min(T // 64, 8) == S and partials.shape == (H * S, B, E) == (stats.shape[0], B, E)
    # The residual: the same float32 sums in the same order, rounded once: bit for bit.
    np.testing.assert_array_equal(f32(x_now), f32(want_x))
    # The cache: every slot but pos bit for bit as it was; slot pos, where live, XLA's k and
    # v up to one bf16 step (each a dot of E bf16 products summed in float32 in another
    # order, then rounded once: a sum near a rounding edge may land one step apart);
    # where not live, exactly what it held.
    for name, axis in (("k", 3), ("v", 2)):
        mine, xla, held = (np.moveaxis(f32(c[name]), axis, 0) for c in (written, want_cache, cache))
        others = np.arange(T) != int(pos)
        np.testing.assert_array_equal(mine[others], held[others], err_msg=name)
        want = xla[int(pos)] if live else held[int(pos)]
        np.testing.assert_allclose(mine[int(pos)], want, rtol=2**-7 if live else 0, err_msg=name)
    # The output, against the float64 truth: each path rounds q, k, v and the attention
    # output to bf16 (2^-9 relative each), XLA its probabilities and the output too, the
    # kernel its probabilities; three bf16 steps (2^-8 each) at the output's magnitude bound
    # either's error. XLA's own output meets the bound: it is fair.
    truth = float64_half(layer, cache, want_x, int(pos), cfg)
    atol = 3 * 2.0**-8 * np.abs(truth).max()
    np.testing.assert_allclose(f32(want_out), truth, atol=atol, rtol=0, err_msg="XLA's")
    merged = decode_residual.settle(jnp.zeros_like(x, jnp.float32), partials, stats, S)
    np.testing.assert_allclose(f32(merged), truth, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def compiled_for_h100():
    """The kernel at GPT-2's head shape (D 64, 12 heads) with GQA and RoPE, compiled for
    h100:1 without a GPU, its cache donated as decode_steps donates it."""
    need("gpu")
    from sessions.plan.programs import devices_for

    _, devices = devices_for("h100:1")
    B, E, H, K, D, T, P = 4, 768, 12, 4, 64, 256, 3
    cfg, layer, cache, x, pending = make(B, E, H, K, D, T, P, True)
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)  # noqa: E731
    args = jax.tree.map(spec, (layer, cache, x, pending, jnp.int32(0), jnp.bool_(True)))

    def half(layer, cache, x, pending, pos, live):
        rope = rope_at(pos, cfg)
        where = clock(pos, live)
        return attention_layer(layer, cache, x, pending, where, cfg, rope=rope, interpret=False)

    return jax.jit(half, donate_argnums=(1,)).lower(*args).compile().as_text()


def test_compiled_for_an_h100_it_is_one_kernel_that_writes_the_cache_in_place(compiled_for_h100):
    text = compiled_for_h100
    calls = re.findall(r'custom_call_target="([^"]+)"', text)
    assert calls == ["mosaic_gpu_v2"]
    # The cache's two arrays are outputs aliased to inputs: written where they lie.
    (line,) = [line for line in text.splitlines() if "mosaic_gpu_v2" in line]
    assert len(re.findall(r"\{\d+\}: \(\d+, \{\}\)", line)) == 2
    # and never copied whole: no copy of a [B, K, D, T] or [B, K, T, D] array.
    assert not re.search(r"bf16\[4,4,(64,256|256,64)\][^=]*= *copy", text)


def test_which_models_it_takes():
    # Each course preset but "tiny" (heads of 12), at 8 rows, and the 1.2B shape (16 heads
    # of 128, E 2048): its tokens are [8, E] in SMEM, not [64, E] (256 KB, more than a CTA
    # has), with the rings (decode_grid.RINGS) that fit: by hand, (2, 6, 4) takes 6 x 8 KB of
    # weights, 4 x 64 KB of cache, 32 KB of xn, 2 KB more (215,040 B), and the attention's q, k,
    # v, p, stages (81,920): 290 KB, past 220 KB; (2, 4, 2) takes 133,120 + 81,920 = 215,040.
    big = ModelConfig(embed=2048, ff=8192, heads=16, head_dim=128, seq=1024, layers=24)
    for cfg in [*(PRESETS[name].model for name in ("cpu", "course", "gpt2-bytes")), big]:
        assert attention_refusal(cfg, 8) is None, cfg
    assert decode_grid.attention_rings(big, 8192 // 64) == (2, 4, 2)
    cfg = PRESETS["gpt2-bytes"].model
    assert attention_refusal(cfg, 9) == "batches of at most 8 rows, not 9"
    assert "multiples of 64" in attention_refusal(PRESETS["tiny"].model, 1)
    # E 8192 with 8 query heads of 128 a KV head: the smallest rings do not fit.
    huge = ModelConfig(embed=8192, ff=8192, heads=64, head_dim=128, kv_heads=8, seq=1024)
    assert "shared memory" in attention_refusal(huge, 1)

"""The MLP half of the decode kernel (sessions/kernels/decode_mlp.py): in Mosaic GPU's
interpreter against XLA's decode path and a float64 reference, and compiled for
an H100 this machine lacks."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.inference.layout import dense_out_in
from sessions.kernels import mosaic
from sessions.kernels.decode_mlp import mlp_layer, mlp_refusal
from sessions.model.config import ModelConfig
from sessions.model.transformer import mlp_block, rms_norm
from tests.helpers import need

BF16 = jnp.bfloat16

# JAX 0.10's interpreter reads no plgpu.load and no transposed wgmma operand; the
# 3.11 leg checks the compiled kernel instead (below).
interpreted = pytest.mark.skipif(
    not hasattr(plgpu, "InterpretGPUParams"),
    reason="Mosaic GPU's interpreter runs this kernel from JAX 0.12 on",
)


def config(E, F, gated):
    return ModelConfig(
        embed=E, ff=F, heads=2, head_dim=64, layers=1, seq=16, dtype="bfloat16", gated=gated
    )


def layer_and_inputs(cfg, B, P, seed=0):
    """A layer in the decode layout (w_in, w_gate [F, E], w_out [E, F], drawn with
    transformer.init_params' std; the norm's scale not all ones), tokens x [B, E] and P
    pending partials [P, B, E] float32 of the size a layer's output has. NumPy
    draws them: no JAX program to compile for the inputs."""
    E, F = cfg.embed, cfg.ff
    rng = np.random.default_rng(seed)

    def draw(shape, std, dtype=BF16):
        return jnp.asarray(std * rng.standard_normal(shape, np.float32)).astype(dtype)

    layer = {
        "mlp_norm": draw(E, 0.2) + 1,
        "w_in": draw((F, E), E**-0.5),
        "w_out": draw((E, F), F**-0.5),
    }
    if cfg.gated:
        layer["w_gate"] = draw((F, E), E**-0.5)
    return layer, draw((B, E), 1.0), draw((P, B, E), 0.3, jnp.float32)


def f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def bf16_step(a):
    """The spacing of bf16 numbers at |a|: 8 significant bits, so 2^(e - 7)."""
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(a), 2**-126))) - 7)


# Pairwise different sizes, small for the interpreter. E=384 is copied in 3 chunks
# of 128 (TMA moves at most 256 along a dim); E=64 streams 2 tiles, fewer than the
# ring's slots; B=8 fills wgmma's N; F=192 is 3 CTAs; P=6 pending partials pass
# through 4 slots, two of them twice.
SHAPES = [
    pytest.param(1, 64, 192, False, 2, id="B1-E64-F192-relu"),
    pytest.param(3, 256, 128, True, 6, id="B3-E256-F128-gated-P6"),
    pytest.param(8, 384, 128, False, 1, id="B8-E384-F128-relu"),
]


@interpreted
@pytest.mark.parametrize("B, E, F, gated, P", SHAPES)
def test_the_kernel_equals_xla_and_a_float64_reference(B, E, F, gated, P, monkeypatch):
    # The interpreter also watches every SMEM access, TMA's included, for a race: a
    # slot refilled before every thread has read it raises (and fails the test).
    races = functools.partial(plgpu.InterpretGPUParams, detect_races=True)
    monkeypatch.setattr(mosaic, "interpret_params", races)
    cfg = config(E, F, gated)
    layer, x, pending = layer_and_inputs(cfg, B, P)
    x_now, partials = mlp_layer(layer, x, pending, cfg, interpret=True)
    assert x_now.dtype == BF16 and x_now.shape == (B, E)
    assert partials.dtype == jnp.float32 and partials.shape == (F // 64, B, E)

    # The residual: x plus each partial in turn, in float32, rounded to bf16 once.
    total = np.asarray(x, np.float32)
    for p in np.asarray(pending):
        total = total + p
    expected = np.asarray(jnp.asarray(total).astype(BF16))
    np.testing.assert_array_equal(np.asarray(x_now).view(np.uint16), expected.view(np.uint16))

    # XLA's MLP on the same x_now, as kv_cache.decode_step runs it.
    normed = rms_norm(jnp.asarray(expected)[:, None], layer["mlp_norm"])
    out = f64(mlp_block(layer, normed, cfg, dense=dense_out_in)[:, 0])
    # float64 reference of each CTA's share, with XLA's roundings: h rounded to
    # bf16 (as its dense returns it), then the F-block's 64 columns of w_out.
    w_in, w_out, n = f64(layer["w_in"]), f64(layer["w_out"]), f64(normed[:, 0])
    h = f64(jnp.asarray(n @ w_in.T).astype(BF16))
    if gated:
        g = f64(jnp.asarray(n @ f64(layer["w_gate"]).T).astype(BF16))
        h = f64(jnp.asarray(g / (1 + np.exp(-g)) * h).astype(BF16))
    h = np.maximum(h, 0) if not gated else h
    blocks = [slice(64 * f, 64 * f + 64) for f in range(F // 64)]
    share = np.stack([h[:, b] @ w_out[:, b].T for b in blocks])  # [F/64, B, E]

    # Tolerances. Both sides round h to bf16 from float32 sums taken in another
    # order, so an h may land one bf16 step (2^-7 of it at most) apart; those
    # differences are independent in sign, so over a contraction of K of them they
    # add up to about sqrt(K) steps of the largest h times the largest |w_out|.
    # (The normed tokens, from a mean of squares summed in another order, may land
    # a step apart too, and move h by less than its own step.) XLA also rounds its
    # output to bf16: half a step of it.
    flip = 2.0**-7 * np.abs(h).max() * np.abs(w_out).max()
    np.testing.assert_allclose(np.asarray(partials), share, rtol=0, atol=math.sqrt(64) * flip)
    sum_atol = bf16_step(np.abs(out).max()) / 2 + math.sqrt(F) * flip
    np.testing.assert_allclose(np.asarray(partials).sum(0), out, rtol=0, atol=sum_atol)


def test_unsupported_shapes_are_refused_in_one_line():
    gpt2 = ModelConfig(embed=768, ff=3072, heads=12, head_dim=64, dtype="bfloat16")
    assert mlp_refusal(gpt2, 8) is None
    assert mlp_refusal(gpt2, 9) == "--decode-impl pallas runs batches up to 8, not 9"
    assert mlp_refusal(dataclasses.replace(gpt2, dtype="float32"), 1) == (
        "--decode-impl pallas runs bfloat16: add --dtype bfloat16"
    )
    assert mlp_refusal(dataclasses.replace(gpt2, embed=48, ff=96), 1) == (
        "--decode-impl pallas needs embed and ff multiples of 64, not 48 and 96"
    )
    assert mlp_refusal(dataclasses.replace(gpt2, embed=4096, ff=11008), 1) == (
        "--decode-impl pallas holds the tokens in SMEM: embed up to 2048, not 4096"
    )


# Compiled for an H100 (deviceless): GPT-2's MLP at batch 8, and a gated one.
COMPILED = [
    pytest.param((8, 768, 3072, False), id="gpt2-B8"),
    pytest.param((2, 512, 1024, True), id="gated-B2"),
]


@pytest.fixture(scope="module", params=COMPILED)
def compiled_for_h100(request):
    need("gpu")
    from sessions.plan.programs import devices_for

    B, E, F, gated = request.param
    cfg = config(E, F, gated)
    _, devices = devices_for("h100:1")
    on_h100 = jax.sharding.SingleDeviceSharding(devices[0])
    layer, x, pending = layer_and_inputs(cfg, B, 1)
    shapes = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_h100), (layer, x, pending)
    )

    def run(layer, x, pending):
        return mlp_layer(layer, x, pending, cfg, interpret=False)

    return jax.jit(run).lower(*shapes).compile().as_text()


def test_compiled_for_an_h100_the_mlp_half_is_one_kernel(compiled_for_h100):
    # ptxas ran (compile() returned) and the whole MLP half is one launch: one
    # Mosaic GPU custom call and no XLA fusion beside it.
    calls = re.findall(r'custom_call_target="([^"]+)"', compiled_for_h100)
    assert len(calls) == 1 and calls[0].startswith("mosaic_gpu"), calls
    assert " fusion(" not in compiled_for_h100

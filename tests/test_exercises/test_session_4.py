"""Session 4 (s4_kernels): flash attention's pieces by hand, FSDP's all-gather
and a collective matmul under jax.shard_map, on 8 simulated CPU devices; the FSDP
napkin (when communication hides); a Pallas matmul with relu fused in; a norm
fused into a matrix-vector product in Mosaic GPU, in its interpreter."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

from roofline.hardware import CHIPS

from .expect import expect

online_softmax_attention = exercise("flash.online_softmax_attention")
flash_tile = exercise("flash.flash_tile")
causal_key_blocks = exercise("flash.causal_key_blocks")
fsdp_dense = exercise("manual_fsdp.fsdp_dense")
ring_matmul = exercise("manual_fsdp.ring_matmul")
fsdp_flops_per_chip = exercise("sharding.fsdp_flops_per_chip")
fsdp_bytes_per_chip = exercise("sharding.fsdp_bytes_per_chip")
fsdp_comm_hidden = exercise("sharding.fsdp_comm_hidden")
matmul_relu = exercise("pallas_matmul.matmul_relu")
norm_matvec = exercise("decode_mlp.norm_matvec")

S, T, D = 32, 64, 16


def qkv(scale=1.0, seed=0):
    q, k, v = jax.random.normal(jax.random.key(seed), (3, T, D))
    return scale * q[:S], scale * k, v


def softmax_attention(q, k, v, mask=None):
    """The reference, written the plain way: every score at once."""
    scores = (q @ k.T) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v


@pytest.mark.exercise("flash.online_softmax_attention")
@pytest.mark.parametrize("scale", [1.0, 10.0], ids=["plain", "large-scores"])
def test_online_softmax_equals_softmax(scale):
    """Scores of about 100 overflow exp() in float32 (past 88) unless the running
    maximum is subtracted first."""
    q, k, v = qkv(scale)
    got = online_softmax_attention(q, k, v, 16)
    expect(got.shape, (S, D), "", "the output's shape [S, D]")
    np.testing.assert_allclose(got, softmax_attention(q, k, v), rtol=1e-4, atol=1e-5)


@pytest.mark.exercise("flash.online_softmax_attention")
def test_online_softmax_never_builds_every_score():
    """Traced, the function holds no [S, T] array: one block of keys at a time."""
    q, k, v = qkv()
    jaxpr = jax.make_jaxpr(lambda q, k, v: online_softmax_attention(q, k, v, 16))(q, k, v)
    shapes = {tuple(var.aval.shape) for eqn in jaxpr.eqns for var in eqn.outvars}
    assert (S, T) not in shapes and (T, S) not in shapes, "the whole score matrix was built"


def fresh(rows):
    return (
        jnp.full((rows,), -jnp.inf, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros((rows, D), jnp.float32),
    )


@pytest.mark.exercise("flash.flash_tile")
def test_two_causal_tiles_equal_causal_attention():
    """Queries 16..31 against keys 0..15 (all visible), then keys 16..31 (the
    diagonal block, masked): the result equals causal attention."""
    q, k, v = qkv()
    rows = slice(16, 32)
    running = fresh(16)
    running = flash_tile(q[rows], k[:16], v[:16], *running)
    diagonal = jnp.arange(16)[None, :] <= jnp.arange(16)[:, None]
    row_max, row_sum, acc = flash_tile(q[rows], k[16:32], v[16:32], *running, mask=diagonal)
    causal = jnp.arange(32)[None, :] <= jnp.arange(32)[:, None]
    expected = softmax_attention(q[:32], k[:32], v[:32], causal)[rows]
    np.testing.assert_allclose(acc / row_sum[:, None], expected, rtol=1e-4, atol=1e-5)
    scores = (q[rows] @ k[:32].T) / math.sqrt(D)
    expected_max = jnp.max(jnp.where(causal[rows], scores, -jnp.inf), -1)
    np.testing.assert_allclose(row_max, expected_max, rtol=1e-6)


@pytest.mark.exercise("flash.flash_tile")
def test_a_tile_with_every_key_hidden_changes_nothing():
    """A fully masked tile first (as the first rows of a diagonal block see),
    then a visible one: no NaN, and the visible one's attention alone."""
    q, k, v = qkv()
    running = flash_tile(q[:8], k[:8], v[:8], *fresh(8), mask=jnp.zeros((8, 8), bool))
    assert bool(jnp.all(jnp.isneginf(running[0]))) and not bool(jnp.any(running[1])), (
        f"every key hidden: row_max {running[0]} (expected -inf), row_sum {running[1]} (0)"
    )
    _, row_sum, acc = flash_tile(q[:8], k[8:16], v[8:16], *running)
    assert bool(jnp.all(jnp.isfinite(acc))), "acc holds NaN or inf after a hidden tile"
    expected = softmax_attention(q[:8], k[8:16], v[8:16])
    np.testing.assert_allclose(acc / row_sum[:, None], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.exercise("flash.causal_key_blocks")
@pytest.mark.parametrize("block_q, block_k", [(16, 16), (16, 32), (32, 16), (24, 16)])
def test_causal_key_blocks_against_the_mask(block_q, block_k):
    """A key block is needed when any (query, key) pair in it has key <= query:
    counted here from the mask itself, for each query block of a 96-long row."""
    S_long = 96
    for i in range(S_long // block_q):
        queries = np.arange(i * block_q, (i + 1) * block_q)
        needed = [
            j
            for j in range(-(-S_long // block_k))
            if np.any(np.arange(j * block_k, (j + 1) * block_k)[None, :] <= queries[:, None])
        ]
        what = f"query block {i} of {block_q} rows, key blocks of {block_k}"
        expect(causal_key_blocks(i, block_q, block_k), max(needed) + 1, "key blocks", what)


def fsdp_mesh(n):
    auto = (jax.sharding.AxisType.Auto,)
    return jax.make_mesh((n,), ("fsdp",), axis_types=auto, devices=jax.devices()[:n])


def x_and_w(n):
    x = jax.random.normal(jax.random.key(1), (4 * n, 8 * n))  # [B, E]
    w = jax.random.normal(jax.random.key(2), (8 * n, 24))  # [E, F]
    return x, w


def collectives(fn, *args):
    """The compiled program's collective ops, by name, as the HLO text spells them."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    names = re.findall(r"= \S+ (all-gather|collective-permute|reduce-scatter|all-reduce)", text)
    starts = re.findall(r"= \S+ (all-gather|collective-permute|reduce-scatter)-start", text)
    return sorted(names + starts)


@pytest.mark.exercise("manual_fsdp.fsdp_dense")
def test_fsdp_dense_and_its_gradient_equal_the_plain_product():
    mesh = fsdp_mesh(8)
    x, w = x_and_w(8)
    np.testing.assert_allclose(fsdp_dense(x, w, mesh), x @ w, rtol=1e-5, atol=1e-4)
    ours = jax.grad(lambda w: jnp.sum(fsdp_dense(x, w, mesh) ** 2))(w)
    plain = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
    np.testing.assert_allclose(ours, plain, rtol=1e-4, atol=1e-3)
    found = collectives(lambda x, w: fsdp_dense(x, w, mesh), x, w)
    assert "all-gather" in found, f"no all-gather in the compiled program, only {found}"


@pytest.mark.exercise("manual_fsdp.ring_matmul")
@pytest.mark.parametrize("n", [4, 8])
def test_ring_matmul_equals_the_product_with_permutes_only(n):
    """N - 1 collective-permutes and no all-gather in the compiled program."""
    mesh = fsdp_mesh(n)
    x, w = x_and_w(n)
    np.testing.assert_allclose(ring_matmul(x, w, mesh), x @ w, rtol=1e-5, atol=1e-4)
    found = collectives(lambda x, w: ring_matmul(x, w, mesh), x, w)
    assert found == ["collective-permute"] * (n - 1), found


# The FSDP napkin.

LAYER = 12 * 4096**2  # a layer of a 4096-wide transformer: 4·E² attention + 8·E² MLP


@pytest.mark.exercise("sharding.fsdp_flops_per_chip")
def test_fsdp_flops_per_chip_by_hand():
    got = fsdp_flops_per_chip(LAYER, 1_048_576, 256)
    expect(got, pytest.approx(6 * 4096 * LAYER), "FLOPs", "1,048,576 tokens on 256 chips")


@pytest.mark.exercise("sharding.fsdp_bytes_per_chip")
def test_fsdp_bytes_per_chip_by_hand():
    three_collectives = pytest.approx(3 * LAYER * 2 * 255 / 256)
    expect(fsdp_bytes_per_chip(LAYER, 256, 2), three_collectives, "bytes", "256 chips, bf16")
    expect(fsdp_bytes_per_chip(LAYER, 1, 2), 0, "bytes", "one chip: nothing to gather")


@pytest.mark.exercise("sharding.fsdp_comm_hidden")
def test_fsdp_hides_communication_above_a_batch_per_chip():
    """TPU v5e: 197 TFLOP/s, ICI 400 GB/s. Hidden when tokens per chip >=
    peak * bytes * (n - 1) / n / (2 * ICI) = 492.5 * 255 / 256, about 490."""
    v5e = CHIPS["tpu-v5e"]
    chips, peak, ici = 256, v5e.peak("bfloat16"), v5e.interconnect
    threshold = peak * 2 * (chips - 1) / chips / (2 * ici)
    assert threshold == pytest.approx(490.6, abs=0.1), "the test's own threshold"
    for per_chip, hidden in [(threshold * 1.01, True), (threshold * 0.99, False), (4096, True)]:
        tokens = per_chip * chips
        got = bool(fsdp_comm_hidden(LAYER, tokens, chips, peak, ici, 2))
        what = f"{per_chip:.0f} tokens per chip, threshold {threshold:.1f}: comm hidden"
        expect(got, hidden, "", what)


# A Pallas matmul.


@pytest.mark.exercise("pallas_matmul.matmul_relu")
@pytest.mark.parametrize("blocks", [(32, 16, 32), (16, 48, 96)], ids=["2x3x3 grid", "4x1x1 grid"])
def test_pallas_matmul_relu_matches_jax(blocks):
    a = jax.random.normal(jax.random.key(1), (64, 96))
    b = jax.random.normal(jax.random.key(2), (96, 48))
    block_m, block_n, block_k = blocks
    got = matmul_relu(a, b, block_m, block_n, block_k, interpret=True)
    expect(got.shape, (64, 48), "", "the output's shape [M, N]")
    assert got.dtype == jnp.float32, f"the output is {got.dtype}, expected float32"
    np.testing.assert_allclose(
        got, jax.nn.relu(a @ b), atol=1e-4, rtol=1e-5, err_msg=f"blocks {blocks}"
    )


# A norm fused into a matrix-vector product, in Mosaic GPU's interpreter.


def mosaic_interpreter():
    """Mosaic GPU's interpreter params, public in JAX 0.12, private in 0.10."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def norm_inputs(B, E, F, seed=0):
    """x far from unit RMS (30x), so a kernel that skips the norm is far off, and a
    scale far from 1, so one that skips the scale is too."""
    kx, ks, kw = jax.random.split(jax.random.key(seed), 3)
    x = (30 * jax.random.normal(kx, (B, E))).astype(jnp.bfloat16)
    scale = jax.random.uniform(ks, (E,), minval=0.2, maxval=2.0).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (F, E)) / math.sqrt(E)).astype(jnp.bfloat16)
    return x, scale, w


@pytest.mark.exercise("decode_mlp.norm_matvec")
@pytest.mark.parametrize("B, E, F", [(1, 64, 64), (3, 128, 64)])
def test_norm_matvec_matches_float64(B, E, F):
    """Against NumPy in float64. Tolerance: the normalised x may be rounded to bf16
    (8 significant bits) as the model rounds it, half an ulp, 2^-8 relative, in
    each term of the sum over E; float32's own sum adds about 2^-24·E, far less.
    So |error| <= 2^-8 · sum over E of |xn|·|w|, each output on its own."""
    x, scale, w = norm_inputs(B, E, F)
    got = norm_matvec(x, scale, w, mosaic_interpreter())
    expect(got.shape, (B, F), "", "the output's shape [B, F]")
    assert got.dtype == jnp.float32, f"the output is {got.dtype}, expected float32"
    x64, s64, w64 = (np.asarray(a, np.float64) for a in (x, scale, w))
    xn = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-6) * s64
    want = xn @ w64.T
    bound = 2.0**-8 * (np.abs(xn) @ np.abs(w64).T) + 1e-6
    error = np.abs(np.asarray(got) - want)
    assert (error <= bound).all(), (
        f"{int((error > bound).sum())} of {error.size} outputs off by more than bf16's rounding "
        f"allows: worst {error.max():.3g} against a bound of {bound.flat[error.argmax()]:.3g}"
    )


# The primitive a Mosaic GPU kernel is in a jaxpr: pallas_call compiled for a GPU,
# mpmd_map in the interpreter (JAX 0.10 and 0.12).
KERNEL_PRIMITIVES = {"pallas_call", "mpmd_map"}


def outside_kernels(jaxpr):
    """(kernels, primitives outside them) of a jaxpr and the jaxprs inside it."""
    kernels, outside = 0, []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in KERNEL_PRIMITIVES:
            kernels += 1
            continue
        outside.append(eqn.primitive.name)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", None)
            inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr holds a Jaxpr
            if inner is not None and hasattr(inner, "eqns"):
                k, o = outside_kernels(inner)
                kernels, outside = kernels + k, outside + o
    return kernels, outside


@pytest.mark.exercise("decode_mlp.norm_matvec")
def test_norm_matvec_is_one_kernel_with_the_norm_inside():
    """Fused: one kernel, and no norm (rsqrt) or product outside it."""
    x, scale, w = norm_inputs(2, 64, 64)
    jaxpr = jax.make_jaxpr(lambda x, s, w: norm_matvec(x, s, w, mosaic_interpreter()))(x, scale, w)
    kernels, outside = outside_kernels(jaxpr.jaxpr)
    expect(kernels, 1, "kernels", "kernels in the jaxpr")
    done_outside = {"rsqrt", "dot_general", "reduce_sum", "mul"} & set(outside)
    assert not done_outside, f"{sorted(done_outside)} outside the kernel: fuse them into it"

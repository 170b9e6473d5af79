"""Our Mosaic GPU flash forward (sessions/kernels/flash_mosaic.py): in Mosaic GPU's
interpreter on this CPU against float64 NumPy attention and the einsum path's
gradients, the causal skip, its refusals, and compiled for an H100 (and not for
an A100: Mosaic GPU is Hopper's)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.kernels.flash import flash_attention
from sessions.model.attention import einsum_attention
from tests.helpers import need


def qkv(B, S, H, D, seed=0):
    """Drawn by NumPy: no JAX program to compile for the inputs."""
    draw = lambda i: np.random.default_rng(seed + i).standard_normal((B, S, H, D))  # noqa: E731
    return tuple(jnp.asarray(draw(i).astype(jnp.bfloat16)) for i in range(3))


def causal_attention_f64(q, k, v):
    """Causal softmax attention in float64 NumPy of the same bf16 inputs."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    S, D = q.shape[1], q.shape[3]
    s = np.einsum("BSHD,BTHD->BHST", q, k) * D**-0.5
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("BHST,BTHD->BSHD", p / p.sum(axis=-1, keepdims=True), v)


@functools.cache  # one jitted kernel per block_k: a shape compiles once in this file
def mosaic(block_k=None):
    return jax.jit(
        lambda q, k, v: flash_attention(q, k, v, block_k=block_k, impl="mosaic-interpreted")
    )


# S=200 pads to 256: four 64-query tiles, and with 64-key blocks up to four key
# blocks a tile, so both shared-memory slots are reused. D=128: two batch rows,
# 128-key blocks.
@pytest.mark.parametrize(
    "B, S, H, D, block_k", [(1, 200, 2, 64, 64), (2, 128, 1, 128, 128)], ids=["D64", "D128"]
)
def test_the_interpreted_kernel_equals_float64_attention(B, S, H, D, block_k):
    q, k, v = qkv(B, S, H, D)
    out = mosaic(block_k)(q, k, v)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape
    # Two roundings apart from exact: p to bf16 before the second matmul (each p off
    # by at most 2^-9 of itself, and the p of a row sum to l, so at most 2^-9 max|v|
    # after dividing by l), and the output to bf16 (half a step: 2^-7 below 4).
    atol = 2**-9 * float(jnp.abs(v.astype(jnp.float32)).max()) + 2**-7 + 1e-5
    np.testing.assert_allclose(
        np.asarray(out, np.float64), causal_attention_f64(q, k, v), atol=atol
    )


def test_its_lse_gives_the_backward_the_einsum_paths_gradients():
    # The backward (flash.flash_backward) rebuilds p from the lse the kernel writes.
    q, k, v = qkv(1, 128, 1, 64)
    probe = jnp.asarray(np.random.default_rng(9).standard_normal(q.shape), jnp.float32)

    def grads(fn):
        loss = lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * probe).sum()  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    ours = grads(lambda q, k, v: flash_attention(q, k, v, block_k=64, impl="mosaic-interpreted"))
    for name, mine, theirs in zip("qkv", ours, grads(einsum_attention)):
        # bf16 gradients summed in another order: one bf16 step (2^-5 below 8), as
        # tests/test_flash.py measures for the Triton path's.
        np.testing.assert_allclose(
            np.asarray(mine, np.float32),
            np.asarray(theirs, np.float32),
            atol=2**-5 + 1e-3,
            err_msg=f"d{name}",
        )


def test_key_blocks_above_the_diagonal_are_never_copied():
    # Keys and values from position 64 on are NaN. The first 64-query tile's loop
    # stops after key block 0; had it copied and multiplied block 1, its masked
    # probabilities (0) times NaN values would be NaN in those rows. The D64 case's
    # shape above: its program, compiled once.
    q, k, v = qkv(1, 200, 2, 64)
    poisoned = [x.at[:, 64:].set(jnp.nan) for x in (k, v)]
    out = mosaic(64)(q, *poisoned)
    want = causal_attention_f64(q, k, v)[:, :64]
    atol = 2**-9 * float(jnp.abs(v.astype(jnp.float32)).max()) + 2**-7 + 1e-5
    np.testing.assert_allclose(np.asarray(out[:, :64], np.float64), want, atol=atol)


@pytest.mark.parametrize(
    "D, dtype, kwargs, message",
    [
        (64, jnp.float32, {}, "takes bfloat16 only, not float32"),
        (96, jnp.bfloat16, {}, "takes head dims 64 and 128, not 96"),
        (
            64,
            jnp.bfloat16,
            {"block_q": 128},
            "takes query blocks of 64 \\(one warpgroup\\), not 128",
        ),
        (64, jnp.bfloat16, {"block_k": 32}, "takes key blocks of 64 and 128, not 32"),
    ],
    ids=["float32", "head-dim-96", "block-q-128", "block-k-32"],
)
def test_what_it_does_not_take_is_refused_in_one_line(D, dtype, kwargs, message):
    q = jnp.zeros((1, 64, 1, D), dtype)
    with pytest.raises(UsageError, match=f"^the Mosaic GPU flash kernel {message}$"):
        flash_attention(q, q, q, impl="mosaic", **kwargs)


def test_an_impl_flash_does_not_have_is_refused_in_one_line():
    q = jnp.zeros((1, 64, 1, 64), jnp.bfloat16)
    message = "^flash attention's impl is one of pallas, mosaic, mosaic-interpreted, not triton$"
    with pytest.raises(UsageError, match=message):
        flash_attention(q, q, q, impl="triton")


def compiled(target, B=1, S=256, H=2, D=128):
    from sessions.plan.programs import devices_for

    _, devices = devices_for(target)
    x = jax.ShapeDtypeStruct(
        (B, S, H, D), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(devices[0])
    )

    def loss(q, k, v):
        return flash_attention(q, k, v, impl="mosaic").astype(jnp.float32).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile().as_text()


def test_compiled_for_an_h100_the_forward_is_one_mosaic_gpu_kernel():
    need("gpu")
    text = compiled("h100:1")
    calls = re.findall(r'custom_call_target="([^"]+)"', text)
    assert calls.count("mosaic_gpu_v2") == 1  # the forward; the backward is plain JAX
    assert not [c for c in calls if "triton" in c]
    assert "f32[1,2,256,256]" not in text  # no [B, H, S, T] scores anywhere


def test_an_a100_cannot_compile_it(capfd):
    # What sessions/kernels/flash.py's note says: Mosaic GPU lowers for sm_90 and later only.
    need("gpu")
    # A shape no other test compiles: Mosaic GPU reuses a kernel it has compiled in
    # this process, for an H100 too, even where jax.clear_caches() has run.
    with pytest.raises(Exception, match="Pass pipeline failed"):
        compiled("a100-80gb:1", S=384)
    assert "'nvvm.wgmma.fence.aligned' op is not supported on sm_80" in capfd.readouterr().err

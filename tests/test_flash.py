"""Our flash attention (sessions/kernels/flash.py) against the einsum reference: online
softmax, the Pallas kernel interpreted on this CPU forward and backward, the
causal skip, and the kernel compiled for a TPU (Mosaic) and an NVIDIA GPU (Triton)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.kernels.flash import flash_attention, online_softmax
from sessions.model.attention import einsum_attention, pallas_attention
from sessions.model.attention_choice import choose
from sessions.model.config import ModelConfig
from sessions.shard import sharding
from tests.helpers import need, run_script


def normal(shape, seed, dtype=jnp.float32):
    """Drawn by NumPy: no JAX program to compile for the inputs."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def qkv(B, S, H, D, dtype=jnp.float32, seed=0):
    return tuple(normal((B, S, H, D), seed + i, dtype) for i in range(3))


def test_online_softmax_equals_softmax_attention():
    S, T, D = 12, 40, 8
    q, k, v = (normal((n, D), i) for i, n in enumerate((S, T, T)))
    # Scaled up so that later key blocks raise the running max: the rescaling must work.
    q = 4 * q
    probs = jax.nn.softmax(q @ k.T * D**-0.5, axis=-1)
    online = jax.jit(online_softmax, static_argnames="block_k")  # one program, not op by op
    np.testing.assert_allclose(online(q, k, v, block_k=16), probs @ v, atol=1e-5)


# One shape per case; each compiles once. S=80 is not a multiple of the 32-query,
# 16-key tiles (padded to 96). float32: the same sums in another order, a few ulps.
# bfloat16: both round q, k, v and the probabilities to bf16 and sum in float32, in
# another order, so a result may land one bf16 step apart: 2^-6 for the outputs
# (below 4 here), 2^-5 for the gradients (below 8); measured: exactly one step.
CASES = [
    pytest.param(64, jnp.float32, 2e-5, 2e-4, id="D64-f32"),
    pytest.param(128, jnp.float32, 2e-5, 2e-4, id="D128-f32"),
    pytest.param(64, jnp.bfloat16, 2**-6 + 1e-3, 2**-5 + 1e-3, id="D64-bf16"),
]


@pytest.mark.parametrize("D, dtype, atol, grad_atol", CASES)
def test_flash_equals_the_reference_forward_and_backward(D, dtype, atol, grad_atol):
    B, S, H = 2, 80, 2
    q, k, v = qkv(B, S, H, D, dtype)
    probe = normal((B, S, H, D), 9)  # a loss that weighs every output

    def flash(q, k, v):
        return flash_attention(q, k, v, block_q=32, block_k=16)

    def value_and_grads(fn):
        def loss(q, k, v):
            out = fn(q, k, v)
            return (out.astype(jnp.float32) * probe).sum(), out

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = value_and_grads(flash)
    (_, ref), ref_grads = value_and_grads(einsum_attention)
    assert out.dtype == dtype and out.shape == (B, S, H, D)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(out), f32(ref), atol=atol)
    for name, mine, theirs in zip("qkv", grads, ref_grads):
        assert mine.dtype == dtype, name
        np.testing.assert_allclose(f32(mine), f32(theirs), atol=grad_atol, err_msg=f"d{name}")


def test_blocks_above_the_diagonal_are_never_read_forward_or_backward():
    # Keys and values from position 64 on are NaN. Queries before 64 may not see
    # them, and with 32 x 32 tiles every one of their key blocks from 64 on lies
    # wholly above the diagonal: skipped, so never read. Were such a block read,
    # its masked probabilities (0) times NaN values would be NaN in those rows:
    # in the outputs of the first 64 queries (the forward kernel, which the
    # backward's forward runs too), and in their dq (the backward).
    B, S, H, D = 1, 128, 2, 64
    q, k, v = qkv(B, S, H, D)
    poisoned = [x.at[:, 64:].set(jnp.nan) for x in (k, v)]

    def first_rows(fn, q, k, v):
        out, grad = jax.vjp(lambda q: fn(q, k, v)[:, :64], q)
        return out, grad(jnp.ones_like(out))[0][:, :64]

    def flash(q, k, v):
        return flash_attention(q, k, v, block_q=32, block_k=32)

    out, dq = jax.jit(lambda q, k, v: first_rows(flash, q, k, v))(q, *poisoned)
    want_out, want_dq = first_rows(einsum_attention, q, k, v)
    np.testing.assert_allclose(out, want_out, atol=2e-5, err_msg="forward")
    np.testing.assert_allclose(dq, want_dq, atol=2e-5, err_msg="dq")


def test_over_a_mesh_each_device_runs_the_kernel_on_its_rows_and_heads():
    B, S, H, D = 4, 32, 2, 64
    q, k, v = qkv(B, S, H, D)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tp": 2})
    with jax.set_mesh(mesh):
        out = jax.jit(pallas_attention)(q, k, v)
    np.testing.assert_allclose(out, einsum_attention(q, k, v), atol=2e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"D": 96}, "head dims 64 and 128, not 96"),
        ({"block_q": 48}, "block_q must be a power of two from 16, not 48"),
        ({"block_k": 8}, "block_k must be a power of two from 16, not 8"),
    ],
    ids=["head-dim-96", "block-q-48", "block-k-8"],
)
def test_shapes_the_kernel_does_not_take_are_refused_in_one_line(kwargs, message):
    q, k, v = qkv(1, 32, 1, kwargs.pop("D", 64))
    with pytest.raises(UsageError, match=message):
        flash_attention(q, k, v, **kwargs)


def test_pallas_runs_on_every_platform_and_says_its_tiles():
    cfg = ModelConfig(heads=2, head_dim=64, seq=48, dtype="bfloat16")
    assert choose("pallas", "tpu", cfg, 8) == (
        "pallas",
        "our Pallas flash kernel (sessions/kernels/flash.py, Mosaic), tiles 64 x 64 (queries x keys)",
    )
    _, note = choose("pallas", "gpu", dataclasses.replace(cfg, seq=1024), 8)
    assert note.endswith("Triton), tiles 128 x 128 (queries x keys)")
    _, note = choose("pallas", "cpu", cfg, 8)
    assert "interpreted" in note


def test_s2_train_refuses_a_head_dim_the_kernel_does_not_take(capsys):
    argv = ["--preset", "tiny", "--head-dim", "96", "--attention-impl", "pallas"]
    code, _, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 2
    assert err.strip() == "error: our Pallas flash attention takes head dims 64 and 128, not 96"


# Compiled for chips this machine lacks: the kernel is a custom call in the compiled
# program, and no f32 [B, H, S, T] scores are left anywhere in it, forward or backward.
KERNEL_CALLS = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}


@pytest.mark.parametrize("target, platform", [("tpu-v5e:2x2", "tpu"), ("h100:1", "gpu")])
def test_compiled_for_a_chip_the_kernel_is_a_custom_call(target, platform):
    need(platform)
    from sessions.plan.programs import devices_for

    _, devices = devices_for(target)
    B, S, H, D = 2, 256, 2, 128
    x = jax.ShapeDtypeStruct(
        (B, S, H, D), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(devices[0])
    )

    def loss(q, k, v):
        return flash_attention(q, k, v).astype(jnp.float32).sum()

    # Under a mesh of the target's devices, as the session scripts compile: JAX 0.12's
    # Triton lowering reads the GPU it compiles for from the mesh ("No supported GPU
    # devices found" without one, on a machine with no GPU).
    mesh = jax.sharding.Mesh(devices[:1], ("data",))
    with jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile().as_text()
    calls = re.findall(r'custom_call_target="([^"]+)"', text)
    assert calls.count(KERNEL_CALLS[platform]) == 1  # the forward; the backward is plain JAX
    assert f"f32[{B},{H},{S},{S}]" not in text


@pytest.mark.parametrize(
    "target, platform, lowering", [("tpu-v5e:2x2", "tpu", "Mosaic"), ("h100:1", "gpu", "Triton")]
)
def test_the_step_compiled_for_a_chip_runs_our_kernel(target, platform, lowering, capsys):
    need(platform)
    argv = ["--preset", "tiny", "--head-dim", "64", "--attention-impl", "pallas"]
    code, printed, err = run_script("sessions/s2_train.py", [*argv, "--target", target], capsys)
    assert code == 0, err
    assert (
        f"our Pallas flash kernel (sessions/kernels/flash.py, {lowering}), tiles 64 x 64" in printed
    )
    # One call per layer's forward (L=2); the backward is plain JAX.
    assert f"custom kernels: {KERNEL_CALLS[platform]} x2" in printed

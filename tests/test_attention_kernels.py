"""The attention kernel each chip gets, and the splash kernel checked against
the einsum reference on this CPU (interpreted)."""

import dataclasses

import jax
import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.model.attention import einsum_attention, splash_attention, splash_kernel
from sessions.model.attention_choice import choose
from sessions.model.config import ModelConfig
from sessions.shard import sharding


def test_attention_kernel_follows_the_target():
    course = ModelConfig(
        embed=512, ff=2048, heads=4, head_dim=128, layers=4, seq=128, dtype="bfloat16"
    )
    assert choose(None, "cpu", course, 32) == ("einsum", None)
    assert choose(None, "tpu", course, 32) == ("splash", None)
    impl, note = choose(None, "tpu", dataclasses.replace(course, seq=64), 32)
    assert impl == "fused" and "divisible by 128" in note
    impl, note = choose("fused", "gpu", dataclasses.replace(course, dtype="float32"), 32)
    assert impl == "fused" and "bfloat16" in note
    with pytest.raises(UsageError, match="TPU"):
        choose("splash", "gpu", course, 32)
    with pytest.raises(UsageError, match="GPU"):
        choose("cudnn", "cpu", course, 32)


# The splash kernel, checked against the einsum reference on this CPU (interpreted).


def test_splash_kernel_equals_the_reference_forward_and_backward():
    B, S, H, D = 1, 128, 1, 8
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, D)) for i in range(3))
    out = splash_kernel(q, k, v, interpret=True)
    np.testing.assert_allclose(out, einsum_attention(q, k, v), atol=2e-5)
    probe = jax.random.normal(jax.random.key(3), out.shape)

    def grads(fn):
        return jax.grad(lambda q, k, v: (fn(q, k, v) * probe).sum(), argnums=(0, 1, 2))(q, k, v)

    for mine, ref in zip(
        grads(lambda *a: splash_kernel(*a, interpret=True)), grads(einsum_attention)
    ):
        np.testing.assert_allclose(mine, ref, atol=2e-4)


def test_splash_over_a_mesh_gives_each_device_its_rows_and_heads():
    B, S, H, D = 4, 128, 2, 8  # the kernel's tiles are 128 keys wide, even interpreted
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, D)) for i in range(3))
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tp": 2})
    with jax.set_mesh(mesh):
        out = jax.jit(splash_attention)(q, k, v)
    np.testing.assert_allclose(out, einsum_attention(q, k, v), atol=2e-5)

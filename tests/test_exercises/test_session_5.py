"""Numerics and kernels: an int8 absmax-scaled sum; a Pallas matmul with relu fused in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

quantize_absmax = exercise("int8_numerics.quantize_absmax")
int8_sum = exercise("int8_numerics.int8_sum")
int8_sum_error_bound = exercise("int8_numerics.int8_sum_error_bound")
matmul_relu = exercise("pallas_matmul.matmul_relu")

X = 3 * jax.random.normal(jax.random.key(0), (4096,))


@pytest.mark.exercise("int8_numerics.quantize_absmax")
def test_quantize_absmax_maps_the_largest_value_to_127():
    q, scale = quantize_absmax(X)
    assert q.dtype == jnp.int8 and q.shape == X.shape
    assert float(scale) == pytest.approx(float(jnp.max(jnp.abs(X))) / 127, rel=1e-6)
    assert int(jnp.max(jnp.abs(q.astype(jnp.int32)))) == 127
    # Round to nearest: each value moves by at most half a step.
    assert float(jnp.max(jnp.abs(q * scale - X))) <= float(scale) / 2 * (1 + 1e-5)
    q0, _ = quantize_absmax(jnp.zeros(8))
    np.testing.assert_array_equal(q0, 0, err_msg="all-zero input")


@pytest.mark.exercise("int8_numerics.int8_sum")
def test_int8_sum_is_the_sum_of_the_quantised_values(record_property):
    q = jnp.round(X / (jnp.max(jnp.abs(X)) / 127))
    expected = float(jnp.sum(q.astype(jnp.int32))) * float(jnp.max(jnp.abs(X))) / 127
    got = float(int8_sum(X))
    assert got == pytest.approx(expected, rel=1e-5), "not the int8 values summed, times the scale"
    exact, bound = float(jnp.sum(X)), float(jnp.max(jnp.abs(X))) / 127 * X.shape[0] / 2
    assert abs(got - exact) <= bound
    record_property(
        "measured", f"N=4096: |int8 - float32| = {abs(got - exact):.3f}, bound {bound:.1f}"
    )


@pytest.mark.exercise("int8_numerics.int8_sum")
def test_int8_sum_accumulates_without_overflow():
    """1024 values of 127 sum to 130048: past int8's and int16's range."""
    assert float(int8_sum(jnp.full((1024,), 0.5))) == pytest.approx(512.0)


@pytest.mark.exercise("int8_numerics.int8_sum_error_bound")
def test_int8_sum_error_bound_by_hand_and_holds():
    scale = float(jnp.max(jnp.abs(X))) / 127
    assert float(int8_sum_error_bound(X)) == pytest.approx(4096 * scale / 2, rel=1e-6)
    for seed in range(3):
        x = jax.random.uniform(jax.random.key(seed), (1000,), minval=-1, maxval=1)
        q = jnp.round(x / (jnp.max(jnp.abs(x)) / 127))
        quantised = float(jnp.sum(q)) * float(jnp.max(jnp.abs(x))) / 127
        assert abs(quantised - float(jnp.sum(x))) <= float(int8_sum_error_bound(x))


@pytest.mark.exercise("pallas_matmul.matmul_relu")
@pytest.mark.parametrize("blocks", [(32, 16, 32), (16, 48, 96)], ids=["2x3x3 grid", "4x1x1 grid"])
def test_pallas_matmul_relu_matches_jax(blocks):
    a = jax.random.normal(jax.random.key(1), (64, 96))
    b = jax.random.normal(jax.random.key(2), (96, 48))
    block_m, block_n, block_k = blocks
    got = matmul_relu(a, b, block_m, block_n, block_k, interpret=True)
    assert got.shape == (64, 48) and got.dtype == jnp.float32
    np.testing.assert_allclose(
        got, jax.nn.relu(a @ b), atol=1e-4, rtol=1e-5, err_msg=f"blocks {blocks}"
    )

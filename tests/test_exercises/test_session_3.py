"""Session 3, inference: the KV cache's bytes and the decode roofline by hand, a
decode step with a cache against attention over the whole sequence; the inference
rooflines (chips for a prefill deadline, to hold the weights, for a generation rate);
MFU against memory-bandwidth utilisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

from roofline import decode_cost
from roofline.hardware import CHIPS
from sessions.model.attention import attention
from sessions.model.config import PRESETS

cache_bytes = exercise("inference.cache_bytes")
decode_step_seconds = exercise("inference.decode_step_seconds")
compute_bound_batch = exercise("inference.compute_bound_batch")
decode_attention = exercise("inference.decode_attention")
chips_for_prefill = exercise("inference_roofline.chips_for_prefill")
kv_cache_bytes = exercise("inference_roofline.kv_cache_bytes")
chips_to_hold = exercise("inference_roofline.chips_to_hold")
chips_for_generation = exercise("inference_roofline.chips_for_generation")
matmul_utilisation = exercise("mfu_vs_bandwidth.matmul_utilisation")
elementwise_utilisation = exercise("mfu_vs_bandwidth.elementwise_utilisation")
best_mfu = exercise("mfu_vs_bandwidth.best_mfu")

GPT2 = PRESETS["gpt2"].model  # L=12, E=768, F=3072, H=12, D=64, T=1024, V=256
H100 = CHIPS["h100-sxm"]  # 989 TFLOP/s bf16, 80 GB at 3.35 TB/s
# The gpt2 preset in bf16, by hand (roofline/decode_cost.py checks the same numbers):
W = 85_151_232 * 2  # 12·(2·768·3072 + 4·768·768) + 256·768 matmul weights, 19,968 others
C = 2 * 12 * 1024 * 12 * 64 * 2  # one sequence's cache: 37,748,736 bytes
F = 2 * 85_131_264 + 4 * 12 * 1024 * 12 * 64  # FLOPs per token: matmuls, then q·k and p·v


@pytest.mark.exercise("inference.cache_bytes")
def test_cache_bytes_by_hand():
    assert cache_bytes(12, 8, 1024, 12, 64, 2) == 301_989_888  # gpt2, 8 sequences, bf16
    assert (
        cache_bytes(12, 1, 1024, 12, 64, 2) == C == decode_cost.kv_cache_bytes(GPT2, 1, "bfloat16")
    )
    # Sizes that differ pairwise: each factor counts once.
    assert cache_bytes(2, 3, 5, 7, 11, 4) == 2 * 2 * 3 * 5 * 7 * 11 * 4


@pytest.mark.exercise("inference.decode_step_seconds")
def test_decode_roofline_by_hand():
    assert (
        decode_cost.weight_bytes(GPT2, "bfloat16") == W
        and decode_cost.flops_per_sequence(GPT2) == F
    )
    peak, bw = H100.peak("bfloat16"), H100.hbm_bandwidth
    # Batch 1: 208 MB to read at 3.35 TB/s, 62 µs; the FLOPs would take 0.2 µs.
    assert decode_step_seconds(W, C, F, 1, peak, bw) == pytest.approx((W + C) / bw)
    # Batch 64: the caches (2.4 GB) dwarf the weights; still memory-bound.
    assert decode_step_seconds(W, C, F, 64, peak, bw) == pytest.approx((W + 64 * C) / bw)
    # A compute-bound step: 1 GB of weights, no cache, 2 GFLOP a token, batch 1000.
    assert decode_step_seconds(1e9, 0, 2e9, 1000, 1e15, 1e12) == pytest.approx(2e-3)
    step = decode_cost.decode_step_cost(GPT2, 16, peak_flops=peak, bandwidth=bw, dtype="bfloat16")
    assert decode_step_seconds(W, C, F, 16, peak, bw) == pytest.approx(step.step_s)


@pytest.mark.exercise("inference.compute_bound_batch")
def test_compute_bound_batch_by_hand():
    peak, bw = H100.peak("bfloat16"), H100.hbm_bandwidth
    # gpt2 at T=1024 on an H100: each sequence's cache takes 11 µs to read and
    # its FLOPs 0.2 µs, so no batch is compute-bound ...
    assert compute_bound_batch(W, C, F, peak, bw) is None
    # ... though the weights alone would be from about 242 sequences (ridge · bytes / 2).
    assert compute_bound_batch(W, 0, F, peak, bw) == pytest.approx((W / bw) / (F / peak))
    assert compute_bound_batch(W, 0, F, peak, bw) == pytest.approx(241.7, abs=0.1)
    # A short context: 1 ms of weights, 1 µs of cache and 2 µs of compute per sequence.
    assert compute_bound_batch(1e9, 1e6, 2e9, 1e15, 1e12) == pytest.approx(1000)
    assert compute_bound_batch(1e9, 0, 2e9, 1e15, 1e12) == pytest.approx(500)


@pytest.mark.exercise("inference.decode_attention")
def test_decode_attention_equals_attention_over_the_sequence():
    """Step by step over S tokens, each output equals causal attention over the
    whole sequence at that position; the slots after the last stay as they were."""
    B, S, H, D, T = 2, 6, 3, 8, 10  # sizes that differ pairwise; T > S leaves empty slots
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, D)) for i in range(3))
    expected = attention(q, k, v)  # [B, S, H, D]
    # Unused slots hold large numbers: attending to one shows.
    k_cache = v_cache = jnp.full((B, T, H, D), 100.0)
    for s in range(S):
        out, k_cache, v_cache = decode_attention(q[:, s], k[:, s], v[:, s], k_cache, v_cache, s)
        assert out.shape == (B, H, D)
        np.testing.assert_allclose(out, expected[:, s], atol=1e-5, err_msg=f"position {s}")
    np.testing.assert_allclose(k_cache[:, :S], k, atol=0)
    np.testing.assert_allclose(v_cache[:, :S], v, atol=0)
    assert np.all(np.asarray(k_cache[:, S:]) == 100.0), "slots after the last position changed"


# Inference rooflines: how many chips, and for what.

P70B = 70e9  # a 70-billion-parameter model in bf16: 140 GB of weights


@pytest.mark.exercise("inference_roofline.chips_for_prefill")
def test_chips_for_prefill_by_hand():
    # 2 * 70e9 * 32768 = 4.59e15 FLOPs in 1 s at 989e12 * 0.5: 9.28 -> 10 chips.
    assert chips_for_prefill(P70B, 32768, 1.0, H100.peak("bfloat16"), mfu=0.5) == 10
    assert chips_for_prefill(P70B, 2048, 1.0, H100.peak("bfloat16"), mfu=0.5) == 1
    assert chips_for_prefill(P70B, 32768, 0.5, H100.peak("bfloat16"), mfu=1.0) == 10


@pytest.mark.exercise("inference_roofline.kv_cache_bytes")
def test_kv_cache_bytes_by_hand():
    # 80 layers, 8 KV heads of 128, 8192 tokens, 16 sequences, bf16: 42.9 GB.
    assert kv_cache_bytes(80, 8, 128, 8192, 16, 2) == 2 * 80 * 8 * 128 * 8192 * 16 * 2


@pytest.mark.exercise("inference_roofline.chips_to_hold")
def test_chips_to_hold_by_hand():
    assert chips_to_hold(P70B, 2, H100.hbm_bytes) == 2  # 140 GB in 80 GB chips
    assert chips_to_hold(P70B, 1, H100.hbm_bytes) == 1  # int8 weights: 70 GB
    kv = 2 * 80 * 8 * 128 * 8192 * 16 * 2
    assert chips_to_hold(P70B, 2, H100.hbm_bytes, kv) == 3  # 183 GB


@pytest.mark.exercise("inference_roofline.chips_for_generation")
def test_chips_for_generation_by_hand():
    # 140 GB per step at 3.35 TB/s: 41.8 ms, 24 tokens/s on one chip's bandwidth.
    assert chips_for_generation(P70B, 2, 20, H100.hbm_bandwidth) == 1
    assert chips_for_generation(P70B, 2, 100, H100.hbm_bandwidth) == 5  # 4.18 -> 5
    assert chips_for_generation(P70B, 1, 100, H100.hbm_bandwidth) == 3  # int8: 2.09 -> 3


# MFU versus bandwidth.


@pytest.mark.exercise("mfu_vs_bandwidth.matmul_utilisation")
def test_matmul_utilisation_by_hand():
    M = K = N = 8192
    flops, moved = 2 * M * K * N, 2 * 3 * M * N
    seconds = 2 * flops / H100.peak("bfloat16")  # half the peak
    got = matmul_utilisation(M, K, N, seconds, H100.peak("bfloat16"), H100.hbm_bandwidth, 2)
    assert got[0] == pytest.approx(0.5)
    assert got[1] == pytest.approx(moved / seconds / H100.hbm_bandwidth)


@pytest.mark.exercise("mfu_vs_bandwidth.elementwise_utilisation")
def test_elementwise_at_full_bandwidth_has_tiny_mfu():
    """x + y over 2^28 bf16 elements at the memory roofline: MBU 1, MFU about 1/1000."""
    n, peak, bandwidth = 2**28, H100.peak("bfloat16"), H100.hbm_bandwidth
    seconds = 2 * n * 3 / bandwidth  # two inputs read, one output written
    got_mfu, got_mbu = elementwise_utilisation(n, seconds, peak, bandwidth, 2, inputs=2)
    assert got_mbu == pytest.approx(1.0)
    assert got_mfu == pytest.approx(n / seconds / peak)
    assert got_mfu < 0.001


@pytest.mark.exercise("mfu_vs_bandwidth.best_mfu")
def test_best_mfu_is_capped_by_intensity_over_ridge():
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    ridge = peak / bandwidth
    assert best_mfu(ridge / 4, peak, bandwidth) == pytest.approx(0.25)
    assert best_mfu(10 * ridge, peak, bandwidth) == pytest.approx(1.0)
    assert best_mfu(1 / 6, peak, bandwidth) == pytest.approx(1 / 6 / ridge)  # an elementwise add

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

from .expect import expect

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

GPT2 = PRESETS["gpt2-bytes"].model  # L=12, E=768, F=3072, H=12, D=64, T=1024, V=256
H100 = CHIPS["h100-sxm"]  # 989 TFLOP/s bf16, 80 GiB (85.9 GB) at 3.35 TB/s
# The gpt2-bytes preset in bf16, by hand (roofline/decode_cost.py checks the same numbers):
W = 85_151_232 * 2  # 12·(2·768·3072 + 4·768·768) + 256·768 matmul weights, 19,968 others
C = 2 * 12 * 1024 * 12 * 64 * 2  # one sequence's cache: 37,748,736 bytes
F = 2 * 85_131_264 + 4 * 12 * 1024 * 12 * 64  # FLOPs per token: matmuls, then q·k and p·v


@pytest.mark.exercise("inference.cache_bytes")
def test_cache_bytes_by_hand():
    gpt2 = "gpt2-bytes (L=12, T=1024, H=12, D=64), bf16"
    expect(cache_bytes(12, 8, 1024, 12, 64, 2), 301_989_888, "bytes", f"{gpt2}, 8 sequences")
    expect(cache_bytes(12, 1, 1024, 12, 64, 2), C, "bytes", f"{gpt2}, 1 sequence")
    assert decode_cost.kv_cache_bytes(GPT2, 1, "bfloat16") == C, "roofline's count is C too"
    # Sizes that differ pairwise: each factor counts once.
    pairwise = 2 * 2 * 3 * 5 * 7 * 11 * 4
    expect(cache_bytes(2, 3, 5, 7, 11, 4), pairwise, "bytes", "L=2, B=3, T=5, H=7, D=11, 4 bytes")


@pytest.mark.exercise("inference.decode_step_seconds")
def test_decode_roofline_by_hand():
    assert (
        decode_cost.weight_bytes(GPT2, "bfloat16") == W
        and decode_cost.flops_per_sequence(GPT2) == F
    ), "the test's hand counts W and F are roofline's too"
    peak, bw = H100.peak("bfloat16"), H100.hbm_bandwidth
    # Batch 1: 208 MB to read at 3.35 TB/s, 62 µs; the FLOPs would take 0.2 µs.
    got = decode_step_seconds(W, C, F, 1, peak, bw)
    expect(got, pytest.approx((W + C) / bw), "s", "gpt2-bytes on an H100, batch 1: memory-bound")
    # Batch 64: the caches (2.4 GB) dwarf the weights; still memory-bound.
    got = decode_step_seconds(W, C, F, 64, peak, bw)
    expect(
        got, pytest.approx((W + 64 * C) / bw), "s", "gpt2-bytes on an H100, batch 64: memory-bound"
    )
    # A compute-bound step: 1 GB of weights, no cache, 2 GFLOP a token, batch 1000.
    got = decode_step_seconds(1e9, 0, 2e9, 1000, 1e15, 1e12)
    expect(got, pytest.approx(2e-3), "s", "1 GB, 2 GFLOP a token, batch 1000: compute-bound")
    step = decode_cost.decode_step_cost(GPT2, 16, peak_flops=peak, bandwidth=bw, dtype="bfloat16")
    got = decode_step_seconds(W, C, F, 16, peak, bw)
    expect(got, pytest.approx(step.step_s), "s", "gpt2-bytes on an H100, batch 16")


@pytest.mark.exercise("inference.compute_bound_batch")
def test_compute_bound_batch_by_hand():
    peak, bw = H100.peak("bfloat16"), H100.hbm_bandwidth
    # gpt2-bytes at T=1024 on an H100: each sequence's cache takes 11 µs to read and
    # its FLOPs 0.2 µs, so no batch is compute-bound ...
    unit = "sequences"
    expect(compute_bound_batch(W, C, F, peak, bw), None, unit, "gpt2-bytes at T=1024 on an H100")
    # ... though the weights alone would be from about 242 sequences (ridge · bytes / 2).
    weights_only = compute_bound_batch(W, 0, F, peak, bw)
    expect(weights_only, pytest.approx((W / bw) / (F / peak)), unit, "gpt2-bytes' weights alone")
    expect(weights_only, pytest.approx(241.7, abs=0.1), unit, "gpt2-bytes' weights alone")
    # A short context: 1 ms of weights, 1 µs of cache and 2 µs of compute per sequence.
    got = compute_bound_batch(1e9, 1e6, 2e9, 1e15, 1e12)
    expect(got, pytest.approx(1000), unit, "1 ms of weights, 1 µs of cache, 2 µs of FLOPs")
    got = compute_bound_batch(1e9, 0, 2e9, 1e15, 1e12)
    expect(got, pytest.approx(500), unit, "1 ms of weights, no cache, 2 µs of FLOPs")


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
        expect(out.shape, (B, H, D), "", f"the output's shape [B, H, D] at position {s}")
        np.testing.assert_allclose(out, expected[:, s], atol=1e-5, err_msg=f"position {s}")
    np.testing.assert_allclose(k_cache[:, :S], k, atol=0)
    np.testing.assert_allclose(v_cache[:, :S], v, atol=0)
    assert np.all(np.asarray(k_cache[:, S:]) == 100.0), "slots after the last position changed"


# Inference rooflines: how many chips, and for what.

P70B = 70e9  # a 70-billion-parameter model in bf16: 140 GB of weights


@pytest.mark.exercise("inference_roofline.chips_for_prefill")
def test_chips_for_prefill_by_hand():
    # 2 * 70e9 * 32768 = 4.59e15 FLOPs in 1 s at 989e12 * 0.5: 9.28 -> 10 chips.
    peak = H100.peak("bfloat16")
    got = chips_for_prefill(P70B, 32768, 1.0, peak, mfu=0.5)
    expect(got, 10, "chips", "70B, 32,768 tokens in 1 s, MFU 0.5 (9.28 H100s)")
    got = chips_for_prefill(P70B, 2048, 1.0, peak, mfu=0.5)
    expect(got, 1, "chips", "70B, 2,048 tokens in 1 s, MFU 0.5")
    got = chips_for_prefill(P70B, 32768, 0.5, peak, mfu=1.0)
    expect(got, 10, "chips", "70B, 32,768 tokens in 0.5 s, MFU 1")


@pytest.mark.exercise("inference_roofline.kv_cache_bytes")
def test_kv_cache_bytes_by_hand():
    # 80 layers, 8 KV heads of 128, 8192 tokens, 16 sequences, bf16: 42.9 GB.
    expect(
        kv_cache_bytes(80, 8, 128, 8192, 16, 2),
        2 * 80 * 8 * 128 * 8192 * 16 * 2,
        "bytes",
        "L=80, K=8, D=128, T=8192, 16 sequences, bf16",
    )


@pytest.mark.exercise("inference_roofline.chips_to_hold")
def test_chips_to_hold_by_hand():
    hbm = H100.hbm_bytes
    expect(chips_to_hold(P70B, 2, hbm), 2, "chips", "70B in bf16, 140 GB in 80 GiB (85.9 GB) chips")
    expect(chips_to_hold(P70B, 1, hbm), 1, "chips", "70B in int8, 70 GB in 80 GiB chips")
    kv = 2 * 80 * 8 * 128 * 8192 * 16 * 2
    expect(chips_to_hold(P70B, 2, hbm, kv), 3, "chips", "70B in bf16 and a 42.9 GB cache: 183 GB")


@pytest.mark.exercise("inference_roofline.chips_for_generation")
def test_chips_for_generation_by_hand():
    # 140 GB per step at 3.35 TB/s: 41.8 ms, 24 tokens/s on one chip's bandwidth.
    bw = H100.hbm_bandwidth
    expect(chips_for_generation(P70B, 2, 20, bw), 1, "chips", "70B bf16, 20 tokens/s")
    expect(chips_for_generation(P70B, 2, 100, bw), 5, "chips", "70B bf16, 100 tokens/s: 4.18")
    expect(chips_for_generation(P70B, 1, 100, bw), 3, "chips", "70B int8, 100 tokens/s: 2.09")


# MFU versus bandwidth.


@pytest.mark.exercise("mfu_vs_bandwidth.matmul_utilisation")
def test_matmul_utilisation_by_hand():
    M = K = N = 8192
    flops, moved = 2 * M * K * N, 2 * 3 * M * N
    seconds = 2 * flops / H100.peak("bfloat16")  # half the peak
    got = matmul_utilisation(M, K, N, seconds, H100.peak("bfloat16"), H100.hbm_bandwidth, 2)
    expect(got[0], pytest.approx(0.5), "", "MFU of an 8192³ matmul at half the peak")
    mbu = pytest.approx(moved / seconds / H100.hbm_bandwidth)
    expect(got[1], mbu, "", "MBU of an 8192³ matmul at half the peak")


@pytest.mark.exercise("mfu_vs_bandwidth.elementwise_utilisation")
def test_elementwise_at_full_bandwidth_has_tiny_mfu():
    """x + y over 2^28 bf16 elements at the memory roofline: MBU 1, MFU about 1/1000."""
    n, peak, bandwidth = 2**28, H100.peak("bfloat16"), H100.hbm_bandwidth
    seconds = 2 * n * 3 / bandwidth  # two inputs read, one output written
    got_mfu, got_mbu = elementwise_utilisation(n, seconds, peak, bandwidth, 2, inputs=2)
    expect(got_mbu, pytest.approx(1.0), "", "MBU of x + y at the memory roofline")
    expect(got_mfu, pytest.approx(n / seconds / peak), "", "MFU of x + y at the memory roofline")
    expect(got_mfu, below=0.001, what="MFU of x + y")


@pytest.mark.exercise("mfu_vs_bandwidth.best_mfu")
def test_best_mfu_is_capped_by_intensity_over_ridge():
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    ridge = peak / bandwidth
    expect(best_mfu(ridge / 4, peak, bandwidth), pytest.approx(0.25), "", "a quarter of the ridge")
    expect(best_mfu(10 * ridge, peak, bandwidth), pytest.approx(1.0), "", "ten times the ridge")
    add = pytest.approx(1 / 6 / ridge)
    expect(best_mfu(1 / 6, peak, bandwidth), add, "", "1/6 FLOPs/byte, an elementwise add")

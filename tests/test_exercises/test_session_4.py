"""Inference rooflines: chips for a prefill deadline, to hold the weights, for a generation rate."""

import pytest
from adapters import exercise

from roofline.hardware import CHIPS

chips_for_prefill = exercise("inference_roofline.chips_for_prefill")
kv_cache_bytes = exercise("inference_roofline.kv_cache_bytes")
chips_to_hold = exercise("inference_roofline.chips_to_hold")
chips_for_generation = exercise("inference_roofline.chips_for_generation")

H100 = CHIPS["h100-sxm"]  # 989 TFLOP/s bf16, 80 GB at 3.35 TB/s
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

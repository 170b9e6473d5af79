"""The launch-aware decode roofline (roofline/launch_bound.py): a step takes at
least max(bytes / bandwidth, FLOPs / peak, kernels x a launch's cost), and the
tables name which of the three binds. Every expectation is worked by hand here."""

import pytest

from roofline.chips import CHIPS
from roofline.decode_cost import DecodeStep, decode_step_cost
from roofline.launch_bound import estimated_kernels, launch_bound, launch_cost
from roofline.plan.serving import plan_serving, serving_lines
from sessions.config import PRESETS, PUBLISHED

H100 = CHIPS["h100"]
LAUNCH = 0.39e-3 / 164  # GPT-2's measured 0.39 ms a token over its 164 kernels: 2.378 us


def step(memory_s, compute_s):
    return DecodeStep(1, 0, 0, 0, 0, memory_s, compute_s, max(memory_s, compute_s), "", 0.0)


@pytest.mark.parametrize(
    "memory_s, compute_s, kernels, bound, step_s",
    [
        # 100 kernels x 2.378 us = 0.238 ms, under 1 ms of bytes and 10 us of FLOPs.
        (1e-3, 1e-5, 100, "bytes", 1e-3),
        # 2 ms of FLOPs outlast 1 ms of bytes and 0.238 ms of launches.
        (1e-3, 2e-3, 100, "FLOPs", 2e-3),
        # 1,000 kernels: 2.378 ms, above both.
        (1e-3, 2e-3, 1000, "launches", 1000 * LAUNCH),
    ],
)
def test_the_largest_of_three_binds(memory_s, compute_s, kernels, bound, step_s):
    b = launch_bound(step(memory_s, compute_s), kernels, LAUNCH)
    assert b.bound == bound and b.step_s == pytest.approx(step_s, rel=1e-12)
    assert b.launch_s == pytest.approx(kernels * LAUNCH, rel=1e-12)


def test_no_launch_term_leaves_bytes_against_flops():
    b = launch_bound(step(1e-6, 2e-6), 1000, None)  # a TPU or a CPU
    assert b.launch_s is None and (b.bound, b.step_s) == ("FLOPs", 2e-6)


def test_gpt2_at_batch_1_on_an_h100_is_launch_bound():
    # The course's GPT-2 (V = 256) in bf16 at batch 1 reads its matmul weights, 12 x
    # (2·768·3072 + 4·768·12·64) + 256·768 = 85,131,264, its 25 norms (19,200) and a
    # row of positions (768), 2 bytes each: 170,302,464; and its cache, 2·12·1024·12·64·2
    # = 37,748,736: 208,051,200 bytes, 62.1 us at 3.35 TB/s. Its 164 kernels take 0.39 ms.
    cfg = PRESETS["gpt2"].model
    peak = H100.peak("bfloat16")
    s = decode_step_cost(cfg, 1, peak_flops=peak, bandwidth=H100.hbm_bandwidth, dtype="bfloat16")
    assert s.bytes == 208_051_200
    b = launch_bound(s, estimated_kernels(cfg.layers), launch_cost(H100).seconds)
    assert b.kernels == 164 and b.bound == "launches"
    assert b.step_s == pytest.approx(0.39e-3, rel=1e-12)


def test_the_launch_cost_is_sourced_per_chip_family():
    h100 = launch_cost(H100)
    assert h100.seconds == pytest.approx(2.378e-6, rel=1e-3)
    assert "measured" in h100.source and "s3_gpt2_bf16_random.log" in h100.source
    a100 = launch_cost(CHIPS["a100"])
    assert a100.seconds == h100.seconds and "carried over from the H100" in a100.source
    tpu = launch_cost(CHIPS["tpu-v5e"])
    assert tpu.seconds is None and "one program" in tpu.source


def test_kernels_a_token_by_estimate():
    # XLA's GPT-2 on h100:1: 12 layers x 13 + 8 = 164; two fused kernels a layer: 32;
    # Llama 3 8B's 32 layers: 424.
    assert estimated_kernels(12) == 164
    assert estimated_kernels(12, 2) == 32
    assert estimated_kernels(32) == 424


def test_the_planner_names_the_bound_of_each_batch():
    # GPT-2 as published (V = 50,257) on an H100 at T = 1,024: weights 247,104,000 bytes
    # a step, a sequence's cache 37,748,736. Batch 1: 284,852,736 bytes, 85.0 us, under
    # 164 x 2.378 us = 0.39 ms: launches bind. Batch 64: 2,663,023,104 bytes, 0.795 ms:
    # the bytes. With two kernels a layer (32, 76.1 us) the bytes bind at batch 1 too.
    gpt2 = PUBLISHED["gpt2"].model
    plan = plan_serving(gpt2, H100, batches=[1, 64], prompt=16)
    assert [r.launch.bound for r in plan.batches] == ["launches", "bytes"]
    assert plan.batches[0].launch.step_s == pytest.approx(0.39e-3, rel=1e-12)
    assert plan.batches[1].launch.step_s == pytest.approx(2_663_023_104 / 3.35e12, rel=1e-9)
    rows = [line.split() for line in serving_lines(plan, "") if line[:7].strip() in ("1", "64")]
    assert [r[-2] for r in rows] == ["launches", "bytes"]
    fused = plan_serving(gpt2, H100, batches=[1], prompt=16, kernels_per_layer=2)
    assert fused.kernels == 32 and fused.batches[0].launch.bound == "bytes"
    assert fused.batches[0].launch.launch_s == pytest.approx(32 * LAUNCH, rel=1e-12)

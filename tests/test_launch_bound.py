"""The launch-aware decode roofline (roofline/launch_bound.py): a step takes at
least max(bytes / bandwidth, FLOPs / peak, kernels x a launch's cost), and the
tables name which of the three binds. Every expectation is worked by hand here."""

import json
from pathlib import Path

import pytest

from roofline.decode_cost import DecodeStep, decode_step_cost
from roofline.hardware import CHIPS
from roofline.launch_bound import estimated_kernels, launch_bound, launch_cost
from roofline.plan.serving import plan_serving
from roofline.plan.serving_report import serving_lines
from sessions.model.config import PRESETS, PUBLISHED

H100 = CHIPS["h100"]
# The course preset's decode at batch 1 on an H100, 90.77 us a token (check.json's 9.0774e-05 s,
# rounded down) over the 60 kernels its step launches: 1.513 us, the least of the measured ratios.
LAUNCH = 90.77e-6 / 60


def step(memory_s, compute_s):
    return DecodeStep(1, 0, 0, 0, 0, memory_s, compute_s, max(memory_s, compute_s), "", 0.0)


@pytest.mark.parametrize(
    "memory_s, compute_s, kernels, bound, step_s",
    [
        # 100 kernels x 1.513 us = 0.151 ms, under 1 ms of bytes and 10 us of FLOPs.
        (1e-3, 1e-5, 100, "bytes", 1e-3),
        # 2 ms of FLOPs outlast 1 ms of bytes and 0.151 ms of launches.
        (1e-3, 2e-3, 100, "FLOPs", 2e-3),
        # 4,000 kernels: 6.05 ms, above both.
        (1e-3, 2e-3, 4000, "launches", 4000 * LAUNCH),
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
    # = 37,748,736: 208,051,200 bytes, 62.1 us at 3.35 TB/s. Its 163 kernels x 1.513 us take
    # 0.247 ms: four times the bytes, and under the 0.39 ms it took on the H100.
    cfg = PRESETS["gpt2-bytes"].model
    peak = H100.peak("bfloat16")
    s = decode_step_cost(cfg, 1, peak_flops=peak, bandwidth=H100.hbm_bandwidth, dtype="bfloat16")
    assert s.bytes == 208_051_200
    b = launch_bound(s, estimated_kernels(cfg.layers), launch_cost(H100).seconds)
    assert b.kernels == 163 and b.bound == "launches"
    assert b.step_s == pytest.approx(163 * 90.77e-6 / 60, rel=1e-12)


def test_the_launch_cost_is_sourced_per_chip_family():
    h100 = launch_cost(H100)
    assert h100.seconds == pytest.approx(1.513e-6, rel=1e-3)
    assert "measured" in h100.source and "accelerator-check/check.json" in h100.source
    assert "the least of two" in h100.source
    a100 = launch_cost(CHIPS["a100"])
    assert a100.seconds == h100.seconds and "carried over from the H100" in a100.source
    tpu = launch_cost(CHIPS["tpu-v5e"])
    assert tpu.seconds is None and "one program" in tpu.source


def test_kernels_a_token_by_estimate():
    # XLA's GPT-2 on h100:1: 12 layers x 13 + 7 = 163; ours, two kernels a layer and 5
    # outside: 29; three a layer, with XLA's 7 outside: 43; Llama 3 8B's 32 layers: 423.
    assert estimated_kernels(12) == 163
    assert estimated_kernels(12, 2) == 29
    assert estimated_kernels(12, 3) == 43
    assert estimated_kernels(32) == 423


def test_the_planner_names_the_bound_of_each_batch():
    # GPT-2 as published (V = 50,257) on an H100 at T = 1,024: weights 247,104,000 bytes
    # a step, a sequence's cache 37,748,736. Batch 1: 284,852,736 bytes, 85.0 us, under
    # 163 x 1.513 us = 0.247 ms: launches bind. Batch 64: 2,663,023,104 bytes, 0.795 ms:
    # the bytes. With ours, two kernels a layer and 5 outside (29, 43.9 us), the bytes bind
    # at batch 1 too.
    gpt2 = PUBLISHED["gpt2"].model
    plan = plan_serving(gpt2, H100, batches=[1, 64], prompt=16)
    assert [r.times.floor_bound for r in plan.batches] == ["launches", "bytes"]
    assert plan.batches[0].times.floor_s == pytest.approx(163 * LAUNCH, rel=1e-12)
    assert plan.batches[1].times.floor_s == pytest.approx(2_663_023_104 / 3.35e12, rel=1e-9)
    rows = [line.split() for line in serving_lines(plan, "") if line[:7].strip() in ("1", "64")]
    assert [r[-6] for r in rows] == ["launches", "bytes"]  # bound, estimate, binds, tokens/s x2
    fused = plan_serving(gpt2, H100, batches=[1], prompt=16, kernels_per_layer=2)
    assert fused.kernels == 29 and fused.batches[0].times.floor_bound == "bytes"
    assert fused.batches[0].times.floor.launch_s == pytest.approx(29 * LAUNCH, rel=1e-12)


H100_RUN = Path(__file__).resolve().parents[1] / "docs" / "h100-run"
# Kernels a token of each step as compiled for h100:1 here (--target h100:1, transcripts in
# docs/session-3.md): the course preset at batches 1, 4, 16, 64; GPT-2 at batches 1 and 8.
COURSE_KERNELS = {1: 60, 4: 73, 16: 72, 64: 84}
GPT2_KERNELS = {1: 163, 8: 226}


def course_measured():
    """{batch: (seconds a step, bytes a step)} of the course preset on the H100, as the
    accelerator check wrote them."""
    s3 = json.loads((H100_RUN / "accelerator-check" / "check.json").read_text())["s3"]
    return {b["batch"]: (b["step_seconds"], b["bytes_per_step"]) for b in s3["batches"]}


def gpt2_measured():
    """{batch: (seconds a step, bytes a step)} of GPT-2 on the H100, from its log's rows
    "batch ms/step tokens/s MB/step ...": a step is batch / tokens/s."""
    rows = {}
    for line in (H100_RUN / "s3_gpt2_bf16_random.log").read_text(errors="replace").splitlines():
        f = line.split()
        if len(f) == 9 and f[0].isdigit() and f[-1].endswith("%"):
            rows[int(f[0])] = (int(f[0]) / float(f[2].replace(",", "")), float(f[3]) * 1e6)
    return rows


def test_the_roof_sits_under_every_step_measured_on_the_h100():
    """A roof is a floor: kernels x a launch's cost, with the bytes and FLOPs, must come
    out under each decode step the H100 ran. The course preset at batch 1: 60 x 1.513 us
    = 90.77 us against 90.774 us measured; GPT-2 at batch 1: 163 x 1.513 us = 0.247 ms
    against 1 / 2,596 tokens/s = 0.385 ms; at batch 8: 226 x 1.513 us = 0.342 ms against
    8 / 13,990 = 0.572 ms. (With GPT-2's own 2.4 us the course preset's roof, 0.144 ms,
    would sit above its 0.091 ms.)"""
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    per_launch = launch_cost(H100).seconds
    runs = [
        (PRESETS["course"].model, course_measured(), COURSE_KERNELS, 0),
        (PRESETS["gpt2-bytes"].model, gpt2_measured(), GPT2_KERNELS, 0.05e6),  # MB to 0.1
    ]
    for cfg, measured, kernels, bytes_tol in runs:
        assert set(measured) == set(kernels)
        for batch, (step_s, step_bytes) in measured.items():
            s = decode_step_cost(cfg, batch, peak_flops=peak, bandwidth=bandwidth, dtype="bfloat16")
            assert abs(s.bytes - step_bytes) <= bytes_tol  # the same step the run timed
            b = launch_bound(s, kernels[batch], per_launch)
            assert b.step_s <= step_s, (cfg.embed, batch, b.step_s, step_s)
    # the course preset's batch 1 is the measurement the figure comes from: the roof meets it
    step_s, _ = course_measured()[1]
    assert 60 * per_launch == pytest.approx(step_s, rel=1e-4)

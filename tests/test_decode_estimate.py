"""A decode step's floor and estimate (roofline/plan/decode_estimate.py), held to the decode
steps an H100 ran: the estimate within 25% of every one, the floor under each. The
measured seconds are read here from the runs' own files, not from the module's table;
the kernels a token are the steps' as compiled for h100:1 (python sessions/s3_infer.py
--target h100:1 --batches ...), written here by hand."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import BIG
from helpers import GPT2_BF16 as GPT2

from roofline.decode_cost import decode_step_cost
from roofline.hardware import CHIPS
from roofline.plan import decode_estimate as est
from roofline.plan.serving import plan_serving
from roofline.plan.serving_report import serving_lines, serving_summary
from sessions.model.config import PRESETS, PUBLISHED

H100, V5P = CHIPS["h100"], CHIPS["tpu-v5p"]
DOCS = Path(__file__).resolve().parents[1] / "docs"
BF16 = {"dtype": "bfloat16"}
COURSE = dataclasses.replace(PRESETS["course"].model, **BF16)

# Kernels a token, compiled for h100:1 (JAX 0.10.2), by batch.
KERNELS = {
    "course": {1: 60, 4: 73, 16: 72, 64: 84},
    "gpt2-bytes": {1: 163, 8: 226},
    "1.2B": {1: 343, 8: 475},
}


def check_json_steps(run):
    """{batch: seconds a step} of the course preset, as an accelerator check wrote them."""
    s3 = json.loads((DOCS / run / "accelerator-check" / "check.json").read_text())["s3"]
    return {b["batch"]: b["step_seconds"] for b in s3["batches"]}


def log_steps(name):
    """{batch: seconds a step} from an s3 log's rows "batch ms/step tokens/s ... MBU MFU":
    a step is batch / tokens/s (4 digits, where ms/step has 2)."""
    rows = {}
    for line in (DOCS / "h100-run" / name).read_text(errors="replace").splitlines():
        f = line.split()
        if len(f) == 9 and f[0].isdigit() and f[-1].endswith("%"):
            rows[int(f[0])] = int(f[0]) / float(f[2].replace(",", ""))
    return rows


FIRST_RUN = [
    (COURSE, "course", check_json_steps("h100-run")),
    (GPT2, "gpt2-bytes", log_steps("s3_gpt2_bf16_random.log")),
    (BIG, "1.2B", log_steps("s3_1.2B_bf16_random.log")),
]
# The second run's course rows took no part in the fit: held out.
SECOND_RUN = [(COURSE, "course", check_json_steps("h100-run-2"))]


def times(cfg, batch, kernels, **kw):
    step = decode_step_cost(cfg, batch, peak_flops=H100.peak("bfloat16"), bandwidth=3.35e12)
    return step, est.decode_times(step, kernels, H100, **kw)


@pytest.mark.parametrize("runs", [FIRST_RUN, SECOND_RUN], ids=["fitted-on", "held-out"])
def test_the_estimate_is_within_25_percent_of_every_h100_step_and_the_floor_under(runs):
    seen = 0
    for cfg, name, measured in runs:
        assert set(measured) == set(KERNELS[name])
        for batch, step_s in measured.items():
            _, t = times(cfg, batch, KERNELS[name][batch])
            assert abs(t.estimate_s / step_s - 1) <= 0.25, (name, batch, t.estimate_s, step_s)
            assert t.floor_s <= step_s * (1 + 1e-4), (name, batch, t.floor_s, step_s)
            seen += 1
    assert seen == (8 if runs is FIRST_RUN else 4)


def test_the_table_is_the_runs_files():
    """The module's rows: the bytes decode_cost counts, the seconds the files hold."""
    rows = {(r.model.split()[0], r.batch): r for r in est.H100_ROWS}
    assert len(rows) == 8
    for cfg, name, measured in FIRST_RUN:
        for batch, step_s in measured.items():
            r = rows[name, batch]
            step, _ = times(cfg, batch, 1)
            assert r.bytes == step.bytes and r.kernels == KERNELS[name][batch]
            assert r.seconds == pytest.approx(step_s, rel=1e-4)


def test_the_fit_is_the_least_squares_of_the_relative_error():
    """Worked independently: numpy's least squares over the rows' (bytes at the roof,
    kernels) against 1, each row divided by its measured seconds."""
    a = np.array([[r.bytes / 3.35e12 / r.seconds, r.kernels / r.seconds] for r in est.H100_ROWS])
    (x, launch), *_ = np.linalg.lstsq(a, np.ones(len(a)), rcond=None)
    assert pytest.approx(launch, rel=1e-9) == est.LAUNCH_S
    assert pytest.approx(1 / x, rel=1e-9) == est.XLA_FRACTION
    assert 1.3e-6 < est.LAUNCH_S < 2.4e-6  # between Hazy Research's 1.3 us and GPT-2's 2.4


def test_littles_law_on_an_h100():
    # 3.35e12 B/s x 0.7e-6 s = 2,345,000 bytes in flight to stream at the roof.
    assert est.littles_law_bytes(3.35e12) == pytest.approx(2_345_000)
    assert est.achievable_bandwidth(3.35e12, 2_345_000) == pytest.approx(3.35e12)
    assert est.achievable_bandwidth(3.35e12, 10e6) == 3.35e12  # no faster than the roof
    # 12 blocks x 16 KiB = 196,608 bytes: 0.281 TB/s, 8.4% of the roof.
    assert est.achievable_bandwidth(3.35e12, 12 * 16384) == pytest.approx(196_608 / 0.7e-6)


def test_a_kernel_with_too_little_in_flight_is_estimated_slower_than_xla():
    """GPT-2 at batch 1: XLA's 163 kernels, 208,051,200 bytes at 76% of the roof; ours, 29
    kernels streaming 192 KiB in flight, 2.3 MB, and 4.6 MB."""
    step, xla = times(GPT2, 1, 163)
    _, starved = times(GPT2, 1, 29, streams=[(step.bytes, 12 * 16384)])
    _, fed = times(GPT2, 1, 29, streams=[(step.bytes, 2_345_000)])
    assert starved.bytes_s == pytest.approx(208_051_200 * 0.7e-6 / 196_608)  # 0.741 ms
    assert starved.estimate_s > xla.estimate_s > fed.estimate_s
    assert fed.bytes_s == pytest.approx(step.memory_s) and fed.achievable == 3.35e12
    assert fed.estimate_s == pytest.approx(step.memory_s + 29 * est.LAUNCH_S)
    assert starved.estimate_bound == "bytes" and xla.estimate_bound == "launches"
    # Two streams, each at its own rate: half the bytes fed, half starved.
    _, both = times(GPT2, 1, 29, streams=[(step.bytes / 2, 2_345_000), (step.bytes / 2, 196_608)])
    assert both.bytes_s == pytest.approx((fed.bytes_s + starved.bytes_s) / 2)


def test_launches_and_bytes_add_where_the_floor_takes_the_larger():
    step, t = times(GPT2, 1, 163)
    assert t.estimate_s == pytest.approx(t.bytes_s + t.launch_s)
    assert t.bytes_s == pytest.approx(step.memory_s / est.XLA_FRACTION)
    assert t.launch_s == pytest.approx(163 * est.LAUNCH_S)
    assert t.floor_s == pytest.approx(max(step.memory_s, 163 * 90.77e-6 / 60), rel=1e-4)


def test_an_all_reduce_costs_nccl_s_ring_latency_and_its_bytes():
    # NCCL's ring, LL protocol, over NVLink: 6.6 us + 2(n-1) x 0.6 us; on 8 chips 15.0 us,
    # and 2·7/8 of a 1 MB message over 450 GB/s, 3.89 us more.
    assert est.all_reduce_seconds(8, 0, 450e9) == pytest.approx(15.0e-6)
    assert est.all_reduce_seconds(8, 1e6, 450e9) == pytest.approx(15.0e-6 + 1.75e6 / 450e9)
    assert est.all_reduce_seconds(1, 1e6, 450e9) == 0.0


def test_the_planner_gives_the_floor_and_the_estimate_of_each_batch():
    """LLaMA-3-70B on 8 H100s: the estimate adds 160 all-reduces a token (2 a layer) of the
    [B, E] residual in bf16; one chip has none to add."""
    cfg = PUBLISHED["llama3-70b"].model
    plan = plan_serving(cfg, H100, chips=8, batches=[1, 64], prompt=16)
    for r in plan.batches:
        message = r.batch * 8192 * 2
        assert r.times.all_reduce_s == pytest.approx(
            160 * est.all_reduce_seconds(8, message, 450e9)
        )
        terms = r.times.bytes_s + r.times.launch_s + r.times.all_reduce_s
        assert r.times.estimate_s == pytest.approx(terms)
        assert r.times.floor_s == r.step.memory_s  # the bytes bind its floor
    summary = serving_summary(plan)["batches"][0]
    assert summary["floor_step_seconds"] == plan.batches[0].times.floor_s
    assert summary["estimate_step_seconds"] == plan.batches[0].times.estimate_s
    assert summary["estimate_bound"] == "bytes" and summary["floor_bound"] == "bytes"
    one = plan_serving(cfg, H100, chips=1, batches=[1], prompt=16).batches[0]
    assert one.times.all_reduce_s == 0.0


def test_no_estimate_where_nothing_is_fitted():
    """A TPU launches no kernels and has no measured row: the floor only, said so."""
    plan = plan_serving(PUBLISHED["gpt2"].model, V5P, batches=[1], prompt=16)
    assert plan.batches[0].times.estimate_s is None
    lines = serving_lines(plan, "")
    assert any(line.startswith("estimate: none on this chip") for line in lines)
    row = next(line.split() for line in lines if line[:7].strip() == "1")
    assert row[-4:] == ["-", "-", row[-2], "-"]


@pytest.mark.parametrize("batch", [1, 8])
def test_our_kernels_bytes_stream_at_what_their_grids_keep_in_flight(batch):
    """kernel_step.byte_streams splits the step's bytes by the kernels that read them: by
    hand for GPT-2, a layer's attention weights 4·768·768 and norm 768, its MLP's 2·768·3072
    and norm 768, bf16; the caches with the attention; the head's table 256·768 (the tied
    embedding's) and the final norm; the rest (the position row) XLA's. GPT-2's layers keep
    3,145,728 bytes in flight each (48 CTAs x 64 KiB), past Little's 2.3 MB: the bytes at
    the roof; the head 4 CTAs x 12 tiles of 8 KiB (all of each CTA's 64 rows of 768), 393,216:
    at 393,216 / 0.7 us."""
    from sessions.inference import kernel_step

    step, _ = times(GPT2, batch, 29)
    streams = kernel_step.byte_streams(GPT2, batch)
    cache = 2 * 12 * batch * 1024 * 12 * 64 * 2
    assert [b for b, _ in streams] == [
        12 * (4 * 768 * 768 + 768) * 2 + cache,
        12 * (2 * 768 * 3072 + 768) * 2,
        768 * 2,
        (256 * 768 + 768) * 2,
    ]
    assert sum(b for b, _ in streams) == step.bytes
    assert [f for _, f in streams] == [3_145_728, 3_145_728, None, 393_216]
    _, ours = times(GPT2, batch, 29, streams=streams)
    (attention, _), (mlp, _), (rest, _), (head, _) = streams
    at_roof = (attention + mlp) / 3.35e12 + rest / (est.XLA_FRACTION * 3.35e12)
    assert ours.bytes_s == pytest.approx(at_roof + head / (393_216 / 0.7e-6))


def test_a_timed_step_on_an_h100_gets_its_floor_and_estimate(monkeypatch):
    """sessions/inference/step_times.py on an H100 (stood in for: the device's kind, and the
    kernels its compiled step would launch, 163 for GPT-2's XLA step): the roofline's times
    for those kernels; on this CPU, none."""
    from sessions.inference import step_times

    step, want = times(GPT2, 1, 163)
    assert step_times.step_times(step, None, GPT2, 1, None) == (None, None)  # a CPU

    class H100Device:
        platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

    monkeypatch.setattr(step_times.jax, "devices", lambda: [H100Device()])
    monkeypatch.setattr(step_times, "kernels_a_token", lambda *args: 163)
    kernels, got = step_times.step_times(step, None, GPT2, 1, None)
    assert kernels == 163 and got == want
    _, ours = step_times.step_times(step, None, GPT2, 1, "pallas")  # our kernels' streams
    assert ours.bytes_s < got.bytes_s

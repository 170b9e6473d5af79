"""The benchmark and ladder scripts run, and the naive baseline computes the
same loss as ours (so the speed-up compares like with like)."""

import importlib.util
import json
import os
import re
import subprocess

import jax
import pytest
from helpers import REPO, hand_flops, hand_params, run_python, run_script
from jax._src import xla_bridge

from roofline import calibrate, timing
from roofline.hardware import local_peak_flops
from roofline.memory import largest_batch, usable_fraction
from roofline.timing import Timing
from scripts.harness import rungs
from sessions.model.config import PRESETS


def test_bench_times_the_step_of_bf16_weights_with_a_master(capsys, monkeypatch, tmp_path):
    """s2_train.py's --weights bfloat16 --master, benched: the step reads bf16 weights as
    stored (so it computes in bf16), and its memory holds at least the weights (2 bytes a
    parameter), the master (4) and AdamW's two moments (8). --summary-out writes the step
    (0.5 s, a stand-in: 32 x 64 tokens / 0.5 s = 4,096 tokens/s) beside its predictions."""
    monkeypatch.setattr(timing, "time_calls", lambda call, repeats, warmup: Timing((0.5, 0.5)))
    summary = tmp_path / "bench.json"
    argv = ["--preset", "tiny", "--weights", "bfloat16", "--master", "--summary-out", str(summary)]
    code, out, _ = run_script("scripts/bench.py", argv, capsys)
    assert code == 0
    assert "| bfloat16 | bfloat16 weights + float32 master |" in out
    memory = float(re.search(r"memory\s+([\d,.]+) MiB per device", out).group(1).replace(",", ""))
    assert memory * 2**20 > 14 * hand_params(PRESETS["tiny"].model)
    written = json.loads(summary.read_text())
    assert (written["step_seconds"], written["tokens_per_sec"]) == (0.5, 4096)
    assert written["stored"] == "bfloat16 weights + float32 master"
    bound = re.search(r"whole-step bound\s+([\d.]+) (ms|us) a step", out)
    unit = 1e-3 if bound.group(2) == "ms" else 1e-6
    low, high = printed_interval(bound.group(1), unit)
    assert low <= written["bound_step_seconds"] <= high  # the bound it printed


def test_bench_compares_with_naive_on_equal_numbers(capsys, monkeypatch):
    """The timings are fixed (ours 0.5 s, naive 1.25 s a step), so every
    figure bench.py prints can be worked out by hand: the tiny preset at batch
    32 on a CPU is 2,048 tokens a step."""
    times = iter([Timing((0.5, 0.5)), Timing((1.25, 1.25))])
    # bench.py imports time_calls when it runs, so it finds the stand-in.
    monkeypatch.setattr(timing, "time_calls", lambda call, repeats, warmup: next(times))
    code, out, _ = run_script(
        "scripts/bench.py", ["--preset", "tiny", "--compare", "naive"], capsys
    )
    assert code == 0
    ours, naive = map(float, re.search(r"loss (\S+) ours, (\S+) naive", out).groups())
    assert abs(ours - naive) < 1e-4 * abs(ours)

    cfg, B = PRESETS["tiny"].model, 32
    P, exact = hand_params(cfg), sum(hand_flops(cfg, B))
    peak = local_peak_flops("float32")[0]
    assert f"FLOPs per step: {exact / 1e9:.2f} GFLOP exact with attention" in out
    assert f"(6·B·P = {6 * B * cfg.seq * P / 1e9:.2f})" in out
    assert "step time       500.0 ms (median of 2, 500.0-500.0)" in out
    assert "tokens/s        4,096\n" in out
    assert f"achieved        {exact / 0.5 / 1e12:.3f} TFLOP/s" in out
    assert f"MFU             {100 * exact / 0.5 / peak:.1f}% of {peak / 1e12:.3f} TFLOP/s" in out
    assert f"naive MFU       {100 * exact / 1.25 / peak:.1f}%" in out
    assert "speed-up        2.50x" in out
    memory = float(re.search(r"memory\s+([\d,.]+) MiB per device", out).group(1).replace(",", ""))
    assert memory * 2**20 > 12 * P  # at least the params and Adam's two moments
    # Each prediction's tokens/s and our ratio to it follow from its step time. The
    # prediction is this machine's (its calibrated roofs), printed to two decimals of
    # its unit: on a fast CPU "4.20 us" stands for anything in [4.195, 4.205) us, 0.12%
    # either way, so each figure is held to the interval its printed digits allow.
    for name in ("per-op prediction", "whole-step bound"):
        found = re.search(
            name + r"\s+([\d.]+) (ms|us) a step\s+([\d,]+) tokens/s\s+ours ([\d.]+)x", out
        )
        unit = 1e-3 if found.group(2) == "ms" else 1e-6
        low, high = printed_interval(found.group(1), unit)
        tokens = int(found.group(3).replace(",", ""))
        assert 2048 / high - 0.5 <= tokens <= 2048 / low + 0.5
        ratio_low, ratio_high = printed_interval(found.group(4))
        assert ratio_low <= high / 0.5 and low / 0.5 <= ratio_high
    steady = re.search(r"steadiness\s+([\d.]+)%: .* after the first \(([\d, ]+) tokens/s\)", out)
    per_window = [float(x.replace(",", "")) for x in steady.group(2).split(", ")]
    assert len(per_window) == 6  # --windows 6
    seconds = [1 / x for x in per_window[1:]]  # a window's seconds, up to its tokens
    middle = sorted(seconds)[2]
    expected = max(abs(t - middle) for t in seconds) / middle
    assert float(steady.group(1)) == pytest.approx(100 * expected, abs=0.1)


def printed_interval(text, unit=1.0):
    """The values a number printed as `text` (rounded to its decimals) may have stood
    for, times unit: "4.20" -> [4.195, 4.205]."""
    half = 0.5 * 10.0 ** -len(text.partition(".")[2])
    return (float(text) - half) * unit, (float(text) + half) * unit


def test_the_printed_interval_is_half_a_last_digit_either_way():
    assert printed_interval("4.20") == pytest.approx((4.195, 4.205))
    assert printed_interval("12", 1e-3) == pytest.approx((11.5e-3, 12.5e-3))


def test_steadiness_by_hand():
    """Windows of 1.0 (warm-up, not counted), then 0.2, 0.21, 0.19, 0.25 s:
    the median of the four is 0.205, the farthest 0.25, (0.25 - 0.205) / 0.205."""
    assert timing.steadiness([1.0, 0.2, 0.21, 0.19, 0.25]) == pytest.approx(0.045 / 0.205)
    assert timing.steadiness([1.0, 0.3]) == 0.0  # one window after the first: nothing to compare


def test_ladder_prints_every_rung_as_markdown():
    result = run_python(
        "scripts/ladder.py", "--preset", "tiny", "--steps", "2", "--data-delay-ms", "0"
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows[1:]]
    assert [c[0] for c in cells] == [
        "session 1",
        "+ attention",
        "+ positions",
        "+ whole-step jit",
        "+ overlapped loading",
        "+ multichip",
    ]
    # MFU and tokens/s of a rung describe the same step: MFU = (FLOPs per
    # token) x (tokens/s) / this machine's measured peak, whatever the number
    # of devices (each gets its share of the peak). Session 1 has no attention.
    cfg, B = PRESETS["tiny"].model, PRESETS["tiny"].train.batch
    E, F, V, L = cfg.embed, cfg.ff, cfg.vocab, cfg.layers
    no_attention = 6 * B * cfg.seq * (L * 2 * E * F + V * E)
    peak = calibrate.cached("float32")["matmul_flops"]
    for i, (name, tokens_per_s, mfu, *_) in enumerate(cells):
        flops = no_attention if i == 0 else sum(hand_flops(cfg, B))
        expected = 100 * flops / (B * cfg.seq) * float(tokens_per_s.replace(",", "")) / peak
        assert float(mfu.rstrip("%")) == pytest.approx(expected, rel=1e-3, abs=0.051), name


# What the probe finds on a TPU v5e host of 8 chips (jax's device_kind for v5e).
TPU_HOST = {"platform": "tpu", "devices": 8, "kind": "TPU v5 lite", "jax": "0.10.2"}


def rung_summary(platform, n_devices):
    """What a rung's --summary-out says, as far as the ladder reads it."""
    return {
        "platform": platform,
        "n_devices": n_devices,
        "tokens_per_sec": 1000.0,
        "mfu": 0.25,
        "val_loss": 2.0,
        "memory_bytes_per_device": 2**20,
    }


def test_the_ladder_parent_never_takes_the_chips(monkeypatch, capsys):
    """libtpu lets one process hold the chips, and JAX's TPU backend fails
    quietly to the CPU: a parent that started a backend would send every rung
    to the CPU under a TPU heading. Here every way into a backend raises, and
    the table is still built from what the probe and the rungs report."""

    def taken(*args, **kwargs):
        raise AssertionError("the ladder's parent started a JAX backend")

    for module, name in [
        (jax, "devices"),
        (jax, "default_backend"),
        (jax, "device_count"),
        (jax, "local_devices"),
        (xla_bridge, "backends"),
        (xla_bridge, "get_backend"),  # cached: the way in once a backend is up
    ]:
        monkeypatch.setattr(module, name, taken)
    asked = []

    def run_rung(flags, args, devices, tmp, platform):
        asked.append((platform, devices))
        return rung_summary(platform, devices)

    monkeypatch.setattr(rungs, "probe_platform", lambda: TPU_HOST)
    monkeypatch.setattr(rungs, "run_rung", run_rung)
    code, out, _ = run_script("scripts/ladder.py", ["--steps", "2"], capsys)
    assert code == 0
    assert "| TPU v5 lite, " in out and "| jax 0.10.2" in out
    assert asked == [("tpu", 1)] * 5 + [("tpu", 8)]  # the multichip rung: every chip
    rows = [line for line in out.splitlines() if line.startswith("| + multichip |")]
    assert len(rows) == 1 and "params born sharded over 8 devices (fsdp) |" in rows[0]


@pytest.mark.parametrize(
    "platform, n_devices", [("cpu", 8), ("tpu", 1)], ids=["fell-back-to-cpu", "one-chip-of-8"]
)
def test_a_rung_that_ran_elsewhere_is_no_row(monkeypatch, capsys, platform, n_devices):
    """The probe found 8 TPU chips; the multichip rung reports another platform,
    or fewer devices: one line, exit 2, and no row for it."""

    def run_rung(flags, args, devices, tmp, asked_platform):
        if devices == 8:
            return rung_summary(platform, n_devices)
        return rung_summary(asked_platform, devices)

    monkeypatch.setattr(rungs, "probe_platform", lambda: TPU_HOST)
    monkeypatch.setattr(rungs, "run_rung", run_rung)
    code, out, err = run_script("scripts/ladder.py", ["--steps", "2"], capsys)
    assert code == 2
    assert err == (
        f"error: rung '+ multichip' ran on {n_devices} {platform} device(s), "
        "not the 8 tpu it asked for\n"
    )
    assert "| + overlapped loading |" in out and "| + multichip |" not in out


def test_every_mutant_still_fits_the_tree():
    """tests/mutants.py plants its bugs by exact text: code that moves must take
    its mutants along, or the mutation check silently tests nothing."""
    result = run_python("tests/mutants.py", "--check")
    fit = re.search(r"(\d+) of (\d+) mutants fit the tree", result.stdout)
    assert result.returncode == 0 and fit, result.stdout
    assert fit.group(1) == fit.group(2)


def test_the_mutation_check_reads_failed_ids_with_spaces_whole():
    """A mutant counts as caught only if each named test fails; a parametrization
    whose id holds a space must still be read as failed, not as missed."""
    spec = importlib.util.spec_from_file_location(
        "mutants", os.path.join(REPO, "tests", "mutants.py")
    )
    mutants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutants)
    out = (
        "FAILED pkg/test_a.py::test_x[a b] - AssertionError: 1 != 2\n"
        "ERROR pkg/test_b.py::test_y\n"
        "FAILED pkg/test_c.py::test_z[fsdp=4,tp=2] - x - y\n"
    )
    failed = mutants.failed_tests(out)
    assert failed == {
        "pkg/test_a.py::test_x[a b]",
        "pkg/test_b.py::test_y",
        "pkg/test_c.py::test_z[fsdp=4,tp=2]",
    }
    assert not mutants.missed(["pkg/test_a.py::test_x", "pkg/test_b.py::test_y"], failed)


@pytest.mark.parametrize(
    ("limit", "unit", "start", "expected"), [(363, 1, 32, 363), (100, 8, 8, 96)]
)
def test_the_largest_batch_is_found_by_doubling_then_bisecting(limit, unit, start, expected):
    """A plan that fits up to `limit` sequences: the search finds the largest
    multiple of the mesh's unit below it, asking only about multiples of the unit."""
    asked = []

    def fits(batch):
        asked.append(batch)
        return batch <= limit

    assert largest_batch(fits, unit, start) == expected
    assert all(b % unit == 0 for b in asked)
    assert len(asked) <= 2 * (limit // unit).bit_length()  # doubling, then bisecting


def test_a_gpu_plans_for_the_memory_jax_preallocates(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert (usable_fraction("gpu"), usable_fraction("tpu")) == (0.75, 1.0)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert usable_fraction("gpu") == 0.9


def first_call_fixtures(work):
    """What gpu_first_call.sh's pieces write, by hand: the machine; the check's trace
    (8 ms against a 2 ms bound) and s3's batch 1 (0.2 ms against a 0.1 ms estimate);
    bench.py's step (10 ms against 8 ms per op, 5 ms bound); bench_decode's XLA step at
    batch 1 (2,000 tokens/s: 0.5 ms, against a 0.25 ms estimate), at batch 8 with neither
    estimate nor floor (8,000 tokens/s: 1 ms, MBU 25%: its bytes take 0.25 ms) and ours at
    batch 8 (16,000 tokens/s: 0.5 ms, no estimate, a 0.4 ms floor); a piece timed out."""
    (work / "check").mkdir()
    (work / "machine.json").write_text('{"kind": "NVIDIA H200", "jax": "0.11.2"}')
    (work / "pieces.tsv").write_text("check\t0\t100\t130\ndecode_1.2b\t124\t120\t120\n")
    compare = {"measured_step_seconds": 8e-3, "bound_step_seconds": 2e-3, "bound": "compute"}
    (work / "check" / "compare.json").write_text(json.dumps(compare))
    s3 = {"batches": [{"batch": 1, "step_seconds": 2e-4, "estimate_step_seconds": 1e-4}]}
    (work / "check" / "s3.json").write_text(json.dumps(s3))
    bench = {"preset": "course", "batch": 32, "seq": 128, "stored": "float32", "step_seconds": 0.01}
    bench |= {"per_op_step_seconds": 0.008, "bound_step_seconds": 0.005}
    (work / "bench_course.json").write_text(json.dumps(bench))
    xla = {"1": {"tokens_per_sec": 2000.0, "estimate_step_seconds": 2.5e-4}}
    xla["8"] = {"tokens_per_sec": 8000.0, "mbu": 0.25}  # a GPU the chip table lacks
    ours = {
        "8": {"tokens_per_sec": 16000.0, "estimate_step_seconds": None, "floor_step_seconds": 4e-4}
    }
    decode = {
        "mbu_model": {"embed": 768, "layers": 12},
        "decode_impls": [{"xla": xla, "pallas": ours}],
    }
    (work / "decode_gpt2.json").write_text(json.dumps(decode))


def test_the_first_call_s_table_holds_each_measured_figure_against_its_prediction(tmp_path, capsys):
    first_call_fixtures(tmp_path)
    figures = tmp_path / "figures.json"
    code, out, err = run_script(
        "scripts/first_call_table.py", [str(tmp_path), "--json-out", str(figures)], capsys
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "gpu first call | NVIDIA H200 | JAX 0.11.2 | measured against predicted"
    cells = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in lines[3:]}

    def said(piece, what):
        return [c.strip() for c in cells[piece, what].strip("|").split("|")[2:]]

    assert said("check", "s2 trace, median step") == [
        "8.000 ms",
        "2.000 ms (roofline bound, compute)",
        "4.00x",
    ]
    assert said("check", "s3 decode, batch 1") == ["0.200 ms", "0.100 ms (estimate)", "2.00x"]
    course = "train step, course 32x128, float32"
    assert said("bench_course", course) == ["10.000 ms", "8.000 ms (per-op prediction)", "1.25x"]
    assert said("bench_course", "the same")[1:] == ["5.000 ms (whole-step bound)", "2.00x"]
    assert said("decode_gpt2", "decode xla, E=768 L=12, batch 1") == [
        "0.500 ms",
        "0.250 ms (estimate)",
        "2.00x",
    ]
    assert said("decode_gpt2", "decode xla, E=768 L=12, batch 8") == [
        "1.000 ms",
        "0.250 ms (bytes at the roof)",
        "4.00x",
    ]
    assert said("decode_gpt2", "decode pallas, E=768 L=12, batch 8") == [
        "0.500 ms",
        "0.400 ms (floor)",
        "1.25x",
    ]
    assert said("decode_1.2b", "TIMED OUT after 120 s (limit 120 s)") == ["-", "-", "-"]
    assert ("check", "") not in cells  # a piece that ran well is no row of its own
    gathered = json.loads(figures.read_text())
    assert gathered["bench_course.json"]["step_seconds"] == 0.01
    assert gathered["pieces"]["decode_1.2b"] == {"exit": 124, "seconds": 120, "limit": 120}


def test_the_first_call_script_parses_and_names_what_it_runs():
    """bash -n: no syntax error in scripts/gpu_first_call.sh; and each script it calls is
    there (the one real call cannot fail on a path)."""
    script = os.path.join(REPO, "scripts", "gpu_first_call.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    with open(script) as f:
        text = f.read()
    called = set(re.findall(r"scripts/\w+\.py", text))
    assert {"scripts/accelerator_check.py", "scripts/bench.py", "scripts/bench_decode.py"} <= called
    assert all(os.path.exists(os.path.join(REPO, path)) for path in called), called

"""The benchmark and ladder scripts run, and the naive baseline computes the
same loss as ours (so the speed-up compares like with like)."""

import re

import pytest
from helpers import hand_flops, hand_params, run_python, run_script

from roofline import calibrate, timing
from roofline.hardware import local_peak_flops
from roofline.timing import Timing
from sessions.config import PRESETS


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


def test_every_mutant_still_fits_the_tree():
    """scripts/mutants.py plants its bugs by exact text: code that moves must take
    its mutants along, or the mutation check silently tests nothing."""
    result = run_python("scripts/mutants.py", "--check")
    fit = re.search(r"(\d+) of (\d+) mutants fit the tree", result.stdout)
    assert result.returncode == 0 and fit, result.stdout
    assert fit.group(1) == fit.group(2)

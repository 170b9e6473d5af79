"""The benchmark and ladder scripts run, and the naive baseline computes the
same loss as ours (so the speed-up compares like with like)."""

import re

from conftest import run_python

from scripts import bench


def test_bench_compares_with_naive_on_equal_numbers(capsys):
    assert bench.main(["--preset", "tiny", "--repeats", "2", "--warmup", "1",
                       "--compare", "naive"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    ours, naive = map(float, re.search(r"loss (\S+) ours, (\S+) naive", out).groups())
    assert abs(ours - naive) < 1e-4 * abs(ours)
    speedup = float(re.search(r"speed-up\s+(\S+)x", out).group(1))
    assert speedup > 0
    assert re.search(r"MFU\s+\d+\.\d% of", out)
    assert "MiB per device" in out


def test_ladder_prints_every_rung_as_markdown():
    result = run_python("scripts/ladder.py", "--preset", "tiny", "--steps", "2",
                        "--data-delay-ms", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows[1:]]
    assert names == ["session 1", "+ attention", "+ positions", "+ whole-step jit",
                     "+ overlapped loading", "+ multichip"]  # fmt: skip

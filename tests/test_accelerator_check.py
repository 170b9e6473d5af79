"""scripts/accelerator_check.py: the real-chip check, rehearsed on the CPU with
tiny shapes, so every step it chains and every figure of its table is read
from what the session scripts really wrote."""

import json
import os

import pytest
from helpers import run_script, subprocess_env

BENCH = "--preset tiny --mbu-preset tiny --batches 1,2 --cache-batches 1,2 --repeats 1"


def test_without_an_accelerator_it_refuses_unless_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", subprocess_env(devices=1)["XLA_FLAGS"])
    code, _, err = run_script("scripts/accelerator_check.py", ["--run-dir", str(tmp_path)], capsys)
    assert code == 2
    assert "JAX sees no GPU or TPU here" in err


def test_the_whole_path_on_the_cpu_ends_in_one_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", subprocess_env(devices=1)["XLA_FLAGS"])
    argv = [
        "--cpu",
        "--run-dir",
        str(tmp_path),
        "--bench-args",
        BENCH,
        "--s3-args",
        "--new-tokens 16 --batches 1,2",
        "--",
        "--preset",
        "tiny",
        "--steps",
        "6",
        "--log-every",
        "2",
        "--sample-bytes",  # the table reads no sample: none is compiled and run
        "0",
    ]
    code, out, err = run_script("scripts/accelerator_check.py", argv, capsys)
    assert code == 0, (out, err)
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["exit"] == {"s2": 0, "compare": 0, "s3": 0, "bench": 0}
    s2, compared, s3, bench = check["s2"], check["compare"], check["s3"], check["bench"]
    assert s2["steps"] == 6
    # The table shows what the scripts wrote, each figure on its row.
    assert f"{s2['tokens_per_sec']:,.0f} tokens/s" in out
    assert f"| {'  its steadiness':<28} | {100 * s2['steadiness']:.1f}%" in out  # 3 intervals
    assert f"{compared['measured_step_seconds'] * 1e3:,.2f} ms" in out
    assert f"roofline bound {compared['bound_step_seconds'] * 1e3:,.2f} ms" in out
    assert compared["bound_step_seconds"] <= compared["measured_step_seconds"]  # a lower bound
    first = s3["batches"][0]
    assert f"s3 decode, batch {first['batch']}" in out
    assert f"MBU {100 * first['mbu']:.1f}%" in out
    assert f"MBU {100 * bench['mbu_batch_1']:.1f}%" in out
    assert bench["dtype"] == "float32"  # on a CPU, the dtype s2_train.py trains in
    assert (tmp_path / "checkpoints").is_dir()  # s3 decoded the checkpoint s2 kept
    assert "checkpoint at step 6" in (tmp_path / "s3.log").read_text()


@pytest.mark.parametrize("run", ["accelerator-check.json", "accelerator-check-2.json"])
def test_the_results_page_shows_the_table_the_h100_check_printed(capsys, tmp_path, run):
    """docs/results.md's accelerator tables are the tables of the H100 runs' check.json
    (the first real chip, at commit 4a81693, before the float32-sum fix; the second at
    8c57afa, after it) as the script prints them, none retyped; a missing file is one line."""
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "h100", run)
    code, out, _ = run_script("scripts/accelerator_check.py", ["--table", fixture], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "accelerator check | 1 x NVIDIA H100 80GB HBM3 | JAX 0.11.2"
    results = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "results.md")
    with open(results) as f:
        page = f.read()
    assert "```\n" + "\n".join(lines) + "\n```" in page
    code, _, err = run_script(
        "scripts/accelerator_check.py", ["--table", str(tmp_path / "none.json")], capsys
    )
    assert code == 2 and err.strip().endswith("none.json: no check.json to read")

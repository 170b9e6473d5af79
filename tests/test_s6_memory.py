"""sessions/s6_memory.py, the session's story on this machine: every lever compiled and
run on the tiny preset, read back from what the script printed and wrote.

What is held: no lever changes the loss; with the layers unrolled XLA's CPU plan is the
same under every remat policy, with them scanned block remat holds under half of none;
accumulation holds less again; --summary-out carries the keys the issue names; and bad
input is one line. The napkin's own agreement with XLA's plan is held at the cpu preset
in tests/test_training_memory.py, where the shapes are large enough to dominate."""

import json

import pytest
from helpers import need, run_script

KEYS = {
    "remat", "scan", "accum", "weights", "master", "dtype", "planned_bytes", "xla_bytes",
    "step_seconds", "flops", "compile_seconds", "loss", "recompute_in_forward", "float32_dots",
}  # fmt: skip
TINY = ["--preset", "tiny", "--batch", "8", "--steps", "2"]


def test_the_levers_change_the_bytes_and_never_the_loss(tmp_path, capsys):
    summary = tmp_path / "s6.json"
    code, out, err = run_script(
        "sessions/s6_memory.py", [*TINY, "--summary-out", str(summary)], capsys
    )
    assert code == 0, err
    written = json.loads(summary.read_text())["levers"]
    assert [set(row) for row in written] == [KEYS] * 11
    levers, recipes = written[:8], written[8:]  # the levers' table, then the weights' recipes
    rows = {(r["remat"], r["scan"], r["accum"]): r for r in levers}
    losses = [r["loss"] for r in levers]
    assert max(losses) - min(losses) < 1e-5, losses
    xla = {key: r["xla_bytes"] for key, r in rows.items()}
    # Unrolled, the CPU plans none's bytes under block exactly when its schedule rebuilds
    # during the forward (JAX 0.10's does, 0.12's does not)...
    same = abs(xla[("block", False, 1)] / xla[("none", False, 1)] - 1) < 0.05
    assert same == rows[("block", False, 1)]["recompute_in_forward"], xla
    # ...scanned, block keeps each layer's input alone, and 4 microbatches a quarter.
    assert xla[("block", True, 1)] < 0.5 * xla[("none", True, 1)], xla
    assert xla[("block", True, 4)] < xla[("block", True, 1)], xla
    # ...and selective keeps all but attention's [S, S] values: between the two.
    assert xla[("block", True, 1)] < xla[("selective", True, 1)] < xla[("none", True, 1)], xla
    # block recomputes each layer's forward: its FLOPs, predicted, exceed none's.
    assert rows[("block", True, 1)]["flops"] > rows[("none", True, 1)]["flops"]
    assert all(r["step_seconds"] > 0 and r["compile_seconds"] > 0 for r in written)
    assert "losses after the same steps: within" in out
    # The recipes: bf16 matmuls each, float32 weights, bf16 with a master, bf16 alone.
    stored = [(r["weights"], r["master"], r["dtype"]) for r in recipes]
    assert stored == [("float32", False, "bfloat16"), ("bfloat16", True, "bfloat16"),
                      ("bfloat16", False, "bfloat16")]  # fmt: skip
    assert "18 bytes a parameter; a chip holds +2.0 on the napkin" in out
    assert "14 bytes a parameter; a chip holds -2.0 on the napkin" in out
    # By hand: LLaMA-3-70B's 70,553,706,496 parameters at 12 bytes (bf16 weights and
    # gradients, float32 m and v) are 846.6 GB: 8.3 of v5p's 102 GB (95 GiB) chips.
    assert "its state alone fills 9 chips" in out
    assert "LLaMA-3-8B on one H100" in out
    assert "compile seconds" in out


def test_a_target_compiles_the_levers_and_runs_nothing(tmp_path, capsys):
    need("gpu")
    summary = tmp_path / "s6.json"
    argv = [*TINY, "--target", "h100:1", "--summary-out", str(summary)]
    code, out, err = run_script("sessions/s6_memory.py", argv, capsys)
    assert code == 0, err
    levers = json.loads(summary.read_text())["levers"]
    assert all(r["loss"] is None and r["step_seconds"] is None for r in levers)
    rows = {(r["remat"], r["scan"], r["accum"]): r["xla_bytes"] for r in levers}
    assert rows[("block", False, 1)] < rows[("none", False, 1)], rows  # rebuilt in the backward
    assert "h100-sxm" in out and "3. compile time" not in out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--batch", "6"], "--batch 6: a multiple of 4"),
        (["--steps", "0"], "--steps"),
        (["--steps", "1"], "--steps 1: at least 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    code, _, err = run_script("sessions/s6_memory.py", ["--preset", "tiny", *argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err

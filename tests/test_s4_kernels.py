"""sessions/s4_kernels.py tells session 4's story: each equality it prints holds."""

from helpers import run_script


def test_every_check_holds_and_is_printed(capsys):
    argv = ["--no-target", "--seq", "40", "--fsdp-steps", "2"]
    code, out, err = run_script("sessions/s4_kernels.py", argv, capsys)
    assert code == 0, out[-3000:] + err[-2000:]
    checks = [line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  ok ")]
    assert checks == [
        "ok   online softmax == softmax",
        "ok   forward == einsum attention",
        "ok   dq == einsum attention's",
        "ok   dk == einsum attention's",
        "ok   dv == einsum attention's",
        "ok   manual == auto, step for step (relative)",
        "ok   manual == auto, step for step (relative)",
        "ok   ring of ppermutes == all-gather, then matmul",
    ]
    assert "FAIL" not in out and out.rstrip().endswith("every check held")
    # The two FSDP programs side by side: ours reduce-scatters, the partitioner's does not.
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("reduce-scatter")]
    assert len(rows) == 2 and all(int(r[1]) > 0 and int(r[5]) == 0 for r in rows)


def test_a_failed_check_fails_the_run(capsys, monkeypatch):
    """Manual FSDP drifting from the partitioner's (faked here, so no step compiles):
    FAIL printed, the other checks still run, exit status 1."""
    from sessions import manual_fsdp

    def drifting(mesh_text, steps, devices):
        return {"auto": ([6.29, 6.22], ""), "manual": ([6.29, 6.23], "")}

    monkeypatch.setattr(manual_fsdp, "train_both_ways", drifting)
    argv = ["--no-target", "--seq", "40", "--fsdp-steps", "2"]
    code, out, _ = run_script("sessions/s4_kernels.py", argv, capsys)
    assert code == 1 and "FAIL manual == auto, step for step (relative)" in out
    assert "ok   ring of ppermutes == all-gather, then matmul" in out
    assert out.rstrip().endswith("a check failed: see FAIL above")

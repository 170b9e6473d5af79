"""The session scripts end to end, and every bad input answered on one line
with exit status 2."""

import json

import pytest
from conftest import run_python, s2_in_process

REQUIRED = {"step", "loss", "tokens_per_sec", "tflops_per_device", "mfu"}


def test_s1_runs_end_to_end():
    result = run_python(
        "sessions/s1_train.py", "--preset", "tiny", "--steps", "3", "--log-every", "1"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("| loss ") == 3


def test_s2_runs_end_to_end_and_writes_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run_python(
        "sessions/s2_train.py",
        "--preset",
        "tiny",
        "--steps",
        "3",
        "--log-every",
        "1",
        "--metrics-out",
        str(metrics),
        "--run-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(REQUIRED <= set(r) for r in records)
    assert all(r["mfu"] > 0 and r["tokens_per_sec"] > 0 for r in records)
    assert "val_loss" in records[-1]
    assert "sample:" in result.stdout and "summary" in result.stdout
    assert (tmp_path / "loss.png").stat().st_size > 1000


BAD_INPUTS = {
    "unknown preset": (["--preset", "huge"], "invalid choice: 'huge'"),
    "zero batch": (["--batch", "0"], "must be a positive integer"),
    "negative steps": (["--steps", "-3"], "must be a positive integer"),
    "non-numeric lr": (["--lr", "fast"], "'fast' is not a number"),
    "unknown flag": (["--epochs", "3"], "unrecognized arguments"),
    "batch vs mesh": (["--preset", "tiny", "--batch", "3"], "--batch 3 does not divide"),
    "heads vs mesh": (["--preset", "tiny", "--mesh", "tp=8"], "--heads 4 does not divide"),
    "embed vs mesh": (["--preset", "tiny", "--embed", "20"], "--embed 20 does not divide"),
    "mesh vs devices": (["--preset", "tiny", "--mesh", "fsdp=3"], "but 8 are present"),
    "unknown axis": (["--preset", "tiny", "--mesh", "pipe=8"], "unknown axis 'pipe'"),
    "bad axis size": (["--preset", "tiny", "--mesh", "fsdp=x"], "needs a positive size"),
    "missing data": (["--preset", "tiny", "--data", "/no/such/file.txt"], "no such file"),
}


@pytest.mark.parametrize("argv, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, err = s2_in_process(argv, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content, message", [("", "is empty"), ("x" * 40, "too short")])
def test_bad_data_file_is_one_line_and_exit_2(tmp_path, content, message, capsys):
    path = tmp_path / "corpus.txt"
    path.write_text(content)
    code, err = s2_in_process(["--preset", "tiny", "--data", str(path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_prompt_longer_than_the_context_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--preset", "tiny", "--steps", "1", "--prompt", "x" * 65, "--run-dir", str(tmp_path)]
    code, err = s2_in_process(argv, capsys)
    assert code == 2 and "longer than the context of 64" in err


def test_a_diverging_run_stops_with_the_step_and_advice(tmp_path, capsys):
    argv = [
        "--preset",
        "tiny",
        "--steps",
        "30",
        "--log-every",
        "1",
        "--lr",
        "1e12",
        "--run-dir",
        str(tmp_path),
    ]
    code, err = s2_in_process(argv, capsys)
    assert code == 1
    assert "the loss became nan at step" in err and "--lr" in err


def test_unreadable_data_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """Permission denied, simulated: as root (CI), chmod 000 would not stop a read."""
    from sessions import data

    path = tmp_path / "corpus.txt"
    path.write_text("x" * 1000)

    def denied(filename, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(filename))

    monkeypatch.setattr(data.np, "memmap", denied)
    code, err = s2_in_process(["--preset", "tiny", "--data", str(path)], capsys)
    assert code == 2 and f"cannot read {path}" in err and len(err.strip().splitlines()) == 1

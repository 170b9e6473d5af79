"""The session scripts end to end, and every bad input answered on one line
with exit status 2."""

import ast
import json
import os
import sys
import time
import types

import pytest
from helpers import REPO, TINY_STEPS, hand_flops, hand_params, run_script, s2_in_process

from roofline import calibrate
from sessions.model.config import PRESETS
from sessions.run.cli import resolve, train_flags
from sessions.run.report import summary_lines
from sessions.train.meter import format_record

REQUIRED = {"step", "loss", "tokens_per_sec", "tflops_per_device", "mfu"}


class Ticks(types.ModuleType):
    """A stand-in for a script's `time` module: each perf_counter reading is one
    second after the last; the rest is the real module's."""

    def __init__(self):
        super().__init__("time")
        self.now = 0.0

    def perf_counter(self):
        self.now += 1.0
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def test_s1_runs_end_to_end_and_counts_its_tokens(monkeypatch, capsys):
    """s1_train.py reads the clock once at the start and once per log line, so
    with one second between readings step k's line covers k seconds and
    k · 16 · 64 tokens: 1,024 tokens/s on every line. The script's
    `import time` finds the stand-in (modules imported before hold the real one)."""
    monkeypatch.setitem(sys.modules, "time", Ticks())
    argv = ["--preset", "tiny", "--steps", "3", "--log-every", "1"]
    code, out, _ = run_script("sessions/s1_train.py", argv, capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if "| loss " in line]
    assert len(lines) == 3
    assert all(line.endswith("| 1,024 tok/s") for line in lines), lines


STEPS = ["--steps", str(TINY_STEPS)]  # the suite's (tests/helpers.py): one compiled step


def test_s2_runs_end_to_end_and_every_number_it_prints_is_right(tmp_path, capsys):
    """The tiny preset for 4 steps on 8 simulated devices (fsdp=8). Counts are
    checked against hand counts; timed figures against each other and the
    step time, so a factor (devices, tokens, a step too many) shows."""
    metrics, summary_path = tmp_path / "metrics.jsonl", tmp_path / "summary.json"
    argv = ["--preset", "tiny", *STEPS, "--log-every", "1", "--metrics-out", str(metrics)]
    argv += ["--summary-out", str(summary_path), "--run-dir", str(tmp_path)]
    # A sample in the context's first window: one prefill, one decode (the window
    # sliding past the context: test_inference.py's text helper test).
    argv += ["--sample-bytes", "8"]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = json.loads(summary_path.read_text())
    assert [r["step"] for r in records] == list(range(1, TINY_STEPS + 1))
    assert all(set(r) >= REQUIRED for r in records)
    assert "val_loss" in records[-1]
    assert (summary["platform"], summary["n_devices"]) == ("cpu", 8)  # where it ran
    assert "sample:" in out
    assert (tmp_path / "loss.png").stat().st_size > 1000

    cfg, B, n = PRESETS["tiny"].model, PRESETS["tiny"].train.batch, 8
    P, tokens = hand_params(cfg), B * cfg.seq
    exact = sum(hand_flops(cfg, B))
    assert f"| {P / 1e6:.2f}M params |" in out
    assert f"6·B·P = {6 * tokens * P / 1e9:.2f} GFLOP" in out
    assert f"exact with attention = {exact / 1e9:.2f} GFLOP" in out
    # Params, Adam's mu and nu (4 bytes each) and two int32 counters; fsdp=8
    # splits every weight but the 2·L + 1 norm scales [E].
    state = 12 * P + 8
    norms = 12 * (2 * cfg.layers + 1) * cfg.embed
    per_device = (12 * P - norms) // n + norms + 8
    assert (
        f"params + optimizer state: {state / 2**20:.2f} MiB in all, "
        f"{per_device / 2**20:.2f} MiB per device"
    ) in out

    # The peak: this machine's measured matmul rate, shared by the 8 devices.
    measured = calibrate.cached("float32")["matmul_flops"]
    peak = summary["peak_tflops_per_device"] * 1e12
    assert peak == pytest.approx(measured / n, rel=1e-9)
    for r in records:
        assert r["tokens_per_sec"] * r["step_time_s"] == pytest.approx(tokens)
        assert r["tflops_per_device"] * 1e12 * r["step_time_s"] * n == pytest.approx(exact)
        assert r["mfu"] * peak * n * r["step_time_s"] == pytest.approx(exact)
        assert format_record(r) in out
    # Each log interval is one step, so the summary's step time is their mean.
    step = sum(r["step_time_s"] for r in records) / TINY_STEPS
    assert summary["step_time_s"] == pytest.approx(step)
    assert summary["tokens_per_sec"] == pytest.approx(tokens / step)
    assert summary["tflops_per_device"] == pytest.approx(exact / step / n / 1e12)
    assert summary["mfu"] == pytest.approx(exact / step / (peak * n))
    assert summary["memory_bytes_per_device"] > per_device + 2 * tokens // n * 4
    for line in summary_lines(summary):
        assert line in out


BAD_INPUTS = {
    "unknown preset": (["--preset", "huge"], "invalid choice: 'huge'"),
    "zero batch": (["--batch", "0"], "must be a positive integer"),
    "negative steps": (["--steps", "-3"], "must be a positive integer"),
    "non-numeric lr": (["--lr", "fast"], "'fast' is not a number"),
    "unknown flag": (["--epochs", "3"], "unrecognized arguments"),
    "batch vs mesh": (["--preset", "tiny", "--batch", "3"], "batch 3 does not divide"),
    "heads vs mesh": (["--preset", "tiny", "--mesh", "tp=8"], "heads 4 does not divide"),
    "embed vs mesh": (["--preset", "tiny", "--embed", "20"], "embed 20 does not divide"),
    "mesh vs devices": (["--preset", "tiny", "--mesh", "fsdp=3"], "but 8 are present"),
    "unknown axis": (["--preset", "tiny", "--mesh", "pipe=8"], "unknown axis 'pipe'"),
    "bad axis size": (["--preset", "tiny", "--mesh", "fsdp=x"], "needs a positive size"),
    "missing data": (["--preset", "tiny", "--data", "/no/such/file.txt"], "no such file"),
    "summary into no folder": (
        ["--preset", "tiny", "--summary-out", "/no/such/dir/s.json"],
        "cannot write '/no/such/dir/s.json': its directory /no/such/dir does not exist",
    ),
    "metrics into a folder": (["--preset", "tiny", "--metrics-out", "/"], "'/': is a directory"),
    "vocab below bytes": (
        ["--preset", "tiny", "--vocab", "100"],
        "--vocab 100: the tokens of this corpus are bytes",
    ),
    "kv heads vs heads": (
        ["--preset", "tiny", "--kv-heads", "3"],
        "--kv-heads 3 must divide the 4 query heads (try 1, 2, 4)",
    ),
    "zero kv heads": (["--preset", "tiny", "--kv-heads", "0"], "must be a positive integer"),
    "kv heads vs mesh": (
        ["--preset", "tiny", "--kv-heads", "1", "--mesh", "fsdp=4,tp=2"],
        "kv_heads 1 does not divide over tp = 2",
    ),
    "a master of float32 weights": (
        ["--preset", "tiny", "--master"],
        "--master keeps a float32 copy of bfloat16 weights: add --weights bfloat16",
    ),
    "bf16 weights in float32": (
        ["--preset", "tiny", "--weights", "bfloat16", "--dtype", "float32"],
        "--weights bfloat16 computes in bfloat16, not float32: drop --dtype",
    ),
    "rope on an odd head": (
        ["--preset", "tiny", "--rope", "--head-dim", "7"],
        "--rope needs an even --head-dim, not 7",
    ),
}


@pytest.mark.parametrize("argv, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, err = s2_in_process(argv, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


# Every flag of the course's scripts that names a course preset. gpt2 is the published
# GPT-2 (V=50,257), python -m roofline's alone: each refuses it, naming ours.
COURSE_PRESET_FLAGS = [
    *((f"sessions/{s}.py", "--preset") for s in ("s1_train", "s2_train", "s3_infer")),
    *((f"sessions/{s}.py", "--preset") for s in ("s5_serve", "s6_memory")),
    *((f"scripts/{s}.py", "--preset") for s in ("bench", "bench_decode", "max_batch")),
    *((f"scripts/{s}.py", "--preset") for s in ("kernels_across_jax", "profile_s2")),
    ("scripts/bench_decode.py", "--mbu-preset"),
]


@pytest.mark.parametrize("script, flag", COURSE_PRESET_FLAGS)
def test_the_course_s_scripts_refuse_the_published_gpt2_naming_gpt2_bytes(script, flag, capsys):
    code, out, err = run_script(script, [flag, "gpt2"], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith(
        f"argument {flag}: gpt2 is the published GPT-2 (V=50,257), which python -m roofline "
        "plans (predict, decode, memory); the course's GPT-2 on bytes is gpt2-bytes"
    ), err


@pytest.mark.parametrize("content, message", [("", "is empty"), ("x" * 40, "too short")])
def test_bad_data_file_is_one_line_and_exit_2(tmp_path, content, message, capsys):
    path = tmp_path / "corpus.txt"
    path.write_text(content)
    code, err = s2_in_process(["--preset", "tiny", "--data", str(path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "where, message",
    [
        ("a file", "a file, not a folder"),
        ("under a file", "cannot make this folder (Not a directory)"),
        ("/proc/x", "cannot make this folder (No such file or directory)"),
    ],
    ids=["file", "under-file", "proc"],
)
def test_a_run_dir_that_cannot_be_made_stops_the_run_before_it_trains(
    tmp_path, capsys, where, message
):
    """The loss curve is written after the last step; its folder is made before
    the first, so a mistyped --run-dir costs no training."""
    if where == "/proc/x" and not os.path.isdir("/proc"):
        pytest.skip("no /proc on this system")
    (tmp_path / "a file").write_text("not a folder")
    folder = {"a file": tmp_path / "a file", "under a file": tmp_path / "a file" / "sub"}
    folder = str(folder.get(where, where))
    argv = ["--preset", "tiny", "--steps", "2", "--log-every", "1", "--run-dir", folder]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--run-dir {folder}: {message}" in err
    assert "| loss" not in out and "params + optimizer state" not in out


def test_prompt_longer_than_the_context_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--preset", "tiny", *STEPS, "--prompt", "x" * 65, "--run-dir", str(tmp_path)]
    code, err = s2_in_process(argv, capsys)
    assert code == 2 and "longer than the context of 64" in err


def test_a_diverging_run_stops_with_the_step_and_advice(tmp_path, capsys):
    argv = ["--preset", "tiny", "--steps", "30", "--log-every", "1", "--lr", "1e12"]
    code, err = s2_in_process([*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 1
    assert "the loss became nan at step" in err and "--lr" in err


def test_unreadable_data_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """Permission denied, simulated: as root (CI), chmod 000 would not stop a read."""
    from sessions.train import data

    path = tmp_path / "corpus.txt"
    path.write_text("x" * 1000)

    def denied(filename, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(filename))

    monkeypatch.setattr(data.np, "memmap", denied)
    code, err = s2_in_process(["--preset", "tiny", "--data", str(path)], capsys)
    assert code == 2 and f"cannot read {path}" in err and len(err.strip().splitlines()) == 1


SCRIPTS = {"s1_train.py", "s2_train.py", "s3_infer.py", "s4_kernels.py", "s5_serve.py"}
SCRIPTS |= {"s6_memory.py", "s7_engine.py"}


def library_sources():
    """(path, syntax tree) of every module below the session scripts: sessions/
    but for the session scripts and cli.py, the one module that reads the flags."""
    root = os.path.join(REPO, "sessions")
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, REPO)
            if name.endswith(".py") and name not in SCRIPTS and relative != "sessions/run/cli.py":
                with open(path) as f:
                    yield relative, ast.parse(f.read(), relative)


def test_library_code_takes_configs_not_the_flags():
    """Below the scripts no function takes `args` (argparse's Namespace; *args is
    not one) and no module reads a flag by name with getattr(args, ...): the
    scripts and cli turn flags into configs and pass those down."""
    found = []
    for path, tree in library_sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                named = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                if "args" in named:
                    found.append(f"{path}:{node.lineno}: a parameter named args")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "args"
            ):
                found.append(f"{path}:{node.lineno}: getattr(args, ...)")
    assert len(list(library_sources())) > 30  # the walk found the modules
    assert not found, "\n".join(found)


def test_resolve_reads_each_flag_by_name_and_a_missing_one_is_loud():
    """A flag a command lacks is an error naming it, not a setting quietly not given;
    and resolve reads no flag through getattr with a default."""
    args = train_flags(["--preset", "tiny"])
    assert resolve(args, platform="cpu").train.eval_every == PRESETS["tiny"].train.eval_every
    del args.eval_every
    with pytest.raises(TypeError, match="eval_every"):
        resolve(args, platform="cpu")
    with open(os.path.join(REPO, "sessions", "run", "cli.py")) as f:
        tree = ast.parse(f.read())
    defaults = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 3
    ]
    assert not defaults, f"getattr with a default at cli.py lines {defaults}"

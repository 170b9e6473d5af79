"""What the tests share: paths, child processes, scripts run in this process,
hand counts, and the compile-only targets' skip.

conftest.py sets the environment up before JAX starts and holds the fixtures;
everything a test file imports comes from here, never from conftest or from
another test file.
"""

import contextlib
import dataclasses
import io
import math
import os
import re
import runpy
import subprocess
import sys
from typing import NamedTuple

import pytest
from jax.ad_checkpoint import print_saved_residuals

from roofline.plan.targets import EXTRAS, missing_extras
from scripts.harness import simulated_cpu_flags
from sessions.model.config import PRESETS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable

# The steps of the suite's tiny-preset training on the 8 devices of the test process,
# wherever a test needs no other number: s2_train.py's runs (tests/test_cli.py,
# test_train.py, test_checkpoint.py) and test_multichip.py's steps by hand, as
# test_manual_fsdp.py's and test_profile_script.py's 4. The steps are a constant of the
# compiled step (its learning-rate schedule), so with one number the step one test
# compiles for a mesh is read back from the suite's compile cache (tests/conftest.py)
# by the others, whichever file runs first.
TINY_STEPS = 4
# The decode kernels' two test shapes: GPT-2's on bytes in bf16, and session 3's 1.2B
# (s3_infer.py --embed 2048 --ff 8192 --heads 16 --head-dim 128 --layers 24, docs/h100-run).
GPT2_BF16 = dataclasses.replace(PRESETS["gpt2-bytes"].model, dtype="bfloat16")
BIG = dataclasses.replace(GPT2_BF16, embed=2048, ff=8192, heads=16, head_dim=128, layers=24)


def subprocess_env(devices=1):
    """Environment for a child process with `devices` simulated CPU devices, and the
    suite's other XLA flags (tests/conftest.py)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = simulated_cpu_flags(devices, env.get("XLA_FLAGS"))
    env["JAX_PLATFORMS"] = "cpu"
    return env


# With requirements-aot.txt installed, importing jax loads the CUDA plugin, whose
# driver stub logs two lines on a machine with no GPU, before the program says a word:
# absl's "WARNING: All log messages before absl::InitializeLog() ..." and an I-line
# from cudart_stub.cc. Not ours, and nothing a flag turns off; checks of what our
# programs print look past them.
PLUGIN_NOISE = ("All log messages before absl::InitializeLog()", "cudart_stub.cc:")


def without_plugin_noise(text):
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not any(noise in line for noise in PLUGIN_NOISE)
    )


def run_python(*args, devices=1):
    """`python ARGS` from the repo root in a fresh process; its output captured
    (stderr without the CUDA plugin's start-up lines)."""
    result = subprocess.run(
        [PYTHON, *args],
        cwd=REPO,
        env=subprocess_env(devices),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result.stderr = without_plugin_noise(result.stderr)
    return result


class Ran(NamedTuple):
    code: object  # what the script passed to sys.exit
    out: str
    err: str


def run_script(script, argv, capsys):
    """`python SCRIPT ARGV` in this process (8 simulated devices, no process
    start-up): the file run as __main__, as the command line runs it, never
    imported as a library. Its exit status is what it passed to sys.exit
    (argparse's own errors included); a script that ends without sys.exit
    fails the test. What it printed comes from capsys."""
    path = os.path.join(REPO, script)
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code
    else:
        pytest.fail(f"{script} ended without sys.exit(...)")
    finally:
        sys.argv = saved
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def roofline_command(argv):
    """`python -m roofline ARGV` in this process: the package's __main__ run as the
    command line runs it, its exit status returned (argparse's own errors
    included); what it printed stays with pytest's capture (capsys)."""
    saved = sys.argv
    sys.argv = ["roofline", *argv]
    try:
        runpy.run_module("roofline", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = saved
    pytest.fail("python -m roofline ended without sys.exit(...)")


def s2_in_process(argv, capsys):
    """sessions/s2_train.py ARGV in this process: (exit status, what it wrote to stderr)."""
    code, _, err = run_script("sessions/s2_train.py", argv, capsys)
    return code, err


def s3_in_process(argv, capsys):
    """sessions/s3_infer.py ARGV in this process: (exit status, stdout, stderr)."""
    return tuple(run_script("sessions/s3_infer.py", argv, capsys))


def need(platform):
    """Skip (or, in CI, fail) unless this machine can compile for platform."""
    missing = missing_extras(platform)
    if missing:
        message = f"{missing} not installed: pip install -r {EXTRAS}"
        if os.environ.get("HPLLM_REQUIRE_AOT"):
            pytest.fail(message)
        pytest.skip(message)


def hand_params(cfg):
    """P written out: the embedding [V, E] (tied to the output), the positional
    table [S, E], the final norm [E], and per layer two norms [E], q, k, v
    [E, H, D], o [H, D, E], and the MLP's [E, F] and [F, E]."""
    V, E, F, H, D, L, S = cfg.vocab, cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.seq
    return V * E + S * E + E + L * (E + E + 4 * E * H * D + 2 * E * F)


def hand_flops(cfg, B):
    """The training step written out, per the course: each matmul costs 2 FLOPs
    per weight per token forward and twice that backward (6 in all); the matmuls
    are, per layer, q, k, v, o (E·H·D weights each) and the MLP's two (E·F
    each), and the tied output projection (V·E); the embedding lookup costs
    nothing. Attention per layer, forward: q·k and probs·v, 2·B·S·S·H·D each,
    and its backward twice that."""
    V, E, F, H, D, L, S = cfg.vocab, cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.seq
    tokens = B * S
    matmuls = 6 * tokens * (L * (4 * E * H * D + 2 * E * F) + V * E)
    attention = 3 * L * (2 * 2 * B * S * S * H * D)
    return matmuls, attention


def residual_values(fn, *args):
    """Values a token among the residuals jax.ad_checkpoint.print_saved_residuals lists
    for fn, at 2 sequences of 16: those whose leading axes are the batch and sequence
    ([2, 16, ...]) or both flattened ([32, ...]); the weights and constants aside."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(fn, *args)
    total = 0
    for shape in re.findall(r"^\w+\[([\d,]*)\]", printed.getvalue(), re.M):
        dims = [int(d) for d in shape.split(",") if d]
        if dims[:2] == [2, 16]:
            total += math.prod(dims[2:])
        elif dims[:1] == [32]:
            total += math.prod(dims[1:])
    return total

"""Every test sees 8 simulated CPU devices, so sharding runs here as on a pod.

The flag must be set before JAX starts, hence here, before any test imports it.
Tests that need one device build a one-device mesh or run a subprocess.
"""

import os
import subprocess
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest

from sessions.config import ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable


@pytest.fixture(scope="session")
def cfg():
    """Sizes that differ pairwise, so a swapped axis cannot go unnoticed:
    B=2 (in tests), S=6..16, E=24, F=40, H=3, D=8, V=256."""
    return ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=16)


@pytest.fixture(scope="session")
def key():
    return jax.random.key(0)


def subprocess_env(devices=1):
    """Environment for a child process with `devices` simulated CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
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


def s2_in_process(argv, capsys):
    """s2_train's entry point in this process (8 simulated devices):
    (exit status, what it wrote to stderr)."""
    from sessions import s2_train

    try:
        code = s2_train.cli(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    return code, capsys.readouterr().err

"""Chips this machine lacks: their figures, `--target` parsed, compile-only
devices, and `s2_train.py --target` on the command line (its report, its
summary, its one-line errors).

Tests that need the compilers skip without them, naming the file that installs
them; CI installs it and sets HPLLM_REQUIRE_AOT=1, which turns those skips into
failures. The step plans themselves are checked in tests/test_step_plans.py.
"""

import dataclasses
import json
import math

import jax
import pytest
from helpers import need, run_script, s2_in_process

from roofline.flops import param_count, train_flops
from roofline.hardware import CHIPS
from roofline.plan.targets import TargetError, parse_target
from sessions.errors import UsageError
from sessions.model import init_params
from sessions.model.config import ModelConfig
from sessions.plan import programs

# Chips and targets, with or without the compilers.


def test_float32_peak_is_the_precision_the_matmuls_run_at():
    h100 = CHIPS["h100"]
    # NVIDIA's datasheet: TF32 494.5 TFLOP/s dense, FP32 67; JAX's default precision
    # runs float32 matmuls as TF32 on Ampere and newer.
    assert h100.peak("float32") == 494.5e12
    assert h100.peak("float32", "highest") == 67e12
    assert h100.peak("bfloat16") == 989e12
    assert CHIPS["tpu-v5e"].peak("float32") == 197e12  # bf16 passes on a TPU


def test_targets_parse_and_default_to_one_host():
    assert parse_target("tpu-v5e:2x4")[1] == "2x4"
    assert parse_target("tpu-v5e")[1] == "2x4"  # one v5e host: 8 chips
    assert parse_target("h100")[1] == "8"
    assert parse_target("H100:1")[0] is CHIPS["h100-sxm"]
    for bad in ("tpu-v9", "h100:x", "tpu-v5e:8", "local", "h100:0"):
        with pytest.raises(TargetError):
            parse_target(bad)


def test_missing_compilers_name_the_file(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(UsageError, match=r"libtpu.*pip install -r requirements-aot\.txt"):
        programs.devices_for("tpu-v5e:2x2")
    with pytest.raises(UsageError, match=r"requirements-aot\.txt"):
        programs.devices_for("h100:8")


def test_param_count_formula_equals_the_params_built(cfg):
    for c in (
        cfg,
        dataclasses.replace(cfg, attention=False),
        dataclasses.replace(cfg, positions=False),
    ):
        built = jax.eval_shape(lambda k, c=c: init_params(c, k), jax.random.key(0))
        assert param_count(c) == sum(math.prod(x.shape) for x in jax.tree.leaves(built))


def test_a_step_too_big_for_the_chip_exits_2_with_what_to_try(capsys):
    need("tpu")
    # 2.1e9 parameters, replicated by data=4: weights and Adam's two moments alone
    # take 25 GB a chip, more than a v5e's 16 GB. In this process, as the command line
    # runs it (a traceback would end the test with the exception, not exit 2).
    argv = ["--preset", "tiny", "--embed", "8192", "--ff", "65536", "--layers", "2"]
    code, _, err = run_script(
        "sessions/s2_train.py", [*argv, "--target", "tpu-v5e:2x2", "--mesh", "data=4"], capsys
    )
    assert code == 2, err[-2000:]
    error = err.strip().splitlines()[-1]
    assert error.startswith("error: the step does not fit on tpu-v5e:2x2")
    assert "--batch" in error and "fsdp" in error and "Traceback" not in err


@pytest.mark.parametrize(
    "target, platform, devices, hbm",
    [
        ("h100:8", "gpu", 8, 80 * 2**30),  # NVIDIA's datasheet: "80GB", 80 GiB
        ("tpu-v5e:2x4", "tpu", 8, 16e9),  # Google's v5e page: 16 GB a chip
    ],
)
def test_target_cli_prints_the_report_and_writes_the_summary(
    target, platform, devices, hbm, tmp_path, capsys
):
    need(platform)
    out = tmp_path / "summary.json"
    argv = ["--preset", "tiny", "--target", target, "--summary-out", str(out)]
    code, printed, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    for heading in (
        "memory per device",
        "FLOPs per device",
        "collectives",
        "custom kernels",
        "compute-bound",
        "memory-bound",
        "communication",
        "best case",
    ):
        assert heading in printed
    summary = json.loads(out.read_text())
    for key in (
        "target",
        "devices",
        "mesh",
        "exact_flops_per_device",
        "xla_flops_per_device",
        "memory_per_device_bytes",
        "hbm_bytes_per_device",
        "fits",
        "collectives",
        "kernels",
        "predicted_step_seconds",
        "predicted_tokens_per_sec",
    ):
        assert key in summary, key
    assert summary["devices"] == devices
    assert summary["mesh"] == {"data": 1, "fsdp": devices, "tp": 1}
    assert (
        summary["exact_flops_per_device"]
        == train_flops(ModelConfig(embed=48, ff=96, heads=4, head_dim=12, layers=2, seq=64), 16)
        / devices
    )
    assert summary["hbm_bytes_per_device"] == hbm
    assert summary["fits"] and summary["memory_per_device_bytes"] < hbm
    assert set(summary["collectives"]) >= {"all-gather"}
    tokens = 16 * 64
    assert summary["predicted_tokens_per_sec"] == pytest.approx(
        tokens / summary["predicted_step_seconds"]
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "tpu-v9"], "unknown chip"),
        (["--target", "h100:8", "--mesh", "fsdp=4"], "8 are present"),
        (["--target", "h100:x"], "GPU count"),
    ],
)
def test_bad_targets_are_one_line_and_exit_2(argv, message, capsys):
    if "h100:8" in argv:
        need("gpu")
    code, err = s2_in_process(["--preset", "tiny", *argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_tpu_topology_the_compiler_refuses_is_one_line():
    need("tpu")
    with pytest.raises(UsageError, match="3x3"):
        programs.devices_for("tpu-v5e:3x3")

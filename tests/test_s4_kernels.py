"""sessions/s4_kernels.py tells session 4's story: each equality it prints holds."""

import jax
import jax.numpy as jnp
import pytest
from hardware_fakes import FakeDevice
from helpers import run_script

from roofline.targets import local_target
from sessions import aot
from sessions.precision import exact_and_tolerance


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


# Checks that hold on every chip (sessions/precision.py), and step 5 on the chip itself.


def test_a_chip_that_rounds_its_matmuls_gets_a_tolerance_from_that_rounding(monkeypatch):
    """A stand-in for a GPU: its reference comes out 2^-11 (TF32's unit roundoff)
    off unless computed at precision HIGHEST. The tolerance is 4 x that; float32's
    floor stands where it is larger; a CPU's own reference moves by nothing."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")

    def on_a_gpu():
        at_highest = jax.config.jax_default_matmul_precision == "highest"
        return jnp.float32(1.0) if at_highest else jnp.float32(1.0 + 2.0**-11)

    r = exact_and_tolerance(on_a_gpu, 1e-5)
    assert float(r.exact) == 1.0 and r.tolerance == pytest.approx(4 * 2.0**-11)
    assert "run in tf32, which moves the reference by 4.9e-04: tolerance 2.0e-03" in r.line
    assert exact_and_tolerance(on_a_gpu, 0.01).tolerance == 0.01
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    r = exact_and_tolerance(lambda: jnp.ones(3) @ jnp.ones(3), 1e-5)
    assert (float(r.exact), r.tolerance) == (3.0, 1e-5) and "as the reference" in r.line


def test_the_reference_is_lowered_at_precision_highest():
    """What the compiler is given: the reference's matmul asks for HIGHEST, the
    second call (the chip's default, to measure its rounding) does not."""
    x = jnp.ones((8, 8))
    lowered = []

    def reference():
        lowered.append(jax.jit(jnp.matmul).lower(x, x).as_text())
        return x @ x

    exact_and_tolerance(reference, 1e-5)
    assert "precision = [HIGHEST, HIGHEST]" in lowered[0]
    assert "HIGHEST" not in lowered[1]


H100 = "NVIDIA H100 80GB HBM3"


def test_a_chip_compiles_its_own_tables_without_the_chip_compilers(monkeypatch, capsys):
    gpus = [FakeDevice("gpu", H100, "9.0", id=i) for i in range(2)]
    target, devices = local_target("h100:2", gpus)
    assert (target.name, target.devices, devices) == ("h100-sxm:2", 2, gpus)
    assert local_target("h100:4", gpus) is None  # more than this machine holds
    assert local_target("a100-80gb:1", gpus) is None  # another chip
    v5e = [FakeDevice("tpu", "TPU v5 lite", id=i) for i in range(4)]
    assert local_target("tpu-v5e:2x2", v5e)[0].name == "tpu-v5e:2x2"
    # s4_kernels.py's step 5 on an H100 whose machine lacks the chip compilers:
    monkeypatch.setattr(aot, "unseen_accelerator", lambda: ("nvidia", "/dev/nvidia0"))
    monkeypatch.setattr(aot, "missing_extras", lambda platform: "the NVIDIA compiler")
    monkeypatch.setattr(jax, "devices", lambda *a: gpus)
    target, devices = aot.devices_to_plan_on("h100:1")
    assert (target.name, devices) == ("h100-sxm:1", gpus[:1])
    assert aot.devices_to_plan_on("a100-80gb:1") is None  # not this chip: the compilers
    assert "pip install -r requirements-aot.txt" in capsys.readouterr().out

"""sessions/s4_kernels.py tells session 4's story: each equality it prints holds."""

import argparse
import dataclasses
import functools
import os
import re
import runpy

import jax
import pytest
from hardware_fakes import FakeDevice, rounded_matmuls, to_bf16, to_tf32
from helpers import REPO, run_script

from roofline.plan.targets import local_target
from sessions.kernels import flash, precision
from sessions.model.attention import einsum_attention
from sessions.model.config import PRESETS
from sessions.plan import programs

H100 = "NVIDIA H100 80GB HBM3"
SCRIPT = "sessions/s4_kernels.py"


@pytest.fixture(scope="module")
def s4():
    """The script's functions, its main not run."""
    return runpy.run_path(os.path.join(REPO, SCRIPT))


def test_every_check_holds_and_is_printed(capsys, monkeypatch):
    references = []  # what the script compiles at precision HIGHEST

    def recorded(f, *args):
        references.append(getattr(f, "func", f).__name__)
        return exact(f, *args)

    exact = precision.exact
    monkeypatch.setattr(precision, "exact", recorded)
    # Step 3 trains the tiny preset both ways; one layer of it shows manual == auto as two
    # do (tests/test_manual_fsdp.py trains both layers) and compiles in less time.
    tiny = PRESETS["tiny"]
    one_layer = dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, layers=1))
    monkeypatch.setitem(PRESETS, "tiny", one_layer)
    argv = ["--no-target", "--seq", "40", "--fsdp-steps", "2"]
    code, out, err = run_script(SCRIPT, argv, capsys)
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
    # Both references in float32 (and the online softmax, checked as an idea);
    # on a CPU float32's own tolerances, as before any chip rounded.
    assert references == ["softmax_reference", "online_softmax", "attention_and_grads"]
    assert (
        "float32 matmuls on cpu: u = 0, no coarser than the reference" in out
        and "2u(1 +" not in out
    )
    tolerances = re.findall(r"(?:ok  |FAIL) (.*?):.*\(within (.*)\)", out)[:5]
    assert [float(t) for _, t in tolerances] == [1e-5, 1e-4, 1e-3, 1e-3, 1e-3]
    # The two FSDP programs side by side: ours reduce-scatters, the partitioner's does not.
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("reduce-scatter")]
    assert len(rows) == 2 and all(int(r[1]) > 0 and int(r[5]) == 0 for r in rows)


def test_a_failed_check_fails_the_run(capsys, monkeypatch):
    """Manual FSDP drifting from the partitioner's (faked here, so no step compiles),
    and our kernel's output off by 2e-4, past float32's 1e-4 (its gradients are
    not: a constant added to the output changes none): FAIL printed for both,
    the other checks still run, exit status 1."""
    from sessions.train import manual_fsdp

    def drifting(mesh_text, steps, devices):
        return {"auto": ([6.29, 6.22], ""), "manual": ([6.29, 6.23], "")}

    kernel = flash.flash_attention
    monkeypatch.setattr(manual_fsdp, "train_both_ways", drifting)
    monkeypatch.setattr(flash, "flash_attention", lambda q, k, v: kernel(q, k, v) + 2e-4)
    argv = ["--no-target", "--seq", "40", "--fsdp-steps", "2"]
    code, out, _ = run_script(SCRIPT, argv, capsys)
    assert code == 1 and "FAIL manual == auto, step for step (relative)" in out
    assert "FAIL forward == einsum attention: largest difference 2.0" in out
    assert "ok   dq == einsum attention's" in out
    assert "ok   ring of ppermutes == all-gather, then matmul" in out
    assert out.rstrip().endswith("a check failed: see FAIL above")


# Checks that hold on every chip (sessions/kernels/precision.py), and step 5 on the chip itself.


def test_each_chip_s_matmul_precision_and_tolerances_by_hand():
    """Significand bits, the implicit one counted: float32 24, TF32 11, bf16 8."""
    h100, t4 = FakeDevice("gpu", H100, "9.0"), FakeDevice("gpu", "Tesla T4", "7.5")
    v5e, cpu = FakeDevice("tpu", "TPU v5 lite"), jax.devices("cpu")[0]
    found = [precision.default_matmul_precision(d) for d in (h100, t4, v5e, cpu)]
    assert [(p.name, p.unit_roundoff) for p in found] == [
        ("TF32", 1 / 2048),  # Ampere on: the tensor cores take TF32
        ("float32", 1 / 2**24),  # a T4 has no TF32
        ("bf16", 1 / 256),
        ("float32", 1 / 2**24),
    ]
    with jax.default_matmul_precision("highest"):
        assert precision.default_matmul_precision(h100) == precision.FLOAT32
    # What ours adds to the reference's rounding, sums of 64 products: the inputs'
    # u, and on any chip but a CPU sqrt(64)·2^-24 = 2^-21 for summing in its own order.
    added = [precision.roundoff(p, 64, d) for p, d in zip(found, (h100, t4, v5e, cpu))]
    assert added == [2**-11 + 2**-21, 2**-21, 2**-8 + 2**-21, 0.0]
    # Scores up to 4, values up to 2, float32's floor 1e-4: 1e-4 + 2u(1 + 4)2 = 1e-4 + 20u.
    assert precision.attention_tolerance(2**-11, 4.0, 2.0, 1e-4) == pytest.approx(0.009865625)
    assert precision.attention_tolerance(2**-8, 4.0, 2.0, 1e-4) == pytest.approx(0.078225)
    assert precision.attention_tolerance(0.0, 4.0, 2.0, 1e-4) == 1e-4  # a CPU's


def test_the_references_are_compiled_at_precision_highest(s4):
    """Read from the compiled programs: every dot of both references asks for
    float32, HIGHEST. Attention and its gradients take 6 matmuls (q k^T and p v
    forward; dp = do v^T, dv = p^T do, dq = ds k, dk = ds^T q backward), the
    softmax reference 2. At the chip's default the compiler is told none."""
    q, k, v, dout = jax.random.normal(jax.random.key(0), (4, 1, 24, 2, 64))
    for f, args, dots in [
        (s4["softmax_reference"], (q[0, :, 0], k[0, :, 0], v[0, :, 0]), 2),
        (functools.partial(s4["attention_and_grads"], einsum_attention), (q, k, v, dout), 6),
    ]:
        compiled = precision.lowered_exactly(f, *args).compile().as_text()
        assert precision.dot_precisions(compiled) == ["{highest,highest}"] * dots
        default = jax.jit(f).lower(*args).compile().as_text()
        assert precision.dot_precisions(default) == ["default"] * dots


@pytest.mark.parametrize(
    "device, rounding, line",
    [
        (FakeDevice("gpu", H100, "9.0"), to_tf32, "TF32 matmuls on gpu: u = 2^-11 + sqrt(64)"),
        (FakeDevice("tpu", "TPU v5 lite"), to_bf16, "bf16 matmuls on tpu: u = 2^-8 + sqrt(64)"),
    ],
    ids=["h100-tf32", "tpu-bf16"],
)
def test_every_kernel_check_holds_at_a_chips_rounding(
    s4, monkeypatch, capsys, device, rounding, line
):
    """Our kernel, its matmuls rounded as the chip rounds them (tests/hardware_fakes.py),
    against the float32 reference: each check holds within the tolerance derived
    for that chip, though the rounding moves each value far past float32's. S =
    200: two key blocks of 128, so the forward rescales what it has kept."""
    monkeypatch.setattr(jax, "devices", lambda *a: [device])
    args = argparse.Namespace(batch=1, seq=200, heads=1, head_dim=64)
    with rounded_matmuls(monkeypatch, rounding):
        held = s4["check_online_softmax"](jax.random.key(0))
        held &= s4["check_kernel"](args, jax.random.key(1))
    out = capsys.readouterr().out
    assert line in out and "tolerance 1e-04 + 2u(1 + " in out
    # The online softmax is checked in float32 on every chip; the chip's own rounding
    # of it is shown, not checked: scores up to 75 here, far from float32's 1e-5.
    rounded = re.search(r"at this chip's default, \w+ matmuls: (.*) from softmax", out)
    assert "ok   online softmax == softmax" in out and float(rounded[1]) > 1e-3
    found = re.findall(r"(ok  |FAIL) (.*?): largest difference (.*) \(within (.*)\)", out)
    assert [mark for mark, *_ in found] == ["ok  "] * 5 and held, out
    # The rounding really acted: each value of the kernel's moved 100x what
    # float32's rounding moves it.
    assert all(float(error) > 1e-4 for *_, error, _ in found[1:])


def test_a_chip_compiles_its_own_tables_without_the_chip_compilers(monkeypatch, capsys):
    gpus = [FakeDevice("gpu", H100, "9.0", id=i) for i in range(2)]
    target, devices = local_target("h100:2", gpus)
    assert (target.name, target.devices, devices) == ("h100-sxm:2", 2, gpus)
    assert local_target("h100:4", gpus) is None  # more than this machine holds
    assert local_target("a100-80gb:1", gpus) is None  # another chip
    v5e = [FakeDevice("tpu", "TPU v5 lite", id=i) for i in range(4)]
    assert local_target("tpu-v5e:2x2", v5e)[0].name == "tpu-v5e:2x2"
    # s4_kernels.py's step 5 on an H100 whose machine lacks the chip compilers:
    monkeypatch.setattr(programs, "unseen_accelerator", lambda: ("nvidia", "/dev/nvidia0"))
    monkeypatch.setattr(programs, "missing_extras", lambda platform: "the NVIDIA compiler")
    monkeypatch.setattr(jax, "devices", lambda *a: gpus)
    target, devices = programs.devices_to_plan_on("h100:1")
    assert (target.name, devices) == ("h100-sxm:1", gpus[:1])
    assert programs.devices_to_plan_on("a100-80gb:1") is None  # not this chip: the compilers
    assert "pip install -r requirements-aot.txt" in capsys.readouterr().out
    # With the compilers: another chip's compiler beside this one; this chip still its own.
    monkeypatch.setattr(programs, "missing_extras", lambda platform: None)
    monkeypatch.setattr(programs, "compile_only_devices", lambda text: ("compile-only", text))
    assert programs.devices_to_plan_on("a100-80gb:1") == ("compile-only", "a100-80gb:1")
    assert programs.devices_to_plan_on("h100:2")[1] == gpus
    # No accelerator on this machine: as before, whatever jax.devices() says.
    monkeypatch.setattr(programs, "unseen_accelerator", lambda: None)
    monkeypatch.setattr(programs, "devices_for", lambda text: ("deviceless", text))
    assert programs.devices_to_plan_on("h100:1") == ("deviceless", "h100:1")


def test_step_6_says_the_decode_kernels_compile_times_beside_xla_s(s4, monkeypatch, capsys):
    """Step 6 on a GPU target: GPT-2's decode with ours (stand-ins: 30 s) beside XLA's (6 s),
    5.0x, measured on this machine; a kernel that gave no answer said so."""
    from types import SimpleNamespace

    from sessions.plan import kernels_on_target
    from sessions.plan.kernels_on_target import Attempt

    asked = []

    def compile_kernels(cfg, batch, target, devices, seconds=None):
        asked.append((cfg.embed, cfg.layers, cfg.dtype, batch))
        return [
            Attempt("attention", "a.py", "no answer", "given up after 120 s", None),
            Attempt("head", "h.py", "compiled", "", 0.5),
            Attempt("XLA's", "XLA's decode", "compiled", "", 6.0),
            Attempt("ours", "the whole decode", "compiled", "", 30.0),
        ]

    monkeypatch.setattr(kernels_on_target, "compile_kernels", compile_kernels)
    s4["decode_compile_times"](SimpleNamespace(name="h100-sxm:1"), ["h100"])
    lines = capsys.readouterr().out.splitlines()
    gpt2 = PRESETS["gpt2-bytes"].model
    assert asked == [(gpt2.embed, gpt2.layers, "bfloat16", 1)]
    assert lines[0].startswith("6. our decode kernels compiled for h100-sxm:1, gpt2-bytes")
    assert lines[1].startswith(
        "   compiled for h100-sxm:1 in 6.0 s (XLA's decode) and 30.0 s (ours, 5.0x); measured on "
    )
    assert lines[1].endswith(f"JAX {jax.__version__}")
    assert lines[2] == "   ours, each kernel alone: attention no answer, head 0.5 s"

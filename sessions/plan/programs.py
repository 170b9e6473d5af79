"""Compile from shapes alone, for this machine or for a chip it lacks.

A compiled program is what the chip would run: XLA's memory plan, its FLOP
count, the collectives the partitioner inserted and the kernels it chose can
all be read off it (roofline/compiled/program.py) before anyone rents the chip.
Nothing is executed and no array is ever allocated: the inputs are
`jax.ShapeDtypeStruct`s carrying their shardings, built where the session
scripts build theirs (sessions/train/step.py, sessions/inference/shapes.py).
sessions/plan/train_on_target.py and infer_on_target.py plan training and
inference on such a chip (`--target CHIP[:SHAPE]`).
"""

import json
import os
import time

import jax
import numpy as np

from roofline.compiled.program import cost_analysis
from roofline.plan.targets import (
    EXTRAS,
    TargetError,
    compile_only_devices,
    local_target,
    missing_extras,
    parse_target,
)
from sessions.errors import UsageError
from sessions.run.accelerator import unseen_accelerator
from sessions.shard import sharding
from sessions.train.manual_fsdp import make_manual_step
from sessions.train.step import abstract_batch, abstract_state, make_train_step

DECODE_ROWS = (1, 4, 16, 64)  # decode's default batches, per data x fsdp group of devices


def devices_for(target_text):
    """(Target, compile-only devices); a target this machine cannot reach is a UsageError.

    This machine's own backend is then only needed for shapes and a CPU count,
    so it is pinned to the CPU before JAX starts one: otherwise, with the chip
    compilers installed, JAX would first try to start a TPU and a GPU it lacks,
    and say so at length."""
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    try:
        return compile_only_devices(target_text)
    except TargetError as e:
        raise UsageError(f"--target {target_text}: {e}") from None


def devices_to_plan_on(target_text, say=print):
    """(Target, devices) to compile for the chip `target_text` names beside a
    run on this machine: its own devices when they are that chip (a chip
    compiles for itself: no chip compilers needed); else compile-only ones,
    found before JAX starts a backend where this machine has no accelerator
    (devices_for keeps it to the CPU). None, said on one line, where neither
    can be had: the chip compilers are missing, or refuse beside this chip."""
    chip, _ = parse_target(target_text)
    if unseen_accelerator() is not None:  # a GPU or TPU here: it may be the target
        here = local_target(target_text, jax.devices())
        if here is not None:
            return here
    if missing_extras(chip.platform):
        say(f"(no table for {target_text}: its chip compilers: pip install -r {EXTRAS})")
        return None
    if unseen_accelerator() is None:
        return devices_for(target_text)
    try:  # this machine's chip runs the session; the target's compiler beside it
        return compile_only_devices(target_text)
    except Exception as e:
        say(f"(no table for {target_text} beside this machine's chip: {e})")
        return None


def write_plan(planned, hlo_out, summary_out):
    """--target's outputs, each path None when not asked for: the compiled program
    (planned.compiled, to read) to hlo_out and planned.summary (JSON) to summary_out,
    written first; then a plan that does not fit is a UsageError (exit 2). Returns
    the exit status otherwise, 0."""
    if hlo_out and planned.compiled is not None:
        with open(hlo_out, "w") as f:
            f.write(planned.compiled.as_text())
    if summary_out:
        with open(summary_out, "w") as f:
            json.dump(planned.summary, f, indent=1)
    if "error" in planned.summary:
        raise UsageError(planned.summary["error"])
    return 0


def target_mesh(mesh_text, target, devices):
    """(axis sizes, Mesh) over a target's compile-only devices."""
    try:
        sizes = sharding.parse_mesh(mesh_text, len(devices))
    except UsageError as e:
        raise UsageError(f"{e} (--target {target.name})") from None
    return sizes, sharding.make_mesh(sizes, devices=np.array(devices))


def train_step_program(cfg, tc, mesh, collectives="auto"):
    """(step, (abstract state, abstract batch), {}): the train step as s2_train.py
    jits it over `mesh` (--collectives auto or manual), with its shardings, and the
    shapes it is compiled for."""
    optimizer, _, state = abstract_state(cfg, tc, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    rows = sharding.batch_sharding(mesh)
    if collectives == "manual":
        step = make_manual_step(cfg, optimizer, tc.clip, shardings, rows, accum=tc.accum)
    else:
        step = make_train_step(
            cfg, optimizer, state_shardings=shardings, batch_sharding=rows, accum=tc.accum,
            offload=tc.offload,
        )  # fmt: skip
    return step, (state, abstract_batch(tc.batch, cfg.seq, rows)), {}


def one_device_mesh():
    return sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=jax.devices()[:1])


def count_on_this_cpu(program_for):
    """XLA's FLOP count of fn(*inputs, **static) lowered for one device of this CPU,
    before optimisation, with program_for(mesh) -> (fn, inputs, static): for a target
    whose compiler gives no count (NVIDIA, deviceless), or hides FLOPs in a kernel."""
    mesh = one_device_mesh()
    fn, inputs, static = program_for(mesh)
    with jax.set_mesh(mesh):
        return float(cost_analysis(fn.lower(*inputs, **static))["flops"])


def compiler_needs(error):
    """The compiler's out-of-memory error, from what it says it needed, on one line."""
    needed = " ".join(str(error).split())
    for marker in ("total memory required", "Ran out of memory"):
        if marker in needed:
            return needed[needed.index(marker) :][:200].rstrip(". ")
    return needed


def compile_for(lowered, chip, say):
    """lowered.compile(), with one known detour on NVIDIA targets.

    Compiling deviceless, XLA cannot autotune its Triton matmul tiles on a GPU,
    and for some small shapes (E=48, say) its default tiling finds none and
    gives up; then the matmuls are left to cuBLAS, as a real GPU may also
    choose, and the header says so."""
    try:
        return lowered.compile()
    except Exception as e:
        if chip.platform != "gpu" or "tile sizes" not in str(e):
            raise
    say(
        "matmuls: XLA's Triton tiling found no tiles for these shapes without a GPU to "
        "autotune on; compiled with cuBLAS matmuls instead (xla_gpu_enable_triton_gemm=false)"
    )
    return lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False})


def compile_or_oom(fn, inputs, static, mesh, chip, say):
    """(compiled or None, the compiler's out-of-memory verdict or None, seconds)."""
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = fn.lower(*inputs, **static)
        try:
            compiled, oom = compile_for(lowered, chip, say), None
        except Exception as e:  # XlaRuntimeError: the compiler's verdict
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
            compiled, oom = None, compiler_needs(e)
    return compiled, oom, time.perf_counter() - start

"""Compile the training step ahead of time, from shapes alone: for this machine,
or for a chip it lacks (`s2_train.py --target CHIP[:SHAPE]`).

A compiled step is what the chip would run: XLA's memory plan, its FLOP count,
the collectives the partitioner inserted and the kernels it chose can all be
read off it (roofline/program.py) before anyone rents the chip. Nothing is
executed and no array is ever allocated: the state is `jax.ShapeDtypeStruct`s
carrying their shardings, exactly as s2_train.py builds it for real.
"""

import dataclasses
import functools
import os
import time
from typing import NamedTuple

import jax
import numpy as np

from roofline.flops import param_count
from roofline.plan import plan, plan_lines, plan_summary
from roofline.program import read_program
from roofline.targets import TargetError, compile_only_devices
from sessions import sharding
from sessions.attention import KERNEL_PLATFORM
from sessions.config import UsageError
from sessions.train import init_state, make_optimizer, make_train_step


def abstract_step(cfg, tc, mesh):
    """(step function, abstract state, abstract batch) for `mesh`: the jitted
    train step with its shardings, and the shapes it is compiled for."""
    optimizer = make_optimizer(tc, tc.steps)
    init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
    key = jax.random.key(tc.seed)  # a concrete key on this machine: only its shape is used
    with jax.set_mesh(mesh):
        state = sharding.abstract_sharded(init, key, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    batch_sharding = sharding.batch_sharding(mesh)
    tokens = jax.ShapeDtypeStruct((tc.batch, cfg.seq), np.int32, sharding=batch_sharding)
    step = make_train_step(
        cfg, optimizer, state_shardings=shardings, batch_sharding=batch_sharding
    )
    return step, state, {"inputs": tokens, "targets": tokens}


def one_device_mesh():
    return sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=jax.devices()[:1])


def compile_train_step(cfg, tc):
    """The training step compiled for one device of this machine: what XLA's
    cost analysis is asked about (scripts/profile_s2.py)."""
    mesh = one_device_mesh()
    step, state, batch = abstract_step(cfg, tc, mesh)
    with jax.set_mesh(mesh):
        return step.lower(state, batch).compile()


def count_before_optimisation(cfg, tc):
    """XLA's FLOP count of the whole step before any target's optimisation: the
    program lowered for this CPU, unpartitioned, attention as einsums (a
    custom kernel's FLOPs are invisible to the count)."""
    cfg = dataclasses.replace(cfg, attention_impl="einsum")
    mesh = one_device_mesh()
    step, state, batch = abstract_step(cfg, tc, mesh)
    with jax.set_mesh(mesh):
        cost = step.lower(state, batch).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


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
        raise UsageError(str(e)) from None


def too_big(error, target, tc, sizes):
    """The compiler's out-of-memory error as one line with what to try."""
    needed = " ".join(str(error).split())
    for marker in ("total memory required", "Ran out of memory"):
        if marker in needed:
            needed = needed[needed.index(marker):][:200].rstrip(". ")
            break
    tries = [f"a smaller --batch (now {tc.batch})"]
    if sizes["fsdp"] < target.devices:
        tries.append("a larger fsdp axis in --mesh")
    tries.append("a bigger slice")
    return UsageError(
        f"the step does not fit on {target.name} ({target.hbm_per_device / 1e9:.2f} GB HBM per "
        f"device): {needed}; try {', '.join(tries)}"
    )


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
    say("matmuls: XLA's Triton tiling found no tiles for these shapes without a GPU to "
        "autotune on; compiled with cuBLAS matmuls instead (xla_gpu_enable_triton_gemm=false)")
    return lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False})


class Planned(NamedTuple):
    """One step compiled for a target, and what was read off it."""

    plan: object  # roofline.plan.Plan
    summary: dict  # the plan as JSON (--summary-out); "error" if the step does not fit
    compiled: object  # jax.stages.Compiled, for the target: inspect it, never run it
    state_bytes_per_device: int  # params + optimizer state, by the sharding rules


def plan_target(mesh_text, cfg, tc, preset, target, devices, say, attention_note=None):
    """Compile the step `cfg, tc` for `target` over the mesh `mesh_text`
    ('fsdp=4,tp=2', None: all on fsdp), print its report, and return it as
    Planned. Raises UsageError for a mesh the target cannot hold or a step the
    compiler refuses for want of memory."""
    try:
        sizes = sharding.parse_mesh(mesh_text, len(devices))
    except UsageError as e:
        raise UsageError(f"{e} (--target {target.name})") from None
    sharding.check_divisible(cfg, tc.batch, sizes)
    mesh = sharding.make_mesh(sizes, devices=np.array(devices))
    chip = target.chip
    say(f"target: {target.name}, {target.devices} x {devices[0].device_kind} "
        f"(compile-only: nothing runs) | preset {preset}")
    say(f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
        f"S={cfg.seq} V={cfg.vocab} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype} "
        f"matmuls | attention: {cfg.attention_impl}")
    if attention_note:
        say(f"attention: {attention_note}")
    say(f"step: {tc.batch} x {cfg.seq} = {tc.batch * cfg.seq:,} tokens")

    step, state, batch = abstract_step(cfg, tc, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    for line in sharding.describe(state["params"], shardings["params"], mesh):
        say(line)
    held, total = sharding.bytes_per_device(state, shardings)
    say(f"params + optimizer state: {total / 2**20:,.1f} MiB in all, "
        f"{held / 2**20:,.1f} MiB per device")

    start = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = step.lower(state, batch)
        try:
            compiled = compile_for(lowered, chip, say)
        except Exception as e:  # XlaRuntimeError: the compiler's verdict
            if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
                raise too_big(e, target, tc, sizes) from None
            raise
    seconds = time.perf_counter() - start
    say(f"compiled for {target.name} in {seconds:.1f} s ({jax.__version__}, "
        f"{'libtpu' if chip.platform == 'tpu' else 'the CUDA plugin'})")

    facts = read_program(compiled, target.devices)
    kernel_attention = cfg.attention and cfg.attention_impl in KERNEL_PLATFORM
    xla_flops, source = facts.xla_flops, "XLA's cost analysis of the compiled step"
    if xla_flops is None:
        xla_flops = count_before_optimisation(cfg, tc) / target.devices
        source = ("the target's compiler gives none; this is XLA's count of the step "
                  "before optimisation (lowered for this CPU, attention as einsums)")
        kernel_attention = False  # that program has no kernel to hide FLOPs in
    p = plan(cfg, tc.batch, target, facts, mesh=sizes, kernel_attention=kernel_attention,
             xla_flops=xla_flops, xla_source=source)
    for line in plan_lines(p):
        say(line)
    summary = plan_summary(p)
    summary.update(preset=preset, batch=tc.batch, seq=cfg.seq, dtype=cfg.dtype,
                   attention_impl=cfg.attention_impl, compile_seconds=seconds)
    if not p.fits:
        # Written out first (--summary-out), then refused: exit 2 with what to try.
        summary["error"] = str(too_big(f"the compiled step needs "
                                       f"{p.memory_per_device_bytes / 1e9:.2f} GB per device",
                                       target, tc, sizes))
    return Planned(p, summary, compiled, held)

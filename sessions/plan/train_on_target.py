"""Plan a training run on a chip this machine lacks: `s2_train.py --target
CHIP[:SHAPE]` compiles the exact step the other flags describe for that chip
(sessions/plan/programs.py), prints what the compiler did and the roofline
(roofline/plan/training.py), and exits without training.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax

from roofline.chip import chip_roofs
from roofline.compiled.op_roofline import predict_ops
from roofline.compiled.program import read_program
from roofline.flops import flash_kernel, model_line, param_count
from roofline.plan.training import plan_lines, plan_summary, training_plan
from roofline.units import capacity, gb
from sessions.errors import UsageError
from sessions.plan import programs
from sessions.shard import sharding
from sessions.train.manual_fsdp import check_collectives, collectives_line
from sessions.train.offload import check_offload, planned_host_bytes


def too_big(error, target, tc, sizes):
    """The compiler's out-of-memory error as one line with what to try."""
    needed = programs.compiler_needs(error)
    tries = [f"a smaller --batch (now {tc.batch})"]
    if sizes["fsdp"] < target.devices:
        tries.append("a larger fsdp axis in --mesh")
    tries.append("a bigger slice")
    return UsageError(
        f"the step does not fit on {target.name} ({capacity(target.hbm_per_device)} HBM per "
        f"device): {needed}; try {', '.join(tries)}"
    )


class Planned(NamedTuple):
    """One step compiled for a target, and what was read off it."""

    plan: object  # roofline.plan.training.TrainingPlan
    summary: dict  # the plan as JSON (--summary-out); "error" if the step does not fit
    compiled: object  # jax.stages.Compiled, for the target: inspect it, never run it
    state_bytes_per_device: int  # params + optimizer state, by the sharding rules


def plan_target(mesh_text, run, target, devices, say=print, collectives="auto"):
    """Compile the step of `run` (sessions.run.defaults.Resolved) for `target` over
    the mesh `mesh_text` ('fsdp=4,tp=2', None: all on fsdp), its collectives "auto"
    (the partitioner's) or "manual" (sessions/train/manual_fsdp.py), print its report,
    and return it as Planned. Raises UsageError for a mesh the target cannot hold or
    a step the compiler refuses for want of memory."""
    cfg, tc = run.model, run.train
    sizes, mesh = programs.target_mesh(mesh_text, target, devices)
    sharding.check_divisible(cfg, tc.batch, sizes)
    check_collectives(collectives, sizes)
    check_offload(tc.offload, target.chip.platform, collectives)
    chip = target.chip
    say(
        f"target: {target.name}, {target.devices} x {devices[0].device_kind} "
        f"(compile-only: nothing runs) | preset {run.preset}"
    )
    sequence_parallel = " | sequence parallel (S/tp between blocks)" * cfg.sequence_parallel
    say(
        f"model: {model_line(cfg)} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype} "
        f"matmuls | attention: {cfg.attention_impl}{sequence_parallel}"
    )
    if run.attention_note:
        say(f"attention: {run.attention_note}")
    say(f"step: {tc.batch} x {cfg.seq} = {tc.batch * cfg.seq:,} tokens")

    say(collectives_line(collectives))
    step, (state, batch), _ = programs.train_step_program(cfg, tc, mesh, collectives)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    for line in sharding.describe(state["params"], shardings["params"], mesh):
        say(line)
    held, total = sharding.bytes_per_device(state, shardings)
    say(
        f"params + optimizer state: {total / 2**20:,.1f} MiB in all, "
        f"{held / 2**20:,.1f} MiB per device"
    )

    compiled, oom, seconds = programs.compile_or_oom(step, (state, batch), {}, mesh, chip, say)
    if compiled is None:
        raise too_big(oom, target, tc, sizes)
    say(
        f"compiled for {target.name} in {seconds:.1f} s ({jax.__version__}, "
        f"{'libtpu' if chip.platform == 'tpu' else 'the CUDA plugin'})"
    )
    host = planned_host_bytes(compiled.memory_analysis())
    if tc.offload != "none":
        say(offload_line(tc.offload, sharding.held_bytes(state["opt"]), host))

    facts = read_program(compiled, target.devices)
    kernel_attention = cfg.attention and flash_kernel(cfg)  # its FLOPs hidden in a kernel
    xla_flops, source = facts.xla_flops, "XLA's cost analysis of the compiled step"
    if xla_flops is None:
        einsum = dataclasses.replace(cfg, attention_impl="einsum")  # a kernel's FLOPs are unseen
        program = functools.partial(programs.train_step_program, einsum, tc)
        xla_flops = programs.count_on_this_cpu(program) / target.devices
        source = (
            "the target's compiler gives none; this is XLA's count of the step "
            "before optimisation (lowered for this CPU, attention as einsums)"
        )
        kernel_attention = False  # that program has no kernel to hide FLOPs in
    roofs = chip_roofs(chip, cfg.dtype, facts.matmul_precision, target.devices / target.chips)
    p = training_plan(
        cfg,
        tc.batch,
        target,
        facts,
        mesh=sizes,
        kernel_attention=kernel_attention,
        xla_flops=xla_flops,
        xla_source=source,
        per_op=predict_ops(compiled.as_text(), roofs, target.devices),
    )
    for line in plan_lines(p):
        say(line)
    summary = plan_summary(p)
    summary.update(
        preset=run.preset,
        batch=tc.batch,
        seq=cfg.seq,
        dtype=cfg.dtype,
        attention_impl=cfg.attention_impl,
        sequence_parallel=cfg.sequence_parallel,
        collectives_mode=collectives,  # "collectives" holds what the compiler wrote
        compile_seconds=seconds,
        loss_chunks=cfg.loss_chunks,
        offload=tc.offload,
        host_memory_per_device_bytes=host,  # XLA's plan of pinned_host; None: not given
    )
    if not p.fits:
        # Written out first (--summary-out), then refused: exit 2 with what to try.
        summary["error"] = str(
            too_big(
                f"the compiled step needs {p.memory_per_device_bytes / 1e9:.2f} GB per device",
                target,
                tc,
                sizes,
            )
        )
    return Planned(p, summary, compiled, held)


def offload_line(offload, state_bytes, host_bytes):
    """What --offload moved to host memory: the optimizer's state a device holds by the
    sharding rules (predicted), beside XLA's plan of the step's host memory (compiled:
    arguments + outputs + temporaries - donated), which the HBM plan no longer counts."""
    compiled = "not given by this JAX" if host_bytes is None else gb(host_bytes)
    return (
        f"offload {offload}: its state in host memory (pinned_host), {gb(state_bytes)} a "
        f"device (predicted, by the sharding rules) | host memory a device: {compiled} "
        "(compiled, XLA's plan); the HBM plan below leaves it out"
    )

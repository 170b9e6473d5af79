"""The largest batch whose training step fits a chip, read from the compiler's
memory plan: the step compiled for the chip (deviceless, as `s2_train.py
--target` compiles it), never run, so nothing is learned by running out of
memory. The batch doubles until the plan no longer fits the chip's HBM, then
the last gap is bisected, in steps the mesh can split (data x fsdp).

On a GPU the limit is not the whole HBM but the share JAX preallocates
(roofline.memory.usable_fraction).

    python scripts/max_batch.py --target h100:1 --preset gpt2-bytes --vocab 50304
    python scripts/max_batch.py --target tpu-v5e:2x4 --preset course --mesh fsdp=8

The other flags are s2_train.py's (the shapes, --dtype, --mesh, --remat, --accum, ...),
and the napkin's answer (roofline/plan/training_memory.py) is printed beside. Each
candidate is one compile (seconds each for gpt2-bytes on h100:1); the compiler may
also refuse a batch outright (out of memory), which counts as not fitting.
"""

import dataclasses
import sys

from roofline.memory import largest_batch, planned_bytes, usable_fraction
from roofline.plan.memory_report import napkin_batch_line
from roofline.plan.training_memory import Recipe
from sessions.errors import UsageError, run_main
from sessions.plan import programs
from sessions.run.cli import resolve, train_flags


def plan_bytes(run, batch, target, devices, mesh_text):
    """Bytes per device of the step at this batch, by the compiler's plan; None
    when the compiler itself refuses it for want of memory."""
    tc = dataclasses.replace(run.train, batch=batch)
    _, mesh = programs.target_mesh(mesh_text, target, devices)
    step, inputs, static = programs.train_step_program(run.model, tc, mesh)
    compiled, _, _ = programs.compile_or_oom(
        step, inputs, static, mesh, target.chip, lambda *a: None
    )
    return None if compiled is None else planned_bytes(compiled.memory_analysis())


def main(argv=None):
    args = train_flags(argv)
    if not args.target:
        raise UsageError(
            "max_batch.py needs --target CHIP[:SHAPE] (e.g. h100:1): its HBM is the limit"
        )
    target, devices = programs.devices_for(args.target)
    run = resolve(args, platform=target.chip.platform)
    sizes, _ = programs.target_mesh(args.mesh, target, devices)
    unit = sizes["data"] * sizes["fsdp"]
    hbm = target.hbm_per_device * usable_fraction(target.chip.platform)

    def fits(batch):
        used = plan_bytes(run, batch, target, devices, args.mesh)
        shown = "refused by the compiler" if used is None else f"{used / 1e9:.2f} GB"
        print(f"  batch {batch:>6,}: {shown} of {hbm / 1e9:.2f} GB usable per device")
        return used is not None and used <= hbm

    print(f"{run.preset} on {target.name}: seq {run.model.seq}, {run.model.dtype}, mesh {sizes}")
    start = max(unit, run.train.batch // unit * unit)
    while not fits(start):
        if start == unit:
            raise UsageError(f"not even a batch of {unit} fits {target.name}")
        start = max(unit, start // 2 // unit * unit)
    batch = largest_batch(fits, unit, start)
    print(
        f"largest batch that fits: {batch:,} sequences ({batch * run.model.seq:,} tokens a step), "
        "by XLA's memory plan of the compiled step"
    )
    recipe = Recipe(run.train.weights, run.train.master)  # our step's gradients: float32
    print(napkin_batch_line(run.model, target.chip, hbm, sizes, run.train.accum, recipe))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

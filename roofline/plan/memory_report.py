"""The memory plan as python -m roofline memory prints it and writes it as JSON
(roofline/plan/training_memory.py plans it; roofline/flags.py takes its levers)."""

import dataclasses

from roofline.flops import param_count
from roofline.memory import usable_line
from roofline.plan.training_memory import STATE, Recipe, plan_memory
from roofline.units import capacity, flop, gb


def _remat_name(remat):
    return f"{remat} x [tokens, E]" if isinstance(remat, int) else remat


def memory_lines(plan, heading):
    """The plan as python -m roofline memory prints it: each part for the whole
    model and batch and on one chip, whether it fits, the fewest chips, the largest batch."""
    cfg, chip, r = plan.cfg, plan.chip, plan.recipe
    per = r.bytes_per_param(plan.accum)
    recipe = f"weights {r.weights}" + (", float32 master" if r.master else "")
    recipe += f", grads {r.grads}" + (" + a float32 sum (--accum)" if plan.accum > 1 else "")
    recipe += f", {r.optimizer} in {r.optimizer_dtype}: {sum(per.values())} bytes a parameter"
    lines = [
        heading,
        f"step: {plan.batch_tokens:,} tokens ({plan.batch_tokens // cfg.seq:,} x {cfg.seq:,})"
        f", {plan.accum} microbatch(es) | remat {_remat_name(plan.remat)} | "
        f"{plan.chips} x {chip.name}, tp={plan.tp}, state sharded: {plan.shard}",
        f"recipe: {recipe}",
        f"  {'':<12}{'whole model':>14}{'per chip':>14}",
    ]
    for part in (*STATE, "activations", "transients"):
        lines.append(f"  {part:<12}{gb(plan.whole[part]):>14}{gb(plan.per_chip[part]):>14}")
    total = plan.per_chip["total"]
    lines.append(f"  {'total':<12}{'':>14}{gb(total):>14}")
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"HBM: {capacity(chip.hbm_bytes)} a chip ({chip.name}, the chip table): {verdict}")
    lines += filter(None, [usable_line(chip)])
    least = f"{plan.min_chips:,}" if plan.min_chips else "none (what is not sharded is too big)"
    lines.append(f"fewest chips that hold this step: {least}")
    most = f"{plan.max_batch_tokens:,} tokens" if plan.max_batch_tokens else "none"
    lines.append(f"largest batch on {plan.chips} chip(s): {most}")
    saved = ", ".join(f"{name} {n:,}" for name, (n, *_) in plan.saved.items())
    lines.append(f"saved a layer a token ({cfg.dtype if r.weights == 'float32' else r.weights})"
                 f": {saved}")  # fmt: skip
    six = 6 * plan.batch_tokens * param_count(cfg)
    lines.append(f"FLOPs a step: {flop(plan.flops_per_step)} ({plan.flops_per_step / six:.2f} x "
                 "6·B·P, recompute included)")  # fmt: skip
    return lines


def memory_summary(plan):
    """--summary-out's numbers, bytes throughout."""
    return {
        **{part: plan.whole[part] for part in (*STATE, "activations", "transients")},
        "per_chip": dict(plan.per_chip),
        "hbm_per_chip": plan.chip.hbm_bytes,
        "fits": plan.fits,
        "min_chips": plan.min_chips,
        "max_batch_tokens": plan.max_batch_tokens,
        "flops_per_step": plan.flops_per_step,
        "saved_per_layer_per_token": {name: n for name, (n, *_) in plan.saved.items()},
        "chip": plan.chip.name,
        "chips": plan.chips,
        "tp": plan.tp,
        "batch_tokens": plan.batch_tokens,
        "remat": plan.remat,
        "accum": plan.accum,
        "shard": plan.shard,
        "recipe": dataclasses.asdict(plan.recipe),
    }


def napkin_batch_line(cfg, chip, hbm, sizes, accum=1, recipe=None):
    """scripts/max_batch.py's line beside the compiler's: the napkin's largest batch
    for our step (by default float32 weights, gradients and AdamW; s2_train.py's
    --weights bfloat16 [--master] keep float32 gradients too) on a mesh of sizes {data,
    fsdp, tp}, each device with `hbm` bytes. fsdp divides the state (ZeRO-3); a mesh with
    both data and fsdp is one the napkin cannot say (it divides over every replica)."""
    if sizes["data"] > 1 and sizes["fsdp"] > 1:
        return "the napkin's largest batch: not planned for a mesh over both data and fsdp"
    replicas = sizes["data"] * sizes["fsdp"]
    plan = plan_memory(
        cfg, dataclasses.replace(chip, hbm_bytes=hbm), chips=replicas * sizes["tp"],
        tp=sizes["tp"], batch_tokens=cfg.seq * accum * replicas, remat=cfg.remat,
        shard="params" if sizes["fsdp"] > 1 else "none", accum=accum, recipe=recipe or Recipe(),
        scan=cfg.scan_layers,
    )  # fmt: skip
    batch = plan.max_batch_tokens // cfg.seq
    return f"the napkin's largest batch: {batch:,} sequences (predicted; roofline memory)"

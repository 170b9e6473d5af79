"""The memory plan as python -m roofline memory prints it and writes it as JSON
(roofline/plan/training_memory.py plans it; roofline/flags.py takes its levers)."""

import dataclasses
import os

from roofline.flops import param_count
from roofline.memory import MEM_FRACTION
from roofline.plan.host_link import host_link
from roofline.plan.memory_advice import advice_line
from roofline.plan.memory_layout import pick_layout
from roofline.plan.training_memory import STATE, Recipe, compute_dtype, plan_memory
from roofline.units import capacity, flop, gb, ms


def _remat_name(remat):
    return f"{remat} x [tokens, E]" if isinstance(remat, int) else remat


def _layout_lines(plan):
    """The step and its chips: the layout, and the sequence sharding if the planner
    picked it."""
    cfg, n, lv = plan.cfg, plan.layout, plan.levers
    extra = [" | sequence parallel" * lv.sequence_parallel]
    extra.append(f" | loss in {lv.loss_chunks} chunks" * (lv.loss_chunks > 1))
    extra.append(f" | {lv.offload} offloaded to the host" * bool(lv.offload))
    lines = [
        f"step: {plan.batch_tokens:,} tokens ({plan.batch_tokens // cfg.seq:,} x {cfg.seq:,})"
        f", {plan.accum} microbatch(es) | remat {_remat_name(plan.remat)}{''.join(extra)}",
        f"chips: {plan.chips:,} x {plan.chip.name} = {n.words()}; state sharded: {plan.shard}",
    ]
    if n.picked:
        lines.append(
            f"  sequence sharding picked by the planner: each sequence over {n.seq_shards} chips "
            f"(--seq-shards {n.seq_shards}), as whole sequences do not divide over the replicas"
        )
    if n.stages > 1:
        lines.append(
            f"  pipeline: {n.stages} stages of {cfg.layers // n.stages} layers, "
            f"{n.microbatches} microbatches; stage 0 under 1F1B holds "
            f"{min(n.stages, n.microbatches)} microbatches' activations. A napkin term only: "
            "the course's step does not pipeline"
        )
    return lines


def _fit_lines(plan):
    """Whether it fits what the framework may use, beside the whole HBM; the fewest
    chips; the largest batch; what would make it fit."""
    chip = plan.chip
    verdict = "fits" if plan.fits else "does NOT fit"
    share = plan.usable_bytes / chip.hbm_bytes if chip.hbm_bytes else 1
    usable = f"the {gb(plan.usable_bytes)} usable of one {chip.name}'s {capacity(chip.hbm_bytes)}"
    if chip.platform == "gpu":  # roofline/memory.py usable_fraction
        how = f"={os.environ[MEM_FRACTION]}" if MEM_FRACTION in os.environ else "'s default"
        usable += f" ({share:.0%}: {MEM_FRACTION}{how}; raise it to use more)"
    lines = [f"predicted: {verdict} in {usable}"]
    if plan.min_chips:
        n = plan.layout
        there = pick_layout(plan.cfg, plan.batch_tokens, plan.min_chips, tp=n.tp, accum=n.accum,
                            seq_shards=plan.levers.seq_shards, stages=n.stages,
                            microbatches=n.microbatches)  # fmt: skip
        least = f"{plan.min_chips:,} ({there.words()})"
    else:
        least = "none: what no chip count divides (the unsharded state, a layer) is too big"
    lines.append(f"predicted fewest chips that hold this step: {least}")
    most = f"{plan.max_batch_tokens:,} tokens" if plan.max_batch_tokens else "none"
    lines.append(f"predicted largest batch on {plan.chips:,} chip(s): {most}")
    if not plan.fits:
        lines.append(advice_line(plan))
    return lines


def memory_lines(plan, heading):
    """The plan as python -m roofline memory prints it, every figure a prediction: each
    part for the whole model and batch and on one chip (and in host memory, offloaded),
    whether it fits, the fewest chips, the largest batch, what would make it fit."""
    cfg, r = plan.cfg, plan.recipe
    per = r.bytes_per_param(plan.accum)
    recipe = f"weights {r.weights}" + (", float32 master" if r.master else "")
    recipe += f", grads {r.grads}" + (" + a float32 sum (--accum)" if plan.accum > 1 else "")
    recipe += f", {r.optimizer} in {r.optimizer_dtype}: {sum(per.values())} bytes a parameter"
    recipe += f"; compute in {compute_dtype(cfg, r)}"
    host = plan.host_per_chip
    lines = [
        f"{heading} (predicted: the napkin, nothing compiled)",
        *_layout_lines(plan),
        f"recipe: {recipe}",
        f"  {'predicted':<12}{'whole model':>14}{'per chip':>14}" + f"{'host':>14}" * bool(host),
    ]

    def row(name, whole, part):
        held = sum(host.values()) if part == "total" else host.get(part)
        moved = f"{gb(held) if held is not None else '':>14}" if host else ""
        line = f"  {name:<12}{whole:>14}{gb(plan.per_chip[part]) if part else '':>14}{moved}"
        return line.rstrip()

    for part in STATE:
        lines.append(row(part, gb(plan.whole[part]), part))
    state = sum(plan.per_chip[p] for p in STATE)
    lines.append(f"  {'  state':<12}{gb(sum(plan.whole[p] for p in STATE)):>14}{gb(state):>14}")
    for part in ("activations", "transients"):
        lines.append(row(part, gb(plan.whole[part]), part))
    if plan.per_chip["gathered"]:  # --shard params: one layer gathered, and its gradient
        lines.append(row("gathered", "", "gathered"))
    lines.append(row("total", "", "total"))
    lines += _fit_lines(plan)
    saved = ", ".join(f"{name} {n:,}" for name, (n, *_) in plan.saved.items())
    lines.append(f"predicted saved a layer a token ({compute_dtype(cfg, r)}): {saved}")
    six = 6 * plan.batch_tokens * param_count(cfg)
    ratio = f" ({plan.flops_per_step / six:.2f} x 6·B·P, recompute included)" if six else ""
    lines.append(f"predicted FLOPs a step: {flop(plan.flops_per_step)}{ratio}")
    if host:
        lines.append(_link_line(plan))
    return lines


def _link_line(plan):
    link = host_link(plan.chip)
    if not link:
        return f"predicted host link: {plan.chip.name} has no host-link figure in the table"
    moved = 2 * sum(plan.host_per_chip.values()) if "optimizer" in plan.host_per_chip else None
    moved = plan.pcie_seconds * link[0] if moved is None else moved
    compute = ms(plan.compute_seconds) if plan.compute_seconds else "not known"
    return (
        f"predicted host link: {gb(moved)} a chip there and back a step at {link[0] / 1e9:.0f} "
        f"GB/s one way = {ms(plan.pcie_seconds)}, beside {compute} of compute at the chip's "
        f"peak ({link[1]})"
    )


def memory_summary(plan):
    """--summary-out's numbers, bytes throughout."""
    n = plan.layout
    return {
        **{part: plan.whole[part] for part in (*STATE, "activations", "transients")},
        "per_chip": dict(plan.per_chip),
        "host_per_chip": dict(plan.host_per_chip),
        "hbm_per_chip": plan.chip.hbm_bytes,
        "usable_per_chip": plan.usable_bytes,
        "fits": plan.fits,
        "min_chips": plan.min_chips,
        "max_batch_tokens": plan.max_batch_tokens,
        "flops_per_step": plan.flops_per_step,
        "compute_seconds": plan.compute_seconds,
        "pcie_seconds": plan.pcie_seconds,
        "saved_per_layer_per_token": {name: n for name, (n, *_) in plan.saved.items()},
        "chip": plan.chip.name,
        "chips": plan.chips,
        "tp": plan.tp,
        "replicas": n.replicas,
        "seq_shards": n.seq_shards,
        "seq_shards_picked": n.picked,
        "pipeline_stages": n.stages,
        "microbatches": n.microbatches,
        "sequence_parallel": plan.levers.sequence_parallel,
        "loss_chunks": plan.levers.loss_chunks,
        "offload": plan.levers.offload,
        "batch_tokens": plan.batch_tokens,
        "remat": plan.remat,
        "accum": plan.accum,
        "shard": plan.shard,
        "recipe": dataclasses.asdict(plan.recipe),
        "predicted": True,
    }


def napkin_batch_line(cfg, chip, hbm, sizes, accum=1, recipe=None):
    """scripts/max_batch.py's line beside the compiler's: the napkin's largest batch
    for our step (by default float32 weights, gradients and AdamW; s2_train.py's
    --weights bfloat16 [--master] keep float32 gradients too) on a mesh of sizes {data,
    fsdp, tp}, each device with `hbm` bytes usable. fsdp divides the state (ZeRO-3); a mesh with
    both data and fsdp is one the napkin cannot say (it divides over every replica)."""
    if sizes["data"] > 1 and sizes["fsdp"] > 1:
        return "the napkin's largest batch: not planned for a mesh over both data and fsdp"
    replicas = sizes["data"] * sizes["fsdp"]
    plan = plan_memory(
        cfg, chip, usable=hbm, chips=replicas * sizes["tp"],
        tp=sizes["tp"], batch_tokens=cfg.seq * accum * replicas, remat=cfg.remat,
        shard="params" if sizes["fsdp"] > 1 else "none", accum=accum, recipe=recipe or Recipe(),
        scan=cfg.scan_layers,
    )  # fmt: skip
    batch = plan.max_batch_tokens // cfg.seq
    return f"the napkin's largest batch: {batch:,} sequences (predicted; roofline memory)"

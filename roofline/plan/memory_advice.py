"""What would make a step that does not fit, fit: each lever re-planned alone, and the
ones under which the planner says it fits (python -m roofline memory)."""

import dataclasses

from roofline.plan.saved_activations import remat_problem
from roofline.plan.training_memory import plan_memory
from roofline.units import gb


def _replanned(plan, chips=None, batch_tokens=None, **change):
    """The plan with one lever changed, or None where the planner refuses it."""
    levers = {f.name: getattr(plan.levers, f.name) for f in dataclasses.fields(plan.levers)}
    try:
        return plan_memory(
            plan.cfg, plan.chip, chips=chips or plan.chips, usable=plan.usable_bytes,
            batch_tokens=plan.batch_tokens if batch_tokens is None else batch_tokens,
            **{**levers, **change},
        )  # fmt: skip
    except ValueError:
        return None


def _loss_chunks(plan):
    """The fewest chunks (2, 4, ... 1024) under which the plan fits, as a change."""
    for n in (2**k for k in range(1, 11)):
        there = _replanned(plan, loss_chunks=n)
        if there and there.fits:
            return {"loss_chunks": n}
    return {"loss_chunks": 1024}


def fitting_levers(plan):
    """[(the flag, the plan under it)] for each lever that alone makes `plan` fit, in the
    order practitioners reach for them; more chips and a smaller batch last."""
    lv, tried = plan.levers, []
    if lv.shard != "params":
        tried.append(("--shard params", {"shard": "params"}))
    remat = "full" if not remat_problem("full") else "block"
    if lv.remat not in ("full", "block"):
        tried.append((f"--remat {remat}", {"remat": remat}))
    if lv.tp > 1 and not lv.sequence_parallel:
        tried.append(("--sequence-parallel", {"sequence_parallel": True}))
    if lv.loss_chunks == 1:
        change = _loss_chunks(plan)
        tried.append((f"--loss-chunks {change['loss_chunks']}", change))
    if plan.chip.platform != "cpu" and not lv.offload:
        tried += [(f"--offload {what}", {"offload": what}) for what in ("optimizer", "activations")]
    found = []
    for flag, change in tried:
        there = _replanned(plan, **change)
        if there and there.fits:
            found.append((flag, there))
    if plan.min_chips and plan.min_chips != plan.chips:
        found.append((f"--chips {plan.min_chips:,}", _replanned(plan, chips=plan.min_chips)))
    if plan.max_batch_tokens:
        smaller = _replanned(plan, batch_tokens=plan.max_batch_tokens)
        found.append((f"--batch-tokens {plan.max_batch_tokens:,}", smaller))
    return [(flag, there) for flag, there in found if there and there.fits]


def advice_line(plan):
    """The line under a "does NOT fit": the levers that would make it fit, each with its
    bytes a chip, or why none does."""
    found = fitting_levers(plan)
    if not found:
        return (
            "predicted to fit with: no lever alone (tried --shard params, --remat, "
            "--sequence-parallel, --loss-chunks, --offload, more chips, a smaller batch); "
            "combine them, or a chip with more HBM"
        )
    each = "; ".join(f"{flag} ({gb(there.per_chip['total'])} a chip)" for flag, there in found)
    return f"predicted to fit with, each alone: {each}"

"""What would make a step that does not fit, fit: each lever re-planned alone, and the
ones under which the planner says it fits (python -m roofline memory)."""

import dataclasses

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


def _fitting(plan, flag, change):
    """(the flags, the plan) if the change makes `plan` fit, else None. loss_chunks=None
    in a change asks for the fewest chunks (2, 4, ... 1,024) that do."""
    if change.get("loss_chunks", 1) is not None:
        there = _replanned(plan, **change)
        return (flag, there) if there and there.fits else None
    for n in (2**k for k in range(1, 11)):
        there = _replanned(plan, **{**change, "loss_chunks": n})
        if there and there.fits:
            return flag.replace("--loss-chunks", f"--loss-chunks {n}"), there
    return None


def fitting_levers(plan):
    """[(the flags, the plan under them)] for each lever that alone makes `plan` fit, in
    the order practitioners reach for them, or if none does, the first pairs that do;
    more chips and a smaller batch last."""
    lv, tried = plan.levers, []
    if lv.shard != "params":
        tried.append(("--shard params", {"shard": "params"}))
    if lv.remat not in ("full", "block"):  # block is MaxText's full: each layer's input alone
        tried.append(("--remat block", {"remat": "block"}))
    if lv.tp > 1 and not lv.sequence_parallel:
        tried.append(("--sequence-parallel", {"sequence_parallel": True}))
    if lv.loss_chunks == 1:
        tried.append(("--loss-chunks", {"loss_chunks": None}))
    if plan.chip.platform != "cpu" and not lv.offload:
        tried += [(f"--offload {what}", {"offload": what}) for what in ("optimizer", "activations")]
    found = [f for flag, change in tried if (f := _fitting(plan, flag, change))]
    if not found:  # no lever alone: two together, the first three pairs that fit
        for i, (flag, change) in enumerate(tried):
            for other, more in tried[i + 1 :]:
                both = len(found) < 3 and not ("offload" in change and "offload" in more)
                if both and (pair := _fitting(plan, f"{flag} {other}", {**change, **more})):
                    found.append(pair)
    if plan.min_chips and plan.min_chips != plan.chips:
        found.append((f"--chips {plan.min_chips:,}", _replanned(plan, chips=plan.min_chips)))
    if plan.max_batch_tokens:
        smaller = _replanned(plan, batch_tokens=plan.max_batch_tokens)
        found.append((f"--batch-tokens {plan.max_batch_tokens:,}", smaller))
    return [(flag, there) for flag, there in found if there]  # each re-planned to fit


def advice_line(plan):
    """The line under a "does NOT fit": the levers that would make it fit, each with its
    bytes a chip, or why none does."""
    found = fitting_levers(plan)
    if not found:
        return (
            "predicted to fit with: no lever alone or in pairs (--shard params, --remat, "
            "--sequence-parallel, --loss-chunks, --offload), and no chip count or smaller "
            "batch: a chip with more HBM, or three levers together"
        )
    each = "; ".join(f"{flag} ({gb(there.per_chip['total'])} a chip)" for flag, there in found)
    return f"predicted to fit with, each re-planned: {each}"

"""The per-op prediction beside the trace: the step, each kind of work and the
ops that cost most, predicted (roofline/compiled/op_roofline.py: each op on its roof,
no efficiency factor) and measured (roofline/measured/trace.py: each op's own time),
as text, as JSON (`compare DIR --summary-out`) and as the chart's points.

Both sides are per device and per step: the prediction reads the compiled
step's HLO (one device's program), the trace's op times are means over the
traced steps and devices. An op group (ops alike: one per layer) is measured
as the sum of its ops' times.
"""

import dataclasses
import textwrap

from roofline.compiled.op_report import prediction_summary
from roofline.compiled.op_roofline import group_alike
from roofline.units import ms

# Measured at or above this many times its prediction, an op broke the roofline's
# assumptions (every byte moved once at full bandwidth, every FLOP at the peak).
BROKEN = 10
LOW_PRECISION = ("bf16", "f16", "f8")


def why_slow(group):
    """In words, what a roofline does not model that makes this op group slow."""
    if "scatter" in f"{group.source} {group.name}":
        words = (
            "A scatter-add whose indices repeat sums the updates of one address with "
            "atomic adds, one after another; the roof assumes every byte moves once, "
            "all at full bandwidth"
        )
        if group.shape.startswith(LOW_PRECISION):
            words += (
                f". In {group.shape.split('[')[0]} the atomic sum is also inexact (an update "
                "below half a unit in the last place of the sum is lost): sum in float32"
            )
        return words
    return (
        "Something the roofline does not model set its pace (a kernel far from its "
        "roof, launch overhead, contention): open it in the trace viewer"
    )


def measured_groups(c, top=5):
    """[(OpGroup or None, names, measured seconds)] of the op groups that took
    most time in the trace, slowest first; ops the prediction lacks, one a row."""
    seconds = c.trace.op_seconds()
    rows = [(g, g.ops, sum(seconds.get(n, 0.0) for n in g.ops)) for g in group_alike(c.ops.ops)]
    predicted = {o.name for o in c.ops.ops}
    rows += [(None, (n,), s) for n, s in seconds.items() if n not in predicted]
    return sorted(rows, key=lambda row: -row[2])[:top]


def measured_lines(c, top=5):
    """The op groups that took most, measured, beside their prediction; each
    BROKEN times its prediction or more is said so in words."""
    lines = [
        f"  the {top} ops that took most, measured (ops alike as one row; measured / predicted):",
        f"    {'measured':>12}{'predicted':>12}{'ratio':>10}  {'kind':<15}op",
    ]
    broken = []
    for g, names, seconds in measured_groups(c, top):
        ratio = seconds / g.seconds if g and g.seconds else None
        flag = ratio is not None and ratio >= BROKEN
        lines.append(
            f"    {ms(seconds):>12}{ms(g.seconds) if g else '-':>12}"
            f"{f'{ratio:,.1f}x' if ratio else '-':>10}  {g.kind if g else '?':<15}"
            + (f"{g.label}: {g.source or '?'} {g.shape[:40]}" if g else names[0])
            + (f"  <- {BROKEN}x its prediction or more" if flag else "")
        )
        if flag:
            words = (
                f"{g.label} took {ratio:,.0f}x its prediction ({ms(seconds)} against "
                f"{ms(g.seconds)}): the prediction's assumptions broke there. {why_slow(g)}."
            )
            broken += textwrap.wrap(words, 96, initial_indent="  ", subsequent_indent="    ")
    return lines + broken


def measured_seconds(trace, names):
    """Mean seconds per step the trace spent in these ops, together."""
    seconds = trace.op_seconds()
    return sum(seconds.get(n, 0.0) for n in names)


def _ratio(predicted, measured):
    return f"{predicted / measured:.2f}x" if measured else "-"


def op_lines(c, top=10):
    """The per-op prediction against the trace, as lines: the step, then the
    ops that cost most (by predicted time), each with its measured time."""
    p, t = c.ops, c.trace
    lines = [
        "",
        f"per op (roofline/compiled/op_roofline.py: each op on the roof of {p.roofs.name}, "
        "in the compiler's order, no efficiency factor):",
    ]
    best = c.best_ops or p
    if p.roofs.matmul_rates:
        lines.append(
            "  the prediction times each matmul at the rate measured for its shape, and "
            "moves every byte at the measured copy bandwidth; the best case puts every "
            "matmul at the peak and as many bytes as the cache holds at its bandwidth"
        )
    if t is None:
        lines.append(f"  step: predicted {ms(p.step_s)}, best case {ms(best.step_s)}")
    else:
        lines.append(
            f"  step: predicted {ms(p.step_s)}, measured {ms(t.step_s)}: "
            f"predicted/measured {_ratio(p.step_s, t.step_s)}"
        )
        if best is not p:
            lines.append(
                f"  best case (the ceilings alone): {ms(best.step_s)}, "
                f"{_ratio(best.step_s, t.step_s)} of the measured step"
            )
        if best.step_s > t.step_s:
            # A best case slower than the step itself: a roof is set too low.
            lines.append(
                "  the best case is slower than the measured step: a roof is below what "
                "this chip reaches (re-measure: python -m roofline calibrate)"
            )
        missing = set(t.op_seconds()) - {o.name for o in p.ops}
        if missing:
            lost = measured_seconds(t, missing)
            lines.append(
                f"  {len(missing)} traced ops ({ms(lost)}) are not in the prediction: "
                + ", ".join(sorted(missing)[:5])
            )
    lines.append(
        f"  the {top} ops that cost most, predicted (ops alike, one per layer, as one row):"
    )
    lines.append(
        f"    {'predicted':>12}{'measured':>12}{'ratio':>8}  {'bound':<8}{'kind':<15}"
        f"{'GFLOP':>8}{'MB':>8}  op"
    )
    for g in p.top(top):
        measured = measured_seconds(t, g.ops) if t else 0.0
        lines.append(
            f"    {ms(g.seconds):>12}{ms(measured) if t else '-':>12}"
            f"{_ratio(g.seconds, measured):>8}  {g.bound:<8}{g.kind:<15}"
            f"{g.flops / 1e9:>8,.2f}{g.bytes / 1e6:>8,.1f}  {g.label}: {g.source or '?'}"
            f" {g.shape[:40]}"
        )
    return lines + (measured_lines(c) if t else [])


def op_summary(c, top=10):
    """The per-op prediction as JSON-ready values: predicted_step_seconds,
    predicted_mfu, predicted_seconds_by_kind, top_ops (each with the trace's
    measured_seconds), predicted_roof; each None without a prediction."""
    keys = ("predicted_step_seconds", "predicted_mfu", "predicted_seconds_by_kind", "top_ops")
    keys += ("top_measured_ops",)
    if c.ops is None:
        return {**dict.fromkeys(keys), "predicted_roof": None, "best_case_step_seconds": None}
    found = prediction_summary(c.ops, c.ledger.exact / c.devices, top)
    seconds = c.trace.op_seconds() if c.trace else None
    for row in found["top_ops"]:
        row["measured_seconds"] = sum(seconds.get(n, 0.0) for n in row["ops"]) if seconds else None
    best = c.best_ops or c.ops
    found["top_measured_ops"] = None
    if c.trace:
        found["top_measured_ops"] = [
            {
                "name": g.label if g else names[0],
                "ops": list(names),
                "kind": g.kind if g else None,
                "measured_seconds": seconds,
                "predicted_seconds": g.seconds if g else None,
                "broken": bool(g and g.seconds and seconds >= BROKEN * g.seconds),
            }
            for g, names, seconds in measured_groups(c, top)
        ]
    return {**found, "predicted_roof": c.ops.roofs.name, "best_case_step_seconds": best.step_s}


@dataclasses.dataclass(frozen=True)
class OpPoint:
    """One op group on the roofline chart. Per device and step."""

    label: str
    kind: str
    intensity: float  # FLOPs per HBM byte
    seconds: float  # predicted
    predicted: float  # FLOP/s: its FLOPs over its predicted seconds
    measured: float | None  # FLOP/s over its measured seconds; None: not in a trace
    measured_seconds: float | None


def op_points(c):
    """[OpPoint] of every op group of the step that does arithmetic and moves
    bytes (a copy has no FLOPs, so no height on a FLOP/s axis)."""
    if c.ops is None:
        return []
    seconds = c.trace.op_seconds() if c.trace else None
    points = []
    for g in group_alike(c.ops.ops):
        if g.flops <= 0 or g.bytes <= 0 or g.seconds <= 0:
            continue
        measured = sum(seconds.get(n, 0.0) for n in g.ops) if seconds else None
        points.append(
            OpPoint(
                label=g.label,
                kind=g.kind,
                intensity=g.flops / g.bytes,
                seconds=g.seconds,
                predicted=g.flops / g.seconds,
                measured=g.flops / measured if measured else None,
                measured_seconds=measured,
            )
        )
    return points

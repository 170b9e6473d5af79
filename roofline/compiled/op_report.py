"""The per-op prediction (roofline/compiled/op_roofline.py) as a student reads it: the
step, its seconds by kind and by phase, the ten ops that cost most; and as
JSON for --summary-out.
"""

import collections

from roofline.compiled.op_roofline import PHASES, phase
from roofline.predict import utilisation
from roofline.units import ms


def padding_share(ops, work_flops):
    """How much of the matmul work is padding: padded FLOPs over unpadded, minus 1."""
    return ops / work_flops - 1 if work_flops else 0.0


def predicted_mfu(p, model_flops):
    """MFU of the predicted step (roofline.predict.utilisation), against the peak of
    the roofs it was predicted on: measured, or the datasheet's."""
    roofs = p.roofs
    if roofs.measured:
        return utilisation(model_flops, p.step_s, measured_peak=roofs.peak_flops).mfu_measured
    return utilisation(model_flops, p.step_s, datasheet_peak=roofs.peak_flops).mfu_datasheet


def prediction_lines(p, tokens, model_flops, bound_s=None, top=10):
    """The per-op prediction as text: the step, by kind, the ops that cost most.
    model_flops: the exact count per device (its MFU numerator); bound_s: the
    whole-step bound to set beside it."""
    mfu = predicted_mfu(p, model_flops)
    beside = f"; the whole-step bound: {ms(bound_s)}" if bound_s else ""
    lines = [
        "per-op prediction (each op on its roof, in the compiler's order, asynchronous "
        "collectives and copies overlapped; roofline/compiled/op_roofline.py):",
        f"  step {ms(p.step_s)}, {tokens / p.step_s:,.0f} tokens/s, MFU {100 * mfu:.0f}%{beside}",
        "  by kind: "
        + ", ".join(
            f"{kind} {ms(s)}"
            for kind, s in sorted(p.seconds_by_kind.items(), key=lambda kv: -kv[1])
            if s > 0
        ),
    ]
    phases = collections.Counter()
    for o in p.ops:
        phases[phase(o.source)] += o.seconds
    lines.append(
        "  by phase (each op's own time, overlap not taken off): "
        + ", ".join(f"{name} {ms(phases[name])}" for name in PHASES)
    )
    if p.roofs.tile:
        lines.append(
            f"  matmuls padded to the chip's {'x'.join(map(str, p.roofs.tile))} (M x N x K) "
            f"tiles: {100 * padding_share(*p.matmul_flops):+.1f}% FLOPs"
        )
    lines.append(f"  the {top} ops that cost most (ops alike, one per layer, as one row):")
    lines.append(f"    {'time':>9}  {'bound':<8}{'kind':<15}{'GFLOP':>9}{'MB':>9}  op")
    for g in p.top(top):
        hidden = ", async" if g.asynchronous else ""
        lines.append(
            f"    {ms(g.seconds):>9}  {g.bound:<8}{g.kind:<15}{g.flops / 1e9:>9,.1f}"
            f"{g.bytes / 1e6:>9,.1f}  {g.label}{hidden}: {_short(g.source)} {g.shape[:48]}"
        )
    return lines


def _short(source, width=48):
    """A long op name's end, where its most specific part is."""
    return source if len(source) <= width else "..." + source[-width:]


def prediction_summary(p, model_flops, top=10):
    """The per-op prediction as JSON-ready values (--summary-out)."""
    return {
        "predicted_step_seconds": p.step_s,
        "predicted_mfu": predicted_mfu(p, model_flops),
        "predicted_seconds_by_kind": dict(p.seconds_by_kind),
        "top_ops": [
            {
                "name": g.label,
                "ops": list(g.ops),
                "kind": g.kind,
                "source": g.source,
                "phase": phase(g.source),
                "shape": g.shape,
                "flops": g.flops,
                "bytes": g.bytes,
                "link_bytes": g.link_bytes,
                "seconds": g.seconds,
                "bound": g.bound,
                "asynchronous": g.asynchronous,
            }
            for g in p.top(top)
        ],
    }

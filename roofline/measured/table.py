"""The roofline table: one training step's napkin, XLA's count and the trace,
side by side, as lines of text (the Comparison of roofline/measured/compare.py).
"""

import os

from roofline.compiled.kinds import KIND_NOTES, KINDS
from roofline.flops import model_line
from roofline.measured.chart import roofline_chart
from roofline.measured.op_table import op_lines
from roofline.measured.profile import open_command
from roofline.units import ms


def _g(flops):
    return f"{flops / 1e9:,.2f} GFLOP"


def _seconds(s):
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.3f} s"


def _pct(x):
    return f"{100 * x:.1f}%"


def table_lines(c):
    """The comparison as text, one row per quantity, one column per source.

    The napkin's bytes are a lower bound, so its times are bounds (">="); XLA
    counts every operand of every op as if nothing stayed in cache, so its
    times are estimates ("~"), which a cache-friendly step can beat. FLOP/s
    and MFU always count model FLOPs, the exact count with attention."""
    cfg, g, n, x, t, u = c.cfg, c.ledger, c.napkin, c.xla, c.trace, c.use

    def row(label, napkin="-", xla="-", measured="-"):
        return f"{label:<26}{napkin:<24}{xla:<24}{measured}".rstrip()

    def model_flops_per_s(prediction):  # per device, if the step took the predicted time
        return g.exact / prediction.step_s / c.devices

    lines = [
        f"roofline: one training step, {c.batch} x {cfg.seq} = {g.tokens:,} tokens | "
        + f"{model_line(cfg, length=None)} | "
        + f"{cfg.dtype} | {c.devices} device{'s' if c.devices > 1 else ''}",
        f"roof: {c.roof_name}: {c.peak / 1e12:.3f} TFLOP/s and {c.bandwidth / 1e9:,.1f} GB/s "
        + f"per device, ridge {n.ridge:,.1f} FLOP/byte",
        "",
        row("", "napkin", "XLA's count", "measured (trace)"),
        row("FLOPs per step", f"{_g(g.napkin)} 6·B·P", _g(c.xla_flops) if c.xla_flops else "-"),
        row(
            "  with attention",
            f"{_g(g.exact)} exact",
            f"{100 * (c.xla_flops / g.exact - 1):+.1f}% vs exact" if c.xla_flops else "",
            "",
        ),
    ]
    if x:
        lines += [
            row(
                "bytes per step",
                f">= {c.bytes_bound / 1e9:,.3f} GB",
                f"{c.xla_bytes / 1e9:,.3f} GB",
            ),
            row("FLOPs per byte", f"{n.intensity:,.1f}", f"{x.intensity:,.1f}"),
            row("bound by", n.bound, x.bound),
        ]
    else:
        lines += [
            row("bytes per step", f">= {c.bytes_bound / 1e9:,.3f} GB"),
            row("FLOPs per byte", f"{n.intensity:,.1f}"),
            row("bound by", n.bound),
        ]
    step = [f">= {_seconds(n.step_s)}", f"~ {_seconds(x.step_s)}" if x else "-"]
    tokens = [f"<= {n.tokens_per_s:,.0f}", f"~ {x.tokens_per_s:,.0f}" if x else "-"]
    flops = [
        f"<= {model_flops_per_s(n) / 1e12:.3f}",
        f"~ {model_flops_per_s(x) / 1e12:.3f}" if x else "-",
    ]
    if t:
        step.append(f"{_seconds(t.step_s)} median of {len(t.steps)}")
        tokens.append(f"{g.tokens / t.step_s:,.0f}")
        flops.append(f"{u.flops_per_s / 1e12:.3f}")
    lines += [row("step time", *step), row("tokens/s", *tokens), row("TFLOP/s per device", *flops)]

    peaks, datasheet = [], c.roofs.datasheet
    if c.roofs.measured:
        peaks.append(("MFU vs measured ceiling", c.roofs.peak_flops, u.mfu_measured if u else None))
    if datasheet:
        peaks.append((f"MFU vs {datasheet.name}", c.peak, u.mfu_datasheet if u else None))
    for label, peak, measured in peaks:
        cells = [
            f"<= {_pct(model_flops_per_s(n) / peak)}",
            f"~ {_pct(model_flops_per_s(x) / peak)}" if x else "-",
        ]
        lines.append(row(label, *cells, _pct(measured) if measured is not None else "-"))
    if not datasheet:
        lines.append(row("MFU vs datasheet", "n/a: no datasheet peak (a CPU has none)", "", ""))
    if c.log_peak and u and all(abs(c.log_peak[0] / p - 1) > 1e-3 for _, p, _ in peaks):
        log_flops, source = c.log_peak
        lines.append(
            f"  (the training log's MFU is against {log_flops / 1e12:.3f} TFLOP/s, "
            f"{source}: {_pct(u.flops_per_s / log_flops)})"
        )

    if t:
        lines += [
            "",
            f"where the time went (mean step, {t.devices} device(s); ops of "
            + f"{t.module} classified by {t.classified_by}):",
        ]
        if t.buffered_kernels:
            lines.append(
                f"  {t.buffered_kernels:,.0f} kernels a step ran in command buffers (CUDA graphs), "
                f"each matched to its HLO op by {t.buffered_by} (roofline/measured/kernel_ops.py)"
            )
        seconds, fractions = t.kind_seconds(), t.kind_fractions()
        # The per-op prediction's seconds of each kind beside the trace's; it has
        # no idle time (no host in it), and its waits count to what is waited for.
        predicted = c.ops.seconds_by_kind if c.ops else None
        if predicted is not None:
            lines.append(f"  {'':<16}{'share':>7}  {'measured':>10}  {'predicted':>10}")
        for kind in sorted(KINDS, key=lambda k: -seconds[k]):
            beside = ""
            if predicted is not None:
                beside = f"  {ms(predicted[kind]) if kind in predicted else '-':>10}"
            lines.append(
                f"  {kind:<16}{_pct(fractions[kind]):>7}  {ms(seconds[kind]):>10}"
                f"{beside}   {KIND_NOTES[kind]}"
            )
        lines.append(
            "  steps traced: " + ", ".join(f"{s.step}: {_seconds(s.wall_s)}" for s in t.steps)
        )
    lines += [
        "",
        ">= and <=: bounds from the napkin (perfect overlap, each byte moved once); "
        + "~: estimates from XLA's count (no byte stays in cache)",
        "FLOP/s and MFU count model FLOPs, the exact count with attention, in every column",
    ]
    return lines


def report_lines(c, logdir, chart=True):
    """The table, then where the chart went and how to open the trace."""
    lines = table_lines(c)
    if c.ops:
        lines += op_lines(c)
    if chart:
        lines.append(f"roofline chart: {roofline_chart(c, os.path.join(logdir, 'roofline.png'))}")
    lines.append(f"open the trace: {open_command(logdir)}")
    return lines

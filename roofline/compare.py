"""Compare: three columns for the same training step.

    napkin     6·B·P, then the exact count with attention, and the bytes the
               step must move at least (roofline/flops.py), on the chip's roof
    XLA        what the compiler says the compiled step does:
               `compiled.cost_analysis()` flops and "bytes accessed"
    measured   the step time from a profiler trace (captured by roofline/profile.py,
               read by roofline/trace.py on any chip), the FLOP/s and MFU that
               implies, and where the time went

The napkin column gives lower bounds on the step time (the roofline:
roofline/predict.py); XLA's column an estimate, as if no byte it counts
stayed in a cache; the measured column says how far above them the step
really ran, and why. `roofline_chart` draws the same on the roofline plot.
"""

import dataclasses
import os

import jax

from roofline.flops import ledger, train_bytes
from roofline.hardware import datasheet_chip, measured_chip
from roofline.kinds import KIND_NOTES, KINDS
from roofline.predict import predict, utilisation
from roofline.profile import open_command
from roofline.record import METADATA, chip_record, save_metadata  # noqa: F401 (METADATA: scripts)
from roofline.trace import read_trace


def xla_cost(compiled_or_cost, devices=None):
    """(FLOPs, bytes accessed) of a whole step from XLA's cost analysis.

    Takes a `jax.stages.Compiled` or what its `cost_analysis()` returned: a dict,
    or in some jax versions a list with one dict per program. A program
    partitioned over several devices (SPMD) reports the work of one device,
    so it is multiplied by the device count (read from the compiled program's
    input shardings, or given as `devices`)."""
    cost = compiled_or_cost
    if hasattr(compiled_or_cost, "cost_analysis"):
        cost = compiled_or_cost.cost_analysis()
        if devices is None:
            shardings = jax.tree.leaves(compiled_or_cost.input_shardings)
            devices = max((len(s.device_set) for s in shardings), default=1)
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    devices = devices or 1
    return devices * float(cost["flops"]), devices * float(cost.get("bytes accessed", 0.0))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Every number of the table. Step FLOPs and bytes are for the whole step
    (all devices); peaks and bandwidths per device."""

    cfg: object  # the ModelConfig
    batch: int  # sequences per step
    devices: int
    ledger: object  # roofline.flops.Ledger
    bytes_bound: int  # roofline.flops.train_bytes(...).total
    roof_name: str  # which roof the predictions stand on
    peak: float  # FLOP/s per device of that roof
    bandwidth: float  # bytes/s per device of that roof
    napkin: object  # StepPrediction from the exact count and the bytes bound
    xla: object = None  # StepPrediction from XLA's counts, or None
    xla_flops: float | None = None
    xla_bytes: float | None = None
    trace: object = None  # roofline.trace.TraceProfile, or None
    use: object = None  # roofline.predict.Utilisation of the traced step, or None
    datasheet_name: str | None = None
    measured_peak: float | None = None  # the measured ceiling, FLOP/s per device
    measured_bandwidth: float | None = None
    log_peak: tuple | None = None  # (FLOP/s per device, source) the training log used
    measured_name: str = "measured on this machine"  # whose the measured roof is


def local_roofs(dtype, devices):
    """(datasheet Chip or None, measured FLOP/s per device, measured bytes/s per device).

    Simulated CPU devices share one host, so each gets its share of the host's
    measured figures."""
    chip = measured_chip(dtype)
    share = devices if jax.local_devices()[0].platform == "cpu" else 1
    return datasheet_chip(), chip.peak(dtype) / share, chip.hbm_bandwidth / share


def compare(
    cfg,
    batch,
    *,
    cost=None,
    trace=None,
    devices=1,
    datasheet=None,
    measured_peak=None,
    measured_bandwidth=None,
    log_peak=None,
    measured_name="measured on this machine",
):
    """The three columns for one training step of `batch` sequences.

    cost: (FLOPs, bytes) from `xla_cost`, or None. trace: a TraceProfile, or
    None. The predictions stand on the datasheet's roof when there is one,
    else on the measured one (a CPU), which measured_name says whose it is."""
    g = ledger(cfg, batch)
    bytes_bound = train_bytes(cfg, batch).total
    if datasheet is not None:
        roof_name = f"{datasheet.name} datasheet, {cfg.dtype}"
        peak, bandwidth = datasheet.peak(cfg.dtype), datasheet.hbm_bandwidth
    else:
        roof_name = measured_name
        peak, bandwidth = measured_peak, measured_bandwidth

    def bound(flops, bytes_moved):
        return predict(
            flops, bytes_moved, peak_flops=peak, bandwidth=bandwidth, tokens=g.tokens, chips=devices
        )

    xla = bound(*cost) if cost and cost[1] > 0 else None
    use = None
    if trace is not None:
        use = utilisation(
            g.exact,
            trace.step_s,
            chips=devices,
            measured_peak=measured_peak,
            datasheet_peak=datasheet.peak(cfg.dtype) if datasheet else None,
        )
    return Comparison(
        cfg=cfg,
        batch=batch,
        devices=devices,
        ledger=g,
        bytes_bound=bytes_bound,
        roof_name=roof_name,
        peak=peak,
        bandwidth=bandwidth,
        napkin=bound(g.exact, bytes_bound),
        xla=xla,
        xla_flops=cost[0] if cost else None,
        xla_bytes=cost[1] if cost else None,
        trace=trace,
        use=use,
        datasheet_name=datasheet.name if datasheet else None,
        measured_peak=measured_peak,
        measured_bandwidth=measured_bandwidth,
        log_peak=log_peak,
        measured_name=measured_name,
    )


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
        + f"L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} V={cfg.vocab} | "
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

    peaks = []
    if c.measured_peak:
        peaks.append(("MFU vs measured ceiling", c.measured_peak, u.mfu_measured if u else None))
    if c.datasheet_name:
        peaks.append((f"MFU vs {c.datasheet_name}", c.peak, u.mfu_datasheet if u else None))
    for label, peak, measured in peaks:
        cells = [
            f"<= {_pct(model_flops_per_s(n) / peak)}",
            f"~ {_pct(model_flops_per_s(x) / peak)}" if x else "-",
        ]
        lines.append(row(label, *cells, _pct(measured) if measured is not None else "-"))
    if not c.datasheet_name:
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
        seconds, fractions = t.kind_seconds(), t.kind_fractions()
        for kind in sorted(KINDS, key=lambda k: -seconds[k]):
            lines.append(
                f"  {kind:<16}{_pct(fractions[kind]):>7}  {_seconds(seconds[kind]):>10}"
                f"   {KIND_NOTES[kind]}"
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


def roofline_chart(c, path):
    """A PNG of the roofline: FLOP/s per device against FLOPs per byte, the roof(s),
    the napkin's best case and the measured step. Returns path."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    points = [c.napkin.intensity] + ([c.xla.intensity] if c.xla else [])
    lo, hi = min(*points, c.napkin.ridge) / 10, max(*points, c.napkin.ridge) * 10
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    roofs = [(c.roof_name, c.peak, c.bandwidth, "-")]
    if c.datasheet_name and c.measured_peak:
        roofs.append((c.measured_name, c.measured_peak, c.measured_bandwidth, "--"))
    for name, peak, bandwidth, style in roofs:
        ax.plot(
            xs, [min(peak, bandwidth * i) for i in xs], style, color="black", label=f"roof: {name}"
        )
    ax.plot(
        c.napkin.intensity,
        c.ledger.exact / c.napkin.step_s / c.devices,
        "o",
        label="napkin: best case (exact FLOPs, bytes lower bound)",
    )
    if c.xla:
        ax.plot(
            c.xla.intensity,
            c.ledger.exact / c.xla.step_s / c.devices,
            "s",
            label="XLA's count: estimate (no byte stays in cache)",
        )
    if c.use:
        intensity = c.xla.intensity if c.xla else c.napkin.intensity
        ax.plot(
            intensity,
            c.use.flops_per_s,
            "*",
            markersize=14,
            label=f"measured step ({c.trace.step_s * 1e3:,.1f} ms)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("FLOP/s per device")
    ax.set_title(f"roofline: {c.batch} x {c.cfg.seq} tokens, {c.cfg.dtype}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def profile_comparison(logdir, cfg, batch, compiled=None, peak=None, *, devices=None):
    """The Comparison for a training run traced into logdir.

    compiled: the compiled step (`jax.jit(step).lower(...).compile()`), or its
    `cost_analysis()` (per device of a program partitioned over `devices`), or
    (FLOPs, bytes) of the whole step, for the XLA column; None leaves it empty.
    peak: the (FLOP/s per device, source) pair the training log computed its
    MFU with (roofline.hardware.local_peak_flops). Also writes
    LOGDIR/roofline.json (roofline/record.py), with the chip this runs on and the
    roofs measured on it, so `python -m roofline compare LOGDIR` can redo the
    table on any machine."""
    devices = devices or jax.device_count()
    if compiled is None or isinstance(compiled, tuple):
        cost = compiled
    elif isinstance(compiled, (dict, list)):
        cost = xla_cost(compiled, devices)
    else:
        cost = xla_cost(compiled)
    datasheet, measured_peak, measured_bandwidth = local_roofs(cfg.dtype, devices)
    save_metadata(
        logdir,
        cfg,
        batch,
        cost,
        devices,
        chip_record(cfg.dtype, devices, measured_peak, measured_bandwidth),
    )
    hlo_text = compiled.as_text() if hasattr(compiled, "as_text") else None
    trace = read_trace(logdir, hlo_text=hlo_text)
    return compare(
        cfg,
        batch,
        cost=cost,
        trace=trace,
        devices=devices,
        datasheet=datasheet,
        measured_peak=measured_peak,
        measured_bandwidth=measured_bandwidth,
        log_peak=peak,
    )


def report_lines(c, logdir, chart=True):
    """The table, then where the chart went and how to open the trace."""
    lines = table_lines(c)
    if chart:
        lines.append(f"roofline chart: {roofline_chart(c, os.path.join(logdir, 'roofline.png'))}")
    lines.append(f"open the trace: {open_command(logdir)}")
    return lines


def profile_table(logdir, cfg, batch, compiled=None, peak=None, *, devices=None, chart=True):
    """The table for a training run traced into logdir, as lines to print; what
    `s2_train.py --profile DIR` prints at the end. Arguments as for
    `profile_comparison`; also writes LOGDIR/roofline.png (the chart)."""
    c = profile_comparison(logdir, cfg, batch, compiled, peak, devices=devices)
    return report_lines(c, logdir, chart)

"""The roofline chart: FLOP/s per device against FLOPs per byte, with the
roofs, the step's points (the Comparison of roofline/measured/compare.py) and, where
the compiled step's HLO was at hand, each op group of the step: where the
per-op prediction puts it (filled) and where the trace saw it (hollow), joined
by a thin line, sized by its time and coloured by its kind. As a PNG.
"""

import os

# One colour per kind of work (roofline.compiled.kinds.KINDS), the same in every chart.
KIND_COLOURS = {
    "matmul": "tab:blue",
    "elementwise": "tab:orange",
    "copy/transpose": "tab:green",
    "collective": "tab:red",
    "other": "tab:purple",
}


def _sizes(seconds, largest):
    """Marker areas (points^2) by time: the op that costs most is the biggest."""
    return [12 + 300 * s / largest for s in seconds]


def _draw_ops(ax, points):
    """The op groups' points on ax: predicted filled, measured hollow, joined."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    largest = max(max(p.seconds, p.measured_seconds or 0) for p in points)
    colours = [KIND_COLOURS.get(p.kind, "tab:gray") for p in points]
    measured = [p for p in points if p.measured]
    ax.add_collection(
        LineCollection(
            [[(p.intensity, p.predicted), (p.intensity, p.measured)] for p in measured],
            colors=[KIND_COLOURS.get(p.kind, "tab:gray") for p in measured],
            linewidths=0.6,
            alpha=0.5,
        )
    )
    ax.scatter(
        [p.intensity for p in points],
        [p.predicted for p in points],
        s=_sizes([p.seconds for p in points], largest),
        c=colours,
        alpha=0.6,
        edgecolors="none",
        gid="ops predicted",
    )
    if measured:
        ax.scatter(
            [p.intensity for p in measured],
            [p.measured for p in measured],
            s=_sizes([p.measured_seconds for p in measured], largest),
            facecolors="none",
            edgecolors=[KIND_COLOURS.get(p.kind, "tab:gray") for p in measured],
            linewidths=0.8,
            gid="ops measured",
        )
    kinds = sorted({p.kind for p in points}, key=list(KIND_COLOURS).index)
    handles = [
        Line2D([], [], marker="o", ls="", color=KIND_COLOURS[k], label=f"ops: {k}") for k in kinds
    ]
    handles.append(
        Line2D([], [], marker="o", ls="", mfc="none", color="gray", label="ops, measured (hollow)")
    )
    return handles


def roofline_figure(c):
    """(figure, [OpPoint] drawn) of the roofline chart: the roof(s), the napkin's
    best case, XLA's estimate and the measured step, and each op group of the
    step that does arithmetic (roofline.measured.op_table.op_points)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    from roofline.measured.op_table import op_points

    points = op_points(c)
    xs_seen = [c.napkin.intensity, c.napkin.ridge] + ([c.xla.intensity] if c.xla else [])
    xs_seen += [p.intensity for p in points]
    lo, hi = min(xs_seen) / 10, max(xs_seen) * 10
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    roofs = [(c.roof_name, c.peak, c.bandwidth, "-")]
    if c.roofs.datasheet and c.roofs.measured:
        r = c.roofs
        roofs.append((r.name, r.peak_flops, r.bandwidth, "--"))
    if c.ops and c.ops.roofs.vector_peak < c.ops.roofs.peak_flops:
        r = c.ops.roofs  # elementwise work has a lower roof on a GPU
        roofs.append((f"{r.name}, vector units", r.vector_peak, r.bandwidth, ":"))
    for name, peak, bandwidth, style in roofs:
        ax.plot(
            xs, [min(peak, bandwidth * i) for i in xs], style, color="black", label=f"roof: {name}"
        )
    handles = _draw_ops(ax, points) if points else []
    ax.plot(
        c.napkin.intensity,
        c.ledger.exact / c.napkin.step_s / c.devices,
        "o",
        color="black",
        label="step, napkin: best case (exact FLOPs, bytes lower bound)",
    )
    if c.xla:
        ax.plot(
            c.xla.intensity,
            c.ledger.exact / c.xla.step_s / c.devices,
            "s",
            color="dimgray",
            label="step, XLA's count: estimate (no byte stays in cache)",
        )
    if c.use:
        intensity = c.xla.intensity if c.xla else c.napkin.intensity
        ax.plot(
            intensity,
            c.use.flops_per_s,
            "*",
            color="gold",
            markeredgecolor="black",
            markersize=14,
            label=f"step, measured ({c.trace.step_s * 1e3:,.1f} ms)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("FLOP/s per device")
    title = f"roofline: {c.batch} x {c.cfg.seq} tokens, {c.cfg.dtype}"
    if points:
        title += f"; {len(points)} op groups, sized by time"
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    legend = ax.get_legend_handles_labels()[0] + handles  # beside the plot: it hides no point
    ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig, points


def roofline_chart(c, path):
    """roofline_figure(c) as a PNG at path. Returns path."""
    import matplotlib.pyplot as plt

    fig, _ = roofline_figure(c)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path

"""The roofline chart: FLOP/s per device against FLOPs per byte, with the
roofs and the step's points (the Comparison of roofline/compare.py), as a PNG.
"""

import os


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

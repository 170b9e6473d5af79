"""The end of a run: a summary a student can compare across runs, and a PNG
of the loss curve."""

import os


def summary_lines(
    history, *, train_seconds, tokens_per_step, flops_per_step, peak, n_devices, unigram, first_step
):
    """The closing summary. Throughput is over every step timed (compile excluded)."""
    steps = history[-1]["step"] - first_step
    seconds_per_step = train_seconds / max(steps, 1)
    achieved = flops_per_step / seconds_per_step
    val = [r["val_loss"] for r in history if "val_loss" in r]
    peak_flops, peak_source = peak
    lines = [
        "summary",
        (
            f"  throughput  {tokens_per_step / seconds_per_step:,.0f} tokens/s, "
            f"{seconds_per_step * 1e3:.1f} ms/step, "
            f"{achieved / n_devices / 1e12:.3f} TFLOP/s per device"
        ),
        (
            f"  MFU         {100 * achieved / (peak_flops * n_devices):.1f}% "
            f"of {peak_flops / 1e12:.3f} TFLOP/s per device ({peak_source})"
        ),
        f"  train loss  {history[-1]['loss']:.3f} nats/byte",
    ]
    if val:
        lines.append(f"  val loss    {val[-1]:.3f} nats/byte")
    lines.append(f"  unigram     {unigram:.3f} nats/byte (byte frequencies alone, no context)")
    return lines


def plot_loss(history, path, unigram, title):
    """Train and validation loss against step, with the unigram baseline."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in history], [r["loss"] for r in history], label="train")
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.axhline(unigram, color="gray", linestyle="--", label="unigram baseline")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path

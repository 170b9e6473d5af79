"""The end of a run: a summary a student can compare across runs, and a PNG
of the loss curve."""

import os

import numpy as np

from roofline.decode_cost import decode_step_cost, flops_per_sequence
from sessions.loop import impossible_mfu


def summarize(
    history,
    *,
    train_seconds,
    tokens_per_step,
    flops_per_step,
    peak,
    n_devices,
    unigram,
    first_step,
    memory=(None, ""),
    allocator=(None, ""),
):
    """The run in numbers (what --summary-out writes). Throughput is over every
    step timed, compilation excluded. memory: (bytes per device, source) from
    roofline.memory.step_memory; allocator: the same from allocator_peak, the
    second figure, where the backend keeps one."""
    steps = history[-1]["step"] - first_step
    seconds_per_step = train_seconds / max(steps, 1)
    achieved = flops_per_step / seconds_per_step
    val = [r["val_loss"] for r in history if "val_loss" in r]
    peak_flops, peak_source = peak
    mfu = achieved / (peak_flops * n_devices)
    return {
        "steps": history[-1]["step"],
        "step_time_s": seconds_per_step,
        "tokens_per_sec": tokens_per_step / seconds_per_step,
        "tflops_per_device": achieved / n_devices / 1e12,
        "mfu": mfu,  # kept as computed; the flag says when it is no result
        "mfu_exceeds_peak": impossible_mfu(mfu),
        "peak_tflops_per_device": peak_flops / 1e12,
        "peak_source": peak_source,
        "train_loss": history[-1]["loss"],
        "val_loss": val[-1] if val else None,
        "unigram": unigram,
        "memory_bytes_per_device": memory[0],
        "memory_source": memory[1],
        "allocator_peak_bytes_per_device": allocator[0],
        "allocator_peak_source": allocator[1],
    }


def summary_lines(s):
    throughput = (
        f"  throughput  {s['tokens_per_sec']:,.0f} tokens/s, {s['step_time_s'] * 1e3:.1f} "
        f"ms/step, {s['tflops_per_device']:.3f} TFLOP/s per device"
    )
    mfu = (
        f"  MFU         {100 * s['mfu']:.1f}% of {s['peak_tflops_per_device']:.3f} TFLOP/s per "
        f"device ({s['peak_source']})"
    )
    if impossible_mfu(s["mfu"]):
        mfu = (
            f"  MFU         n/a: {100 * s['mfu']:.0f}% of the assumed "
            f"{s['peak_tflops_per_device']:.3f} TFLOP/s per device is impossible, so the peak "
            f"({s['peak_source']}) is wrong for this chip"
        )
    lines = ["summary", throughput, mfu, f"  train loss  {s['train_loss']:.3f} nats/byte"]
    if s["val_loss"] is not None:
        lines.append(f"  val loss    {s['val_loss']:.3f} nats/byte")
    lines.append(f"  unigram     {s['unigram']:.3f} nats/byte (byte frequencies alone, no context)")
    if s["memory_bytes_per_device"] is not None:
        lines.append(
            f"  memory      {s['memory_bytes_per_device'] / 2**20:,.1f} MiB per device "
            f"({s['memory_source']})"
        )
    if s.get("allocator_peak_bytes_per_device") is not None:
        lines.append(
            f"  allocator   {s['allocator_peak_bytes_per_device'] / 2**20:,.1f} MiB per device "
            f"({s['allocator_peak_source']})"
        )
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


def plot_decode(measured, cfg, peak, bandwidth, path):
    """Decode tokens/s against batch: `measured` [(batch, tokens/s)], beside the
    memory roof (batch over the time to read the weights and B caches) and the
    compute roof (peak over FLOPs per token), for peak FLOP/s and bandwidth."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    batches = np.unique(np.geomspace(1, max(b for b, _ in measured) * 4, 60).round())
    memory = [
        b / decode_step_cost(cfg, int(b), peak_flops=peak, bandwidth=bandwidth).memory_s
        for b in batches
    ]
    compute = peak / flops_per_sequence(cfg)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.loglog(batches, memory, "C0--", label="memory roof: batch · bandwidth / bytes per step")
    ax.axhline(compute, color="C1", linestyle="--", label="compute roof: peak / FLOPs per token")
    ax.loglog(*zip(*measured), "ko-", label="measured")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"decode, L={cfg.layers} E={cfg.embed} T={cfg.seq}, {cfg.dtype}")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path

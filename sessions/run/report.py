"""What a run prints: its header, the summary a student compares across runs,
and PNGs of the loss curve and of decode against its roofline."""

import os

import jax
import numpy as np

from roofline.decode_cost import compute_bound_batch, decode_step_cost, flops_per_sequence
from roofline.flops import model_line, napkin_train_flops, param_count
from roofline.timing import steadiness
from sessions.train import data
from sessions.train.meter import impossible_mfu, run_utilisation


def header_lines(run, flops, peak, corpus, unigram):
    """What session 2 prints before training: the devices, the model and its levers,
    the step's FLOPs, the peak MFU is measured against, the data and its passes."""
    cfg, tc = run.model, run.train
    devices, processes = jax.devices(), jax.process_count()
    on = {True: "on", False: "off"}
    levers = [f"remat {cfg.remat}"] * (cfg.remat != "none") + ["layers scanned"] * cfg.scan_layers
    levers += [tc.stored] * (tc.weights != "float32")
    levers += ["sequence parallel"] * cfg.sequence_parallel  # the stream S/tp between blocks
    return [
        f"session 2 | preset {run.preset} | {len(devices)} x {devices[0].device_kind} "
        f"({processes} process{'es' if processes > 1 else ''})",
        f"model: {model_line(cfg)} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype} "
        f"matmuls | attention {on[cfg.attention]}, "
        f"positions {'rotary' if cfg.positions and cfg.rope else on[cfg.positions]}"
        + "".join(f" | {lever}" for lever in levers),
        f"step: {tc.batch} x {cfg.seq} = {tc.batch * cfg.seq:,} tokens | 6·B·P = "
        f"{napkin_train_flops(cfg, tc.batch) / 1e9:.2f} GFLOP | exact with attention = "
        f"{flops / 1e9:.2f} GFLOP",
        f"peak: {peak[0] / 1e12:.3f} TFLOP/s per device ({peak[1]})",
        *([f"data: {corpus.note}"] if corpus.note else []),
        f"data: {corpus.name}",
        f"      {len(corpus.train):,} train / {len(corpus.val):,} val {corpus.unit}s | unigram "
        f"baseline {unigram:.3f} nats/{corpus.unit}",
        *data.passes_lines(corpus, tc.steps * tc.batch * cfg.seq, tc.steps),
    ] + ([f"attention: {run.attention_note}"] if run.attention_note else [])


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
    unit="byte",
    platform=None,
    memory=(None, ""),
    allocator=(None, ""),
    corpus="",
    passes=None,
):
    """The run in numbers (what --summary-out writes). Throughput is over every
    step timed, compilation excluded. platform: where its n_devices were ("cpu",
    "gpu", "tpu"), so a reader (scripts/ladder.py) can check that it ran where it
    meant to. memory: (bytes per device, source) from roofline.memory.step_memory;
    allocator: the same from allocator_peak, the second figure, where the backend
    keeps one. corpus: the data's name, for the remedies if the run memorized it;
    passes: how often the whole run goes over its training split."""
    steps = history[-1]["step"] - first_step
    seconds_per_step = train_seconds / max(steps, 1)
    val = [(r["val_loss"], r["step"]) for r in history if "val_loss" in r]
    peak_flops, peak_source = peak
    flops_per_s, mfu = run_utilisation(flops_per_step, seconds_per_step, peak_flops, n_devices)
    gap, gap_train, gap_steps = final_gap(history)
    earlier = earlier_evaluation(history)
    # Each log interval's seconds per token: equal intervals, so as their seconds.
    intervals = [1 / r["tokens_per_sec"] for r in history if r.get("tokens_per_sec")]
    return {
        "platform": platform,
        "n_devices": n_devices,
        "steps": history[-1]["step"],
        "step_time_s": seconds_per_step,
        "tokens_per_sec": tokens_per_step / seconds_per_step,
        "tflops_per_device": flops_per_s / 1e12,
        "mfu": mfu,  # kept as computed; the flag says when it is no result
        "mfu_exceeds_peak": impossible_mfu(mfu),
        # max |interval - median| / median of the log intervals after the first
        "steadiness": steadiness(intervals) if len(intervals) > 2 else None,
        "peak_tflops_per_device": peak_flops / 1e12,
        "peak_source": peak_source,
        "train_loss": history[-1]["loss"],
        "val_loss": val[-1][0] if val else None,
        # Where validation was lowest: a run past its data's worth ends above it.
        "best_val_loss": min(val)[0] if val else None,
        "best_val_step": min(val)[1] if val else None,
        # The last validation loss minus the training loss there (final_gap).
        "val_gap": gap,
        "val_gap_train_loss": gap_train,
        "val_gap_train_steps": gap_steps,
        # An evaluation a third of the run back, {step, val_loss, val_gap}: the trend.
        "val_earlier": earlier,
        "memorizing": memorizing(gap, val[-1][0] if val else None, earlier, passes),
        "corpus": corpus,
        "passes": passes,
        "unigram": unigram,
        "unit": unit,  # what the losses are per: "byte", or "token" for token files
        "memory_bytes_per_device": memory[0],
        "memory_source": memory[1],
        "allocator_peak_bytes_per_device": allocator[0],
        "allocator_peak_source": allocator[1],
    }


def final_gap(history):
    """(gap, training loss, its steps) at the last validation, nats per token: the
    validation loss minus the mean of the training losses logged at that step and
    at the log step before it; (None, None, []) if the run never validated. Each
    logged loss is one batch's and noisy; two halve its variance. While the loss
    still falls their mean trails by half a log interval, so the gap reads low: by
    0.01 nats at the end of the H100's 2,000-step course run, by more early on."""
    evaluated = [i for i, r in enumerate(history) if "val_loss" in r]
    if not evaluated:
        return None, None, []
    last = evaluated[-1]
    logged = history[max(last - 1, 0) : last + 1]
    train = sum(r["loss"] for r in logged) / len(logged)
    return history[last]["val_loss"] - train, train, [r["step"] for r in logged]


def earlier_evaluation(history):
    """{step, val_loss, val_gap} at the last evaluation a third of the run or more before the
    last one (else the first), its gap as final_gap takes the last one's; None if the run
    validated once or never. Over less, the gap's change drowns in the noise of the logged
    training losses."""
    evaluated = [i for i, r in enumerate(history) if "val_loss" in r]
    if len(evaluated) < 2:
        return None
    final = history[evaluated[-1]]["step"]
    back = [i for i in evaluated[:-1] if history[i]["step"] <= final * 2 / 3]
    i = back[-1] if back else evaluated[0]
    gap = final_gap(history[: i + 1])[0]
    return {"step": history[i]["step"], "val_loss": history[i]["val_loss"], "val_gap": gap}


def memorizing(gap, val_loss, earlier, passes=None):
    """Whether the run has begun to memorize its data: its final gap past MAX_GAP and, since the
    earlier evaluation, grown by more than validation fell: those steps taught the text more
    than the language. A gap growing slower is a model still learning; with one evaluation,
    the gap alone decides. A run not yet once over its data met each training batch as new,
    as it meets validation: its gap is noise, or the splits' difference."""
    if gap is None or gap <= data.MAX_GAP or (passes is not None and passes <= 1):
        return False
    if earlier is None:
        return True
    return gap - earlier["val_gap"] > earlier["val_loss"] - val_loss


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
    unit = s["unit"]
    lines = ["summary", throughput, mfu]
    if s.get("steadiness") is not None:
        lines.append(
            f"  steadiness  {100 * s['steadiness']:.1f}%: the log interval farthest from their "
            "median, after the first"
        )
    lines.append(f"  train loss  {s['train_loss']:.3f} nats/{unit}")
    if s["val_loss"] is not None:
        best = f"best {s['best_val_loss']:.3f} at step {s['best_val_step']:,}"
        lines.append(f"  val loss    {s['val_loss']:.3f} nats/{unit} ({best})")
    if s.get("val_gap") is not None:
        steps = [f"{step:,}" for step in s["val_gap_train_steps"]]
        at = f"the mean at steps {' and '.join(steps)}" if len(steps) > 1 else f"step {steps[0]}"
        lines.append(
            f"  val - train {s['val_gap']:+.3f} nats/{unit} (train loss "
            f"{s['val_gap_train_loss']:.3f}, {at})"
        )
        earlier = s.get("val_earlier")
        if earlier:  # how both moved since: memorizing() compares them
            lines.append(
                f"              since step {earlier['step']:,}: the gap "
                f"{s['val_gap'] - earlier['val_gap']:+.3f}, validation "
                f"{s['val_loss'] - earlier['val_loss']:+.3f}"
            )
        if s.get("memorizing"):
            why = " and growing faster than validation falls" if earlier else ""
            lines.append(
                f"  warning: past a gap of {data.MAX_GAP} nats/{unit}{why}, the run has begun "
                f"to memorize its data; try {data.remedies(s.get('corpus') or '')}"
            )
    lines.append(
        f"  unigram     {s['unigram']:.3f} nats/{unit} ({unit} frequencies alone, no context)"
    )
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


def plot_loss(history, path, unigram, title, unit="byte"):
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
    ax.set_ylabel(f"loss (nats/{unit})")
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
    ax.set_title(f"decode, {model_line(cfg, length='T', vocab=False)}, {cfg.dtype}")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def decode_table_lines(rows, cfg, prefill_batch, prompt_len, peak, bandwidth):
    """s3_infer.py's table: prefill, then per batch the decode step against its roofline.
    rows: (roofline DecodeStep, Achieved, prefill seconds) per batch."""
    lines = []
    prefill_s = rows[-1][2]
    lines.append(
        f"prefill: {prefill_batch} x {prompt_len} tokens in {prefill_s * 1e3:.1f} ms, "
        f"{prefill_batch * prompt_len / prefill_s:,.0f} tokens/s"
    )
    lines.append(
        f"  {'batch':>5} {'ms/step':>9} {'tokens/s':>10} {'MB/step':>9} {'mem ms':>8} "
        f"{'flop ms':>8} {'roof tok/s':>10} {'MBU':>6} {'MFU':>6}"
    )
    for s, g, _ in rows:
        lines.append(
            f"  {s.batch:>5} {g.step_s * 1e3:>9.2f} {g.tokens_per_s:>10,.0f} {s.bytes / 1e6:>9.1f} "
            f"{s.memory_s * 1e3:>8.2f} {s.compute_s * 1e3:>8.3f} {s.tokens_per_s:>10,.0f} "
            f"{100 * g.mbu:>5.1f}% {100 * g.mfu:>5.1f}%"
        )
    with_cache = compute_bound_batch(cfg, peak_flops=peak, bandwidth=bandwidth)
    napkin = compute_bound_batch(cfg, peak_flops=peak, bandwidth=bandwidth, cache=False)
    where = f"from batch {with_cache:,.0f}" if with_cache else f"at no batch (T={cfg.seq})"
    lines.append(
        f"decode turns compute-bound {where}; with the cache's bytes left out it would from batch "
        f"{napkin:,.0f}: each sequence's cache is its own and is read every step"
    )
    return lines

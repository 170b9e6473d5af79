"""Prediction: how fast can a step possibly run, and how close did it come?

A step must do its FLOPs and move its bytes. A chip does at most `peak` FLOP/s
and moves at most `bandwidth` bytes/s, so the step takes at least

    compute time = FLOPs / peak            memory time = bytes / bandwidth

and at least the larger of the two, even if the two overlap perfectly. Which
one is larger is decided by the step's arithmetic intensity, FLOPs per byte,
against the chip's ridge point, peak / bandwidth: above the ridge the step is
compute-bound, below it memory-bound. (The roofline model: Williams, Waterman
and Patterson 2009, "Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4); in this course's letters, How to Scale
Your Model, jax-ml/scaling-book, chapter 1.)

Model FLOPs utilisation (MFU) is the other direction: the FLOPs the model
needs per step (not counting recomputation), divided by the measured step
time, over the peak (Chowdhery et al. 2022, "PaLM", appendix B).
"""

from typing import NamedTuple

from roofline.flops import flash_kernel, ledger, ledger_lines, model_line, train_bytes


class StepPrediction(NamedTuple):
    """The roofline's verdict on one step. Times in seconds; FLOPs and bytes for the
    whole step over all chips."""

    flops: float
    bytes: float
    intensity: float  # FLOPs per byte
    ridge: float  # the chip's peak / bandwidth, FLOPs per byte
    compute_s: float  # flops / (peak * chips): no step is faster
    memory_s: float  # bytes / (bandwidth * chips): no step is faster
    bound: str  # "compute" or "memory": the larger of the two times
    step_s: float  # max(compute_s, memory_s): the best case
    tokens_per_s: float  # tokens per step / step_s: the best case


def predict(flops, bytes_moved, *, peak_flops, bandwidth, tokens, chips=1):
    """Both lower bounds on a step's time and the one that applies.

    compute_s = flops / (chips · peak_flops)
    memory_s  = bytes / (chips · bandwidth)   (the work split evenly over chips)
    step_s    = max(compute_s, memory_s)       (perfect overlap of the two)

    A real step is slower: kernels do not reach peak, communication between
    chips is not counted, and the overlap is never perfect."""
    if min(flops, bytes_moved, peak_flops, bandwidth, tokens, chips) <= 0:
        raise ValueError("flops, bytes, peak, bandwidth, tokens and chips must be positive")
    compute_s = flops / (chips * peak_flops)
    memory_s = bytes_moved / (chips * bandwidth)
    step_s = max(compute_s, memory_s)
    return StepPrediction(
        flops=flops,
        bytes=bytes_moved,
        intensity=flops / bytes_moved,
        ridge=peak_flops / bandwidth,
        compute_s=compute_s,
        memory_s=memory_s,
        bound="compute" if compute_s >= memory_s else "memory",
        step_s=step_s,
        tokens_per_s=tokens / step_s,
    )


def predict_train_step(cfg, batch, chip, dtype=None, chips=1):
    """The roofline's best case for one training step of `batch` sequences.

    FLOPs: the exact count with attention in full (roofline/flops.py `ledger`),
    what the chip actually executes. Bytes: the lower bound of `train_bytes`.
    dtype picks the chip's peak (default: cfg.dtype)."""
    g = ledger(cfg, batch)
    return predict(
        g.exact,
        train_bytes(cfg, batch).total,
        peak_flops=chip.peak(dtype or cfg.dtype),
        bandwidth=chip.hbm_bandwidth,
        tokens=g.tokens,
        chips=chips,
    )


def comm_time(collectives, chip):
    """(link bytes/s one direction, seconds to send the collectives' link bytes
    over it): the communication bound of a step, beside compute_s and memory_s.

    link   = interconnect / 2               (the datasheet figure counts both directions)
    comm_s = sum of link bytes / link       (each collective on a ring of its group:
                                             roofline/compiled/program.py `link_bytes`,
                                             How to Scale Your Model, chapter 3)

    collectives: {kind: roofline.compiled.program.Collective}. The time is None
    where the chip has no interconnect figure and something must be sent."""
    link = chip.link
    sent = sum(c.bytes for c in collectives.values())
    return link, sent / link if link else (None if sent else 0.0)


class Utilisation(NamedTuple):
    """How much of the chips a measured step used."""

    step_s: float  # measured seconds per step
    flops_per_s: float  # model FLOPs / step_s, per chip
    datasheet_peak: float | None  # FLOP/s per chip from the datasheet (None: no datasheet)
    measured_peak: float | None  # FLOP/s per chip measured by roofline/calibrate.py
    mfu_datasheet: float | None  # flops_per_s / datasheet_peak
    mfu_measured: float | None  # flops_per_s / measured_peak


def utilisation(flops, step_s, *, datasheet_peak=None, measured_peak=None, chips=1):
    """MFU of a step that took step_s seconds to do `flops` model FLOPs on `chips`.

    MFU = flops / step_s / (chips · peak)   (PaLM, appendix B)

    Against the datasheet it says how much of the chip you paid for you used;
    against the measured ceiling, how much of what a plain large matmul reaches
    on this machine. A CPU has no trustworthy datasheet figure, so there only
    the measured one is given; on an accelerator, a measured ceiling far below
    the datasheet means a wrong table entry or a throttled chip."""
    if step_s <= 0 or chips <= 0:
        raise ValueError("step time and chips must be positive")
    per_chip = flops / step_s / chips
    return Utilisation(
        step_s=step_s,
        flops_per_s=per_chip,
        datasheet_peak=datasheet_peak,
        measured_peak=measured_peak,
        mfu_datasheet=per_chip / datasheet_peak if datasheet_peak else None,
        mfu_measured=per_chip / measured_peak if measured_peak else None,
    )


class TrainingRun(NamedTuple):
    """A whole training run at a given MFU: its FLOPs and its wall-clock time."""

    tokens: int
    flops: int  # 6·T·P_matmul + attention in full: the count MFU divides (PaLM's)
    napkin_flops: int  # 6·T·P: every parameter, attention left out
    seconds: float
    days: float
    chip_hours: float


def training_run(cfg, tokens, *, peak_flops, mfu, chips=1):
    """`tokens` of training on `chips`, each doing mfu x peak_flops of model FLOPs:

    flops = T · (6·P_matmul + 12·L·H·D·S)   the ledger's exact count per token, the
                                            one MFU is measured against (PaLM, appendix B:
                                            6·N + 12·L·H·Q·T per token)
    time  = flops / (chips · peak · mfu)

    Against that definition an MFU turns into time; 6·T·P (napkin_flops) is beside
    it for the papers that count that way."""
    if not 0 < mfu <= 1:
        raise ValueError(f"MFU is a fraction in (0, 1], got {mfu}")
    # ledger(cfg, 1).exact is one sequence of S tokens: S·(6·P_matmul + 12·L·H·D·S).
    flops = tokens * ledger(cfg, 1).exact // cfg.seq
    seconds = flops / (chips * peak_flops * mfu)
    return TrainingRun(
        tokens=tokens,
        flops=flops,
        napkin_flops=6 * tokens * ledger(cfg, 1).params,
        seconds=seconds,
        days=seconds / 86_400,
        chip_hours=chips * seconds / 3_600,
    )


def train_step_lines(cfg, batch, chip, dtype, chips=1):
    """One training step of `batch` sequences on `chips` x `chip` as `python -m
    roofline predict` prints it: the step, the chip, the ledger, the bytes, the bounds."""
    p = predict_train_step(cfg, batch, chip, dtype=dtype, chips=chips)
    b = train_bytes(cfg, batch)
    kept = "with" if cfg.attention and not flash_kernel(cfg) else "without"
    return [
        f"step: {batch} x {cfg.seq} = {batch * cfg.seq:,} tokens | "
        + f"{model_line(cfg, length=None)} | {dtype}, "
        + f"{cfg.attention_impl} attention",
        f"chip: {chips} x {chip.name}: {chip.peak(dtype) / 1e12:,.1f} TFLOP/s {dtype}, "
        + f"{chip.hbm_bandwidth / 1e9:,.0f} GB/s memory ({chip.source})",
        "",
        *ledger_lines(cfg, batch),
        "",
        f"bytes per step, lower bound: {b.total / 1e9:,.2f} GB",
        f"  weights read once       {b.weights / 1e9:10,.2f} GB   float32 master copy",
        f"  gradients written once  {b.gradients / 1e9:10,.2f} GB   float32",
        f"  optimizer (AdamW)       {b.optimizer / 1e9:10,.2f} GB   "
        + "reads weights, gradients, m, v; writes weights, m, v",
        f"  activations (backward)  {b.activations / 1e9:10,.2f} GB   "
        + f"written and read once, {kept} the attention probabilities",
        "",
        "roofline (lower bounds: no step can be faster)",
        f"  compute-bound  {p.compute_s * 1e3:10,.2f} ms   exact FLOPs / (chips x peak)",
        f"  memory-bound   {p.memory_s * 1e3:10,.2f} ms   bytes / (chips x bandwidth)",
        f"  intensity {p.intensity:,.1f} FLOP/byte against a ridge of {p.ridge:,.1f}: "
        + f"{p.bound}-bound",
        f"  best case: {p.step_s * 1e3:,.2f} ms per step, {p.tokens_per_s:,.0f} tokens/s "
        + f"(MFU {100 * p.compute_s / p.step_s:.0f}% at that speed)",
    ]


def training_run_lines(run, chip, dtype, chips, mfu):
    """A TrainingRun as text: its two FLOP counts and its days."""
    return [
        f"training run: {run.tokens:,} tokens",
        f"  {run.flops:.4g} FLOP   6·T·P_matmul + attention in full (12·L·H·D·S a token): "
        + "the count MFU divides",
        f"  {run.napkin_flops:.4g} FLOP   6·T·P, every parameter, attention left out",
        f"  {run.days:,.2f} days on {chips:,} x {chip.name} at MFU {mfu:.0%} of "
        + f"{chip.peak(dtype) / 1e12:,.1f} TFLOP/s {dtype} ({run.chip_hours:,.0f} chip-hours)",
    ]

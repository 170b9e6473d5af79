"""Serving a model on N chips, on a napkin: for each batch, the decode step's bytes,
whether they fit, its lower bound and tokens/s; the critical batch; the time to the
first token (python -m roofline decode).

Per decode step of B sequences at T cached positions (roofline/decode_cost.py):

    held   = W_held + B·C          every weight whole, and B caches: must fit N x HBM
    read   = W_read + B·C          what the step reads: each matmul weight once, a row of
                                   each table, B caches
    step   >= max(read / (N·bandwidth), B·f / (N·peak), kernels · launch)   tokens/s = B / step

    B* = (W_read / bandwidth) / (f / peak − C / bandwidth)    compute-bound from B*, never
                                                              when C / bandwidth >= f / peak
    TTFT >= max(prefill FLOPs / (N·peak), (W_read + C_prompt) / (N·bandwidth))

The third bound is the step's kernel launches (roofline/launch_bound.py): with no
compiled program at hand, kernels a token = L x a layer's kernels + those outside the
layers, XLA's as read off GPT-2's decode compiled for h100:1 unless told a layer's
count (2 for a decode layer fused into two kernels); each launch costs the chip
family's sourced figure, none on a TPU or a CPU.

Assumptions: N chips share the work by tensor parallelism, each holding and reading
1/N of the weights and caches and doing 1/N of the FLOPs, and the links between them
cost nothing (their all-reduces are left out); where N exceeds the KV heads K, real
tensor parallelism copies each KV head onto N/K chips, which this leaves out too.
What HBM also holds besides weights and caches (activations, logits, the runtime's
workspace) is left out, so a batch near the limit may not fit in practice. int8
weights multiply in the compute dtype, at its peak. A batch that does not fit is
still planned (as if it did) and marked so.
"""

import dataclasses
import math
from typing import NamedTuple

from roofline import decode_cost
from roofline.flops import model_line, param_count
from roofline.launch_bound import (
    OUR_KERNELS_OUTSIDE,
    OUR_KERNELS_PER_LAYER,
    XLA_KERNELS_OUTSIDE,
    XLA_KERNELS_PER_LAYER,
    estimated_kernels,
    launch_bound,
    launch_cost,
)
from roofline.memory import usable_line
from roofline.predict import predict
from roofline.units import capacity, gb, ms


class BatchPlan(NamedTuple):
    """One decode step of `batch` sequences: bytes, whether they fit, its bound."""

    batch: int
    kv_cache_bytes: int  # the B caches
    total_bytes: int  # every weight, whole, plus the caches: what must fit in HBM
    fits: bool  # total_bytes <= chips x hbm_bytes
    step: decode_cost.DecodeStep  # its bytes read, FLOPs and lower bound, over the N chips
    launch: object  # roofline.launch_bound.LaunchBound: with the launches, which binds


class ServingPlan(NamedTuple):
    """A model served on `chips` x `chip`: its bytes, each batch's step, B*, the first token."""

    cfg: object  # the ModelConfig planned; cfg.seq is the context T
    chip: object  # roofline.chip.Chip
    chips: int
    dtype: str  # the compute dtype: the matmuls' peak, and what is not int8
    weights: str | None  # None (the compute dtype) or "int8"
    cache: str | None
    params: int
    held_weight_bytes: int
    read_weight_bytes: int
    cache_per_sequence: int
    batches: list
    critical_batch: float | None  # B*, decode_cost.compute_bound_batch
    napkin_batch: float  # B* with the cache's bytes left out (its FLOPs kept)
    max_batch: int  # the most sequences whose caches fit beside the weights
    fewest_chips: tuple  # (for the weights alone, with the largest batch's caches); None: none
    prompt: int
    ttft: object  # roofline.predict.StepPrediction of prefilling one prompt
    kernels: int  # kernels a decode token launches (an estimate: launch_bound.estimated_kernels)
    kernels_per_layer: int | None  # as given, or None: XLA's
    per_launch: object  # roofline.launch_bound.LaunchCost of the chip


def splits_heads(cfg, n):
    """Whether n chips of tensor parallelism split the query heads evenly, and the key/value
    heads too: a share of them each (n divides K), or a copy of one (K divides n)."""
    K = cfg.n_kv_heads
    return cfg.heads % n == 0 and (K % n == 0 or n % K == 0)


def fewest_chips(cfg, chip, held):
    """The fewest chips that split the heads and whose HBM holds `held` bytes, or None."""
    counts = (n for n in range(1, cfg.heads + 1) if splits_heads(cfg, n))
    return next((n for n in counts if held <= n * chip.hbm_bytes), None)


def plan_serving(
    cfg,
    chip,
    *,
    batches,
    prompt,
    context=None,
    chips=1,
    weights=None,
    cache=None,
    kernels_per_layer=None,
):
    """ServingPlan of `cfg` (its dtype the compute dtype) at `context` cached positions
    (None: cfg.seq) on `chips` of `chip`, for each of `batches`, and a prompt of `prompt`
    tokens. The weights held are the whole model's: its positional table has cfg.seq rows.
    kernels_per_layer: the kernels a decode layer launches (None: XLA's)."""
    held = decode_cost.stored_weight_bytes(cfg, weights=weights)
    params = param_count(cfg)
    cfg = dataclasses.replace(cfg, seq=context or cfg.seq)
    dtype = cfg.dtype
    peak, bandwidth, hbm = chip.peak(dtype), chip.hbm_bandwidth, chips * chip.hbm_bytes
    read = decode_cost.weight_bytes(cfg, weights=weights)
    per_sequence = decode_cost.kv_cache_bytes(cfg, 1, cache=cache)
    kernels, per_launch = estimated_kernels(cfg.layers, kernels_per_layer), launch_cost(chip)
    rows = []
    for b in batches:
        step = decode_cost.decode_step_cost(
            cfg, b, peak_flops=peak, bandwidth=bandwidth, weights=weights, cache=cache, chips=chips
        )
        total = held + step.cache_bytes
        launch = launch_bound(step, kernels, per_launch.seconds)
        rows.append(BatchPlan(b, step.cache_bytes, total, total <= hbm, step, launch))
    roofs = {"peak_flops": peak, "bandwidth": bandwidth, "weights": weights}
    # Prefill reads each weight once and writes the prompt's cache once.
    prefill = dataclasses.replace(cfg, seq=prompt)
    ttft = predict(
        decode_cost.prefill_flops(cfg, 1, prompt),
        read + decode_cost.kv_cache_bytes(prefill, 1, cache=cache),
        peak_flops=peak,
        bandwidth=bandwidth,
        tokens=1,
        chips=chips,
    )
    return ServingPlan(
        cfg, chip, chips, dtype, weights, cache, params, held, read, per_sequence, rows,
        decode_cost.compute_bound_batch(cfg, cache=cache or True, **roofs),
        decode_cost.compute_bound_batch(cfg, cache=False, **roofs),
        max(0, int((hbm - held) // per_sequence)) if per_sequence else 0,
        tuple(fewest_chips(cfg, chip, held + b * per_sequence) for b in (0, max(batches))),
        prompt, ttft, kernels, kernels_per_layer, per_launch,
    )  # fmt: skip


def serving_lines(plan, heading):
    """The plan as text, its first line `heading` (which model, from where)."""
    cfg, chip, n = plan.cfg, plan.chip, plan.chips
    weights, cache = plan.weights or plan.dtype, plan.cache or plan.dtype
    K, H, T = cfg.n_kv_heads, cfg.heads, cfg.seq
    peak, hbm = chip.peak(plan.dtype), capacity(chip.hbm_bytes, decimal=False)
    lines = [
        heading,
        f"model: {model_line(cfg, length='T')} | {plan.params:,} parameters",
        f"chips: {n} x {chip.name}, {peak / 1e12:,.1f} TFLOP/s {plan.dtype} (the matmuls' "
        + f"peak, int8 weights too), {chip.hbm_bandwidth / 1e9:,.0f} GB/s and "
        + f"{capacity(chip.hbm_bytes)} HBM each ({chip.source})",
        f"weights: {weights}: {gb(plan.held_weight_bytes)} held, {gb(plan.read_weight_bytes)} "
        + "read per step (each matmul weight once, a row of each table)",
        f"KV cache: {cache}, K = {K} of H = {H} heads: {gb(plan.cache_per_sequence)} per "
        + f"sequence of T = {T:,} positions",
        launches_line(plan),
        "units: GB = 1e9 bytes, GiB = 2^30, MB = 1e6; step = the lower bound on one decode step",
        "",
        "tokens/s at most: the step is a lower bound; (in parentheses) a batch that does not fit",
        f"{'batch':>7}{'KV cache':>12}{'total held':>13}  {f'fits {n} x {hbm}':<16}"
        + f"{'launches':>10}{'step':>10}  {'bound':<9}{'tokens/s':>12}",
    ]
    for r in plan.batches:
        fits = "yes" if r.fits else "does not fit"
        launch = "-" if r.launch.launch_s is None else ms(r.launch.launch_s)
        rate = f"{r.batch / r.launch.step_s:,.0f}"
        lines.append(
            f"{r.batch:>7,}{gb(r.kv_cache_bytes):>12}{gb(r.total_bytes):>13}  {fits:<16}"
            + f"{launch:>10}{ms(r.launch.step_s):>10}  {r.launch.bound:<9}"
            + f"{rate if r.fits else f'({rate})':>12}"
        )
    f = decode_cost.flops_per_sequence(cfg)
    if plan.critical_batch is None:
        critical = (
            f"none at T = {T:,}: a sequence's cache takes longer to read "
            + f"({ms(plan.cache_per_sequence / chip.hbm_bandwidth)} on one chip) than its FLOPs "
            + f"take ({ms(f / peak)}), so every batch is memory-bound (the cache's bytes left out, "
            + f"B* = {math.ceil(plan.napkin_batch):,})"
        )
    else:
        critical = (
            f"B* = {math.ceil(plan.critical_batch):,} sequences: memory-bound below, "
            + "compute-bound from there (the cache's bytes left out, "
            + f"{math.ceil(plan.napkin_batch):,})"
        )
    t = plan.ttft
    parallel = "one chip"
    if n > 1:  # Megatron's split: an all-reduce after attention and one after the MLP
        parallel = (
            f"tensor parallelism over {n} chips; its {2 * cfg.layers:,} all-reduces a token "
            "(2 a layer, each a latency-bound trip over the links) left out of step and TTFT"
        )
    if n > K:
        parallel += f", and the copies of each of the K = {K} KV heads that {n} chips would hold"
    return [
        *lines,
        "",
        f"critical batch: {critical}",
        f"largest batch that fits: {plan.max_batch:,} sequences of {T:,} positions beside "
        + f"the weights, in {n} x {hbm}",
        *filter(None, [usable_line(chip)]),
        chips_line(plan),
        f"time to first token: at least {ms(t.step_s)} for one prompt of {plan.prompt:,} tokens, "
        + f"{t.bound}-bound ({t.flops / 1e12:,.2f} TFLOP of prefill, attention's scores in "
        + f"full; {gb(t.bytes)} read and written)",
        f"assumed: {parallel}; HBM's other tenants (activations, logits, workspace) left "
        + "out of 'total held'",
    ]


def chips_line(plan):
    """The fewest chips (heads split evenly) for the weights, and for the largest batch."""
    alone, most = (f"{n}" if n else "none: the heads split no further" for n in plan.fewest_chips)
    biggest = max(r.batch for r in plan.batches)
    return (
        f"fewest chips that hold the weights: {alone}; with {biggest:,} sequences' caches: {most}"
    )


def launches_line(plan):
    """How many kernels a token launches, by what estimate, and what each costs."""
    L, cost = plan.cfg.layers, plan.per_launch
    if plan.kernels_per_layer is None:
        how = (
            f"{L} x {XLA_KERNELS_PER_LAYER} + {XLA_KERNELS_OUTSIDE}: XLA's, as read off GPT-2's "
            "decode compiled for h100:1; --kernels-per-layer N for another"
        )
    elif plan.kernels_per_layer == OUR_KERNELS_PER_LAYER:
        how = f"{L} x 2 + {OUR_KERNELS_OUTSIDE}: ours, sessions/inference/kernel_step.py, compiled"
    else:
        how = f"{L} x {plan.kernels_per_layer} + {XLA_KERNELS_OUTSIDE}"
    if cost.seconds is None:
        return f"kernels: {plan.kernels} a token ({how}); no launch term: {cost.source}"
    return (
        f"kernels: {plan.kernels} a token ({how}), {cost.seconds * 1e6:.1f} us a launch "
        f"({cost.source})"
    )


def serving_summary(plan, **about):
    """The plan as JSON-ready numbers (--summary-out), with `about` (preset, source, ...)."""
    return {
        **about,
        "chip": plan.chip.name,
        "chips": plan.chips,
        "dtype": plan.dtype,
        "weights": plan.weights or plan.dtype,
        "cache": plan.cache or plan.dtype,
        "context": plan.cfg.seq,
        "params": plan.params,
        "weight_bytes": plan.held_weight_bytes,
        "weight_bytes_read_per_step": plan.read_weight_bytes,
        "kv_cache_bytes_per_sequence": plan.cache_per_sequence,
        "hbm_bytes": plan.chips * plan.chip.hbm_bytes,
        "kernels_per_token": plan.kernels,
        "per_launch_seconds": plan.per_launch.seconds,
        "batches": [
            {
                "batch": r.batch,
                "kv_cache_bytes": r.kv_cache_bytes,
                "total_bytes": r.total_bytes,
                "fits": r.fits,
                "launch_seconds": r.launch.launch_s,
                "step_seconds": r.launch.step_s,
                "bound": r.launch.bound,
                "tokens_per_second": r.batch / r.launch.step_s,
            }
            for r in plan.batches
        ],
        "critical_batch": None if plan.critical_batch is None else math.ceil(plan.critical_batch),
        "fewest_chips": plan.fewest_chips[0],
        "fewest_chips_for_the_largest_batch": plan.fewest_chips[1],
        "max_batch": plan.max_batch,
        "prompt": plan.prompt,
        "ttft_seconds": plan.ttft.step_s,
        "ttft_bound": plan.ttft.bound,
    }

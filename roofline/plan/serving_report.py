"""The serving plan (serving.py) as a student reads it and as JSON (--summary-out):
the model and chips, each batch's bytes, whether it fits, its floor and its estimate,
the critical batch, the fewest chips, the first token (python -m roofline decode,
s5_serve.py)."""

import math

from roofline import decode_cost
from roofline.flops import model_line
from roofline.launch_bound import (
    OUR_KERNELS_OUTSIDE,
    OUR_KERNELS_PER_LAYER,
    XLA_KERNELS_OUTSIDE,
    XLA_KERNELS_PER_LAYER,
)
from roofline.memory import usable_line
from roofline.plan.decode_estimate import FIT_SOURCE
from roofline.units import capacity, gb, ms


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
        estimate_line(plan),
        "units: GB = 1e9 bytes, GiB = 2^30, MB = 1e6",
        "",
        "floor: the largest of bytes, FLOPs and launches, no step is faster (tokens/s at most);",
        "estimate: their sum, at the bandwidth Little's law allows; (in parentheses) does not fit",
        f"{'batch':>7}{'KV cache':>12}{'total held':>13}  {f'fits {n} x {hbm}':<16}"
        + f"{'floor':>10}  {'bound':<9}{'estimate':>10}  {'binds':<12}"
        + f"{'tokens/s':>11}{'estimated':>11}",
    ]
    for r in plan.batches:
        t = r.times
        fits = "yes" if r.fits else "does not fit"
        rates = [f"{r.batch / t.floor_s:,.0f}"]
        rates.append("-" if t.estimate_s is None else f"{r.batch / t.estimate_s:,.0f}")
        rates = rates if r.fits else [f"({x})" for x in rates]
        estimate = "-" if t.estimate_s is None else ms(t.estimate_s)
        lines.append(
            f"{r.batch:>7,}{gb(r.kv_cache_bytes):>12}{gb(r.total_bytes):>13}  {fits:<16}"
            + f"{ms(t.floor_s):>10}  {t.floor_bound:<9}{estimate:>10}  "
            + f"{t.estimate_bound or '-':<12}{rates[0]:>11}{rates[1]:>11}"
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
            "(2 a layer) in the estimate, left out of the floor and TTFT"
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
        f"kernels: {plan.kernels} a token ({how}); the floor's launch {cost.seconds * 1e6:.1f} us "
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
                "launch_seconds": r.times.floor.launch_s,
                "step_seconds": r.times.floor_s,
                "bound": r.times.floor_bound,
                "tokens_per_second": r.batch / r.times.floor_s,
                "floor_step_seconds": r.times.floor_s,
                "floor_bound": r.times.floor_bound,
                "estimate_step_seconds": r.times.estimate_s,
                "estimate_bound": r.times.estimate_bound,
                "estimate_launch_seconds": r.times.launch_s,
                "estimate_all_reduce_seconds": r.times.all_reduce_s,
                "achievable_bandwidth": r.times.achievable,
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


def estimate_line(plan):
    """Where the estimate's figures come from, or why there is none."""
    if plan.chip.platform != "gpu":
        return "estimate: none on this chip: its launches and bandwidth are fitted on an H100"
    carried = "" if plan.chip.name.startswith("h100") else " (carried over from the H100)"
    ours = ""
    if plan.kernels_per_layer == OUR_KERNELS_PER_LAYER:  # their grids are in sessions/kernels/
        ours = "; our kernels' bytes at XLA's rate here, at their own in s3_infer.py --target"
    return f"estimate: {FIT_SOURCE}{carried}{ours} (roofline/plan/decode_estimate.py)"

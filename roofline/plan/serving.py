"""Serving a model on N chips, on a napkin: for each batch, the decode step's bytes,
whether they fit, its floor, its estimate and tokens/s; the critical batch; the time to
the first token (python -m roofline decode). The text and JSON: serving_report.py.

Per decode step of B sequences at T cached positions (roofline/decode_cost.py):

    held   = W_held + B·C          every weight whole, and B caches: must fit N x HBM
    read   = W_read + B·C          what the step reads: each matmul weight once, a row of
                                   each table, B caches
    floor    = max(read / (N·bandwidth), B·f / (N·peak), kernels · launch)  tokens/s <= B / floor
    estimate = read / (N·achievable) + kernels · launch + 2L all-reduces on N > 1 chips

    B* = (W_read / bandwidth) / (f / peak − C / bandwidth)    compute-bound from B*, never
                                                              when C / bandwidth >= f / peak
    TTFT >= max(prefill FLOPs / (N·peak), (W_read + C_prompt) / (N·bandwidth))

The third bound is the step's kernel launches (roofline/launch_bound.py): with no
compiled program at hand, kernels a token = L x a layer's kernels + those outside the
layers, XLA's as read off GPT-2's decode compiled for h100:1 unless told a layer's
count (2 for a decode layer fused into two kernels); each launch costs the chip
family's sourced figure, none on a TPU or a CPU. The estimate adds what the floor lets
the largest hide (roofline/plan/decode_estimate.py): XLA's fusions stream below the bandwidth
(Little's law), each launch adds, and so does each all-reduce of tensor parallelism.

Assumptions: N chips share the work by tensor parallelism, each holding and reading
1/N of the weights and caches and doing 1/N of the FLOPs; the floor leaves their
all-reduces out (the estimate does not); where N exceeds the KV heads K, real
tensor parallelism copies each KV head onto N/K chips, which this leaves out too.
What HBM also holds besides weights and caches (activations, logits, the runtime's
workspace) is left out, so a batch near the limit may not fit in practice. int8
weights multiply in the compute dtype, at its peak. A batch that does not fit is
still planned (as if it did) and marked so.
"""

import dataclasses
from typing import NamedTuple

from roofline import decode_cost
from roofline.flops import param_count
from roofline.launch_bound import (
    estimated_kernels,
    launch_cost,
)
from roofline.plan.decode_estimate import decode_times
from roofline.predict import predict


class BatchPlan(NamedTuple):
    """One decode step of `batch` sequences: bytes, whether they fit, its floor and estimate."""

    batch: int
    kv_cache_bytes: int  # the B caches
    total_bytes: int  # every weight, whole, plus the caches: what must fit in HBM
    fits: bool  # total_bytes <= chips x hbm_bytes
    step: decode_cost.DecodeStep  # its bytes read, FLOPs and lower bound, over the N chips
    times: object  # roofline.plan.decode_estimate.DecodeTimes: floor, estimate, what binds each


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
        # Megatron's split: an all-reduce of the [B, E] residual after attention and the MLP.
        message = b * cfg.embed * decode_cost.dtype_bytes(dtype)
        times = decode_times(
            step, kernels, chip, all_reduces=2 * cfg.layers, message_bytes=message, chips=chips
        )
        rows.append(BatchPlan(b, step.cache_bytes, total, total <= hbm, step, times))
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

"""The decode roofline: what one generation step must read and compute, and
how fast it can therefore go.

A decode step makes one token for each of B sequences. It reads every
weight once, whatever B (they are shared by the batch), and each sequence's
KV cache once; each weight does 2 FLOPs per token (a multiply and an add),
and attention 4·L·T·H·D more (q·k and probs·v over the T cached positions):

    bytes = W + B·C       W: the weights' bytes; C: one sequence's cache, 2·L·T·K·D·bytes
    FLOPs = B·f           f = 2·P_matmul + 4·L·T·H·D

    memory-bound time = bytes / bandwidth        compute-bound time = FLOPs / peak

K is the KV heads: H (multi-head), or fewer under grouped-query attention,
where G = H/K query heads share each cached key and value: C shrinks G-fold,
f does not. int8 (weights="int8", cache="int8") stores 1 byte a value and a
float32 scale per output channel (weights) or per token and KV head (cache),
and multiplies in the compute dtype: fewer bytes, the same FLOPs at the
compute dtype's peak.

At B = 1 that is about 2 FLOPs per weight read: 0.5 FLOP per byte in float32,
1 in bfloat16, hundreds of times below any chip's ridge point, so decode
waits on memory. A larger batch shares the weights over more tokens and
raises the intensity, but not past the cache's own, 2·G/bytes FLOP per byte,
since no two sequences share a cache. So decode turns compute-bound at

    B* = (W / bandwidth) / (f / peak − C / bandwidth)

and never when f / peak <= C / bandwidth: a long context (large T) keeps
decode memory-bound at every batch. With the cache's bytes left out (C = 0)
this is B* = W·peak / (bandwidth·f), where f still counts attention's FLOPs
over the cache; leaving those out too, f = 2·P_matmul, gives the usual napkin,
about ridge · bytes / 2 tokens per step. (How to Scale Your Model, jax-ml/scaling-book, "All About
Transformer Inference".)

The step as compiled computes over all T = cfg.seq slots of the cache, filled
or not (its shapes are fixed; the empty ones are masked), so T is cfg.seq here.

Utilisation: MBU, model bandwidth utilisation, is the bytes a step must move
over its measured time, over the memory bandwidth: decode's counterpart of
MFU (Databricks, "LLM Inference Performance Engineering: Best Practices",
2023). On a CPU the bandwidth is measured, as a read-only stream
(roofline/calibrate.py `read_bandwidth`), since decode reads and hardly writes.
"""

import dataclasses
import math
from typing import NamedTuple

import jax.numpy as jnp

from roofline.flops import attention_flops, matmul_params, param_count
from roofline.predict import predict, utilisation

INT8 = "int8"  # the one quantized format of weights and of the KV cache (session 5)
SCALE_BYTES = (
    4  # a float32 scale: per output channel of a weight, per (token, KV head) of the cache
)


def dtype_bytes(dtype):
    return jnp.dtype(dtype).itemsize


def learned_table(cfg):
    """True if positions come from a learned [S, E] table (not RoPE, not none)."""
    return cfg.positions and not cfg.rope


def check_format(option, value):
    """None (the compute dtype) or "int8"; anything else is a caller's mistake."""
    if value not in (None, INT8):
        raise ValueError(f"{option}={value!r}: None (the compute dtype) or {INT8!r}")


def output_channels(cfg):
    """The scales of int8 weights a decode step reads, one per output channel of
    each matmul weight in decode's [*out, *in] layout (sessions/inference/layout.py):
    per layer wq H·D, wk and wv K·D each, wo E, w_in F (and w_gate F), w_out E;
    and the output projection's V."""
    E, F, H, K, D = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    attention = H * D + 2 * K * D + E if cfg.attention else 0
    per_layer = attention + (2 if cfg.gated else 1) * F + E
    return cfg.layers * per_layer + cfg.vocab


def weight_bytes(cfg, dtype=None, *, weights=None):
    """W: bytes of the weights one decode step reads. Every matmul weight (the
    output projection once, tied or not), the norm scales, and the row each
    token looks up of a learned positional table and of an untied embedding.

    weights=None: every value in the compute dtype (default cfg.dtype).
    weights="int8": each matmul weight value (and the embedding row) 1 byte,
    plus a float32 scale per output channel; norms and positions stay in the
    compute dtype."""
    check_format("weights", weights)
    E, L = cfg.embed, cfg.layers
    per_value = dtype_bytes(dtype or cfg.dtype)
    norms = L * (2 if cfg.attention else 1) * E + E
    position_row = E if learned_table(cfg) else 0
    embedding_row = 0 if cfg.tied else E
    if weights is None:
        return (matmul_params(cfg) + norms + position_row + embedding_row) * per_value
    scales = output_channels(cfg) + (0 if cfg.tied else 1)  # the looked-up row's own scale
    quantized = matmul_params(cfg) + embedding_row + SCALE_BYTES * scales
    return quantized + (norms + position_row) * per_value


def stored_weight_bytes(cfg, dtype=None, *, weights=None):
    """Bytes the weights hold in memory: all param_count(cfg) parameters, every
    table whole (a step reads one row of it). weights as in weight_bytes: int8
    quantizes every matmul weight and an untied embedding, with a float32 scale
    per output channel (per token of the embedding)."""
    check_format("weights", weights)
    P, per_value = param_count(cfg), dtype_bytes(dtype or cfg.dtype)
    if weights is None:
        return P * per_value
    table = 0 if cfg.tied else cfg.vocab * cfg.embed
    quantized = matmul_params(cfg) + table
    scales = output_channels(cfg) + (0 if cfg.tied else cfg.vocab)
    return quantized + SCALE_BYTES * scales + (P - quantized) * per_value


def kv_cache_bytes(cfg, batch, dtype=None, *, cache=None):
    """A key and a value of [K, D] per layer, sequence and position, T = cfg.seq
    positions, K = cfg.n_kv_heads; 0 without attention.

    cache=None: 2·L·B·T·K·D·bytes in the compute dtype (default cfg.dtype).
    cache="int8": 2·L·B·T·K·(D + 4): 1 byte per value, and a float32 scale per
    (token, KV head) for the keys and again for the values."""
    check_format("cache", cache)
    if not cfg.attention:
        return 0
    entries = 2 * cfg.layers * batch * cfg.seq * cfg.n_kv_heads  # (k or v, layer, row, t, head)
    if cache is None:
        return entries * cfg.head_dim * dtype_bytes(dtype or cfg.dtype)
    return entries * (cfg.head_dim + SCALE_BYTES)


def flops_per_sequence(cfg):
    """f: the FLOPs of one sequence's token in a decode step, 2·P_matmul + 4·L·T·H·D."""
    attention = 4 * cfg.layers * cfg.seq * cfg.heads * cfg.head_dim if cfg.attention else 0
    return 2 * matmul_params(cfg) + attention


class DecodeStep(NamedTuple):
    """The roofline's verdict on one decode step of `batch` sequences (seconds, bytes, FLOPs)."""

    batch: int
    weight_bytes: int
    cache_bytes: int
    bytes: int  # weight_bytes + cache_bytes
    flops: int
    memory_s: float  # bytes / bandwidth: no step is faster
    compute_s: float  # flops / peak: no step is faster
    step_s: float  # the larger of the two
    bound: str  # "memory" or "compute"
    tokens_per_s: float  # batch / step_s, the best case


def decode_step_cost(
    cfg, batch, *, peak_flops, bandwidth, dtype=None, weights=None, cache=None, chips=1
):
    """Both lower bounds on one decode step's time, and the one that applies.
    weights, cache: None (the compute dtype) or "int8"; the FLOPs are the same
    either way (an int8 weight is multiplied in the compute dtype). chips: the
    step's bytes and FLOPs split evenly over that many (tensor parallelism),
    each with peak_flops and bandwidth; bytes and FLOPs are the whole step's."""
    w = weight_bytes(cfg, dtype, weights=weights)
    c = kv_cache_bytes(cfg, batch, dtype, cache=cache)
    flops = batch * flops_per_sequence(cfg)
    p = predict(flops, w + c, peak_flops=peak_flops, bandwidth=bandwidth, tokens=batch, chips=chips)
    return DecodeStep(
        batch=batch,
        weight_bytes=w,
        cache_bytes=c,
        bytes=w + c,
        flops=flops,
        memory_s=p.memory_s,
        compute_s=p.compute_s,
        step_s=p.step_s,
        bound=p.bound,
        tokens_per_s=p.tokens_per_s,
    )


def compute_bound_batch(cfg, *, peak_flops, bandwidth, dtype=None, cache=True, weights=None):
    """B*, the batch from which a decode step is compute-bound (a float; round
    up), or None when no batch is: B* = (W/bw) / (f/peak − C/bw).
    cache=True: in the compute dtype; "int8": an int8 cache; False leaves the
    cache out: the napkin W·peak / (bw·f). weights: as in weight_bytes. The
    same over N chips of tensor parallelism: every term divides by N."""
    per_sequence_cache = 0
    if cache is not False:
        per_sequence_cache = kv_cache_bytes(cfg, 1, dtype, cache=None if cache is True else cache)
    margin = flops_per_sequence(cfg) / peak_flops - per_sequence_cache / bandwidth
    if margin <= 0:
        return None
    return weight_bytes(cfg, dtype, weights=weights) / bandwidth / margin


def decode_step_cost_per_device(
    cfg, batch, mesh, *, peak_flops, bandwidth, dtype=None, weights=None, cache=None
):
    """decode_step_cost for one device of a mesh ({"data": .., "fsdp": .., "tp": ..}),
    with that device's peak and bandwidth. Rows are split over data x fsdp and
    heads, F and V over tp, so each device does B·f / n FLOPs and reads B·C / n
    of the cache; but it multiplies its rows by every weight that tp does not
    split, so it reads W / tp: under data the weights are replicated, under fsdp
    gathered whole before use (that gather's traffic is on the links, not in
    HBM). With tp alone this is decode_step_cost against n devices' roofs."""
    n, tp = math.prod(mesh.values()), mesh["tp"]
    w = weight_bytes(cfg, dtype, weights=weights) / tp
    c = kv_cache_bytes(cfg, batch, dtype, cache=cache) / n
    flops = batch * flops_per_sequence(cfg) / n
    p = predict(flops, w + c, peak_flops=peak_flops, bandwidth=bandwidth, tokens=batch)
    return DecodeStep(
        batch, w, c, w + c, flops, p.memory_s, p.compute_s, p.step_s, p.bound, p.tokens_per_s
    )


def compute_bound_batch_per_device(
    cfg, mesh, *, peak_flops, bandwidth, dtype=None, weights=None, cache=None
):
    """B* for decode_step_cost_per_device: data x fsdp (= n / tp) times one device's
    B*, since each of those groups of devices must reach B* rows of its own."""
    one = compute_bound_batch(
        cfg,
        peak_flops=peak_flops,
        bandwidth=bandwidth,
        dtype=dtype,
        weights=weights,
        cache=cache or True,
    )
    return None if one is None else one * math.prod(mesh.values()) / mesh["tp"]


def prefill_flops(cfg, batch, prompt_len):
    """FLOPs of prefill over `batch` prompts of `prompt_len` tokens: 2 per matmul
    weight per token, but the output projection (2·V·E) for the last position
    only, plus attention over the P x P scores in full, as the einsum computes
    them: 4·L·B·P·P·H·D."""
    V, E, P = cfg.vocab, cfg.embed, prompt_len
    matmuls = 2 * batch * P * (matmul_params(cfg) - V * E) + 2 * batch * V * E
    return matmuls + attention_flops(dataclasses.replace(cfg, seq=P), batch)


class Achieved(NamedTuple):
    step_s: float  # measured seconds per decode step
    tokens_per_s: float
    bytes_per_s: float
    flops_per_s: float
    mbu: float  # bytes_per_s / bandwidth
    mfu: float  # flops_per_s / peak


def achieved(step, step_s, *, peak_flops, bandwidth):
    """What a measured step time means against the roofline's DecodeStep `step`.

    MBU = step.bytes / step_s / bandwidth;  MFU = step.flops / step_s / peak."""
    if not step_s > 0 or math.isinf(step_s):
        raise ValueError(f"a step time must be positive and finite, got {step_s}")
    return Achieved(
        step_s=step_s,
        tokens_per_s=step.batch / step_s,
        bytes_per_s=step.bytes / step_s,
        flops_per_s=step.flops / step_s,
        mbu=step.bytes / step_s / bandwidth,
        # peak_flops: the caller's roofs, a datasheet's or measured; the ratio is the same.
        mfu=utilisation(step.flops, step_s, datasheet_peak=peak_flops).mfu_datasheet,
    )


def measured_summary(steps, measured, cfg, *, peak_flops, bandwidth, times=None):
    """JSON-ready numbers for decode steps timed beside their roofline, per (DecodeStep,
    Achieved, DecodeTimes or None: roofline/plan/decode_estimate.py, where kernels were
    counted) and B* (s3_infer.py --summary-out). Without times, the floor is the bytes' or
    the FLOPs' time and there is no estimate."""
    return {
        "batches": [
            {
                "batch": s.batch,
                "decode_tokens_per_sec": g.tokens_per_s,
                "step_seconds": g.step_s,
                "mbu": g.mbu,
                "mfu": g.mfu,
                "bytes_per_step": s.bytes,
                "memory_bound_seconds": s.memory_s,
                "compute_bound_seconds": s.compute_s,
                "floor_step_seconds": t.floor_s if t else s.step_s,
                "floor_bound": t.floor_bound if t else {"memory": "bytes"}.get(s.bound, "FLOPs"),
                "estimate_step_seconds": t and t.estimate_s,
                "estimate_bound": t and t.estimate_bound,
            }
            for s, g, t in zip(steps, measured, times or [None] * len(steps))
        ],
        "compute_bound_batch": compute_bound_batch(cfg, peak_flops=peak_flops, bandwidth=bandwidth),
        "peak_flops": peak_flops,
        "bandwidth": bandwidth,
    }

"""The decode roofline: what one generation step must read and compute, and
how fast it can therefore go.

A decode step makes one token for each of B sequences. It reads every
weight once, whatever B (they are shared by the batch), and each sequence's
KV cache once; each weight does 2 FLOPs per token (a multiply and an add),
and attention 4·L·T·H·D more (q·k and probs·v over the T cached positions):

    bytes = W + B·C       W: the weights' bytes; C: one sequence's cache, 2·L·T·H·D·bytes
    FLOPs = B·f           f = 2·P_matmul + 4·L·T·H·D

    memory-bound time = bytes / bandwidth        compute-bound time = FLOPs / peak

At B = 1 that is about 2 FLOPs per weight read: 0.5 FLOP per byte in float32,
1 in bfloat16, hundreds of times below any chip's ridge point, so decode
waits on memory. A larger batch shares the weights over more tokens and
raises the intensity, but not past the cache's own, 2/bytes FLOP per byte,
since no two sequences share a cache. So decode turns compute-bound at

    B* = (W / bandwidth) / (f / peak − C / bandwidth)

and never when f / peak <= C / bandwidth: a long context (large T) keeps
decode memory-bound at every batch. With the cache left out (C = 0) this is
the usual napkin, B* = W·peak / (bandwidth·f), about ridge · bytes / 2
tokens per step. (How to Scale Your Model, jax-ml/scaling-book, "All About
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

from roofline.flops import attention_flops, matmul_params
from roofline.predict import predict, utilisation


def dtype_bytes(dtype):
    return jnp.dtype(dtype).itemsize


def weight_bytes(cfg, dtype=None):
    """W: bytes of the weights one decode step reads, in the compute dtype
    (default cfg.dtype). Every matmul weight (the tied embedding once, as the
    output projection), the norm scales, and one row of the positional table."""
    E, L = cfg.embed, cfg.layers
    norms = L * (2 if cfg.attention else 1) * E + E
    position_row = E if cfg.positions else 0
    return (matmul_params(cfg) + norms + position_row) * dtype_bytes(dtype or cfg.dtype)


def kv_cache_bytes(cfg, batch, dtype=None):
    """2·L·B·T·H·D·bytes: a key and a value of [H, D] per layer, sequence and
    position, T = cfg.seq positions; 0 without attention."""
    if not cfg.attention:
        return 0
    per_value = dtype_bytes(dtype or cfg.dtype)
    return 2 * cfg.layers * batch * cfg.seq * cfg.heads * cfg.head_dim * per_value


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


def decode_step_cost(cfg, batch, *, peak_flops, bandwidth, dtype=None):
    """Both lower bounds on one decode step's time, and the one that applies."""
    w, c = weight_bytes(cfg, dtype), kv_cache_bytes(cfg, batch, dtype)
    flops = batch * flops_per_sequence(cfg)
    p = predict(flops, w + c, peak_flops=peak_flops, bandwidth=bandwidth, tokens=batch)
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


def compute_bound_batch(cfg, *, peak_flops, bandwidth, dtype=None, cache=True):
    """B*, the batch from which a decode step is compute-bound (a float; round
    up), or None when no batch is: B* = (W/bw) / (f/peak − C/bw).
    cache=False leaves the cache out: the napkin W·peak / (bw·f)."""
    per_sequence_cache = kv_cache_bytes(cfg, 1, dtype) if cache else 0
    margin = flops_per_sequence(cfg) / peak_flops - per_sequence_cache / bandwidth
    if margin <= 0:
        return None
    return weight_bytes(cfg, dtype) / bandwidth / margin


def decode_step_cost_per_device(cfg, batch, mesh, *, peak_flops, bandwidth, dtype=None):
    """decode_step_cost for one device of a mesh ({"data": .., "fsdp": .., "tp": ..}),
    with that device's peak and bandwidth. Rows are split over data x fsdp and
    heads, F and V over tp, so each device does B·f / n FLOPs and reads B·C / n
    of the cache; but it multiplies its rows by every weight that tp does not
    split, so it reads W / tp: under data the weights are replicated, under fsdp
    gathered whole before use (that gather's traffic is on the links, not in
    HBM). With tp alone this is decode_step_cost against n devices' roofs."""
    n, tp = math.prod(mesh.values()), mesh["tp"]
    w, c = weight_bytes(cfg, dtype) / tp, kv_cache_bytes(cfg, batch, dtype) / n
    flops = batch * flops_per_sequence(cfg) / n
    p = predict(flops, w + c, peak_flops=peak_flops, bandwidth=bandwidth, tokens=batch)
    return DecodeStep(
        batch, w, c, w + c, flops, p.memory_s, p.compute_s, p.step_s, p.bound, p.tokens_per_s
    )


def compute_bound_batch_per_device(cfg, mesh, *, peak_flops, bandwidth, dtype=None):
    """B* for decode_step_cost_per_device: data x fsdp (= n / tp) times one device's
    B*, since each of those groups of devices must reach B* rows of its own."""
    one = compute_bound_batch(cfg, peak_flops=peak_flops, bandwidth=bandwidth, dtype=dtype)
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


def measured_summary(steps, measured, cfg, *, peak_flops, bandwidth):
    """JSON-ready numbers for decode steps timed beside their roofline: one
    entry per (DecodeStep, Achieved) pair, and the batch where decode turns
    compute-bound (s3_infer.py --summary-out)."""
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
            }
            for s, g in zip(steps, measured)
        ],
        "compute_bound_batch": compute_bound_batch(cfg, peak_flops=peak_flops, bandwidth=bandwidth),
        "peak_flops": peak_flops,
        "bandwidth": bandwidth,
    }

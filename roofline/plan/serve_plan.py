"""Serving a published model within latency targets, on a napkin: the batch, the KV pages,
the decode step and the prefill, the requests a second a replica serves, the fewest chips
for a rate, and prefill servers per generate server (python -m roofline serve; the text
and JSON: serve_report.py). The decode step is roofline decode's (plan/serving.py).

For a prompt of P tokens, G tokens out, B slots on N chips (jax-ml/scaling-book,
"Serving LLaMA 3-70B"):

    kv bytes a token = 2·L·K·D x bytes (int8: 2·L·K·(D + 4), the course's cache keeping a
                       float32 scale a token and KV head: sessions/model/quantize.py)
    fits             = weights held + B·(P + G)·kv bytes a token <= N x HBM
    decode step      = roofline decode's floor at B, with P cached positions (the book's)
    prefill          = 2·P_matmul·P / (N · peak · MFU)    the book's 2·params·tokens, the
                       embedding table (looked up, not multiplied) left out; attention's
                       P x P scores, causal, left out as the book leaves them
    generate rate    = B / (G · step)                     requests/s, prefill elsewhere
    replica rate     = B / (G · step + B · prefill)       prefill on the same chips
    freed a step     = B·(P + G)/G tokens;  prefill : generate = prefill·B / (G·step)

TTFT is one prompt's prefill (no queueing); TPOT is the decode step (a colocated server's
prefills stretch it by B·prefill/G a token at saturation, printed beside). Without --batch
the batch is the largest that fits and meets both SLOs (the step grows with B).
"""

import dataclasses
import math
from typing import NamedTuple

from roofline import decode_cost
from roofline.flops import matmul_params
from roofline.plan import batching
from roofline.plan.serving import plan_serving

# MLPerf Inference's Server scenario limits, p99 (*.Server.target_latency_percentile = 99),
# in ms in mlcommons/inference loadgen/mlperf.conf: "llama2-70b.Server.ttft_latency = 2000",
# "tpot_latency = 200"; "llama3_1-8b.Server.ttft_latency = 2000", "tpot_latency = 100".
MLPERF_SOURCE = "https://github.com/mlcommons/inference/blob/master/loadgen/mlperf.conf"
SLO_PRESETS = {
    "mlperf-llama2-70b": (2.0, 0.200),  # TTFT 2 s, TPOT 200 ms
    "mlperf-llama3.1-8b": (2.0, 0.100),  # TTFT 2 s, TPOT 100 ms
}
PAGE_SIZE = 16  # tokens a page: vLLM's default block size (arXiv 2309.06180)
BOOK_MFU = 0.4  # the book's prefill utilisation ("Assume we achieve a 40% FLOPs utilization")


class ServePlan(NamedTuple):
    """A model served on `chips` x `chip` for prompts of `prompt` and outputs of `output`."""

    cfg: object  # the ModelConfig, seq = the context a reserved row holds
    chip: object
    chips: int
    weights: str | None
    cache: str | None
    prompt: int  # P
    output: int  # G
    kv_bytes_per_token: int  # what the course's cache keeps a token (int8: with its scales)
    kv_value_bytes_per_token: int  # the values alone: 2·L·K·D x bytes
    held_weight_bytes: int
    batch: int  # B: as asked, or the largest that fits and meets the SLOs
    batch_asked: bool
    fits: bool  # B caches of P + G positions beside the weights
    fits_at_prompt: bool  # ... of P positions (the book's check)
    max_batch: int  # the most caches of P + G that fit
    serving: object  # plan/serving.py ServingPlan at B, T = P
    decode_step_s: float
    decode_bound: str
    prefill_mfu: float
    prefill_flops: int
    prefill_s: float
    prefill_attention_s: float  # what attention's causal scores would add at the same MFU
    tokens_per_s_per_chip: float
    generate_requests_per_s: float
    requests_per_s_per_replica: float
    tpot_colocated_s: float
    kv_tokens_freed_per_step: float
    prefill_to_generate: float
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    meets_slos: bool
    page_size: int
    kv_pages: int  # pages of page_size tokens beside the weights
    sequences_paged: int  # of P + G tokens each, in pages
    sequences_reserved: int  # each reserving the whole context
    rate: float | None
    min_chips_colocated: int | None
    min_chips_disaggregated: int | None


def step_at(cfg, chip, batch, prompt, chips, weights, cache):
    """roofline decode's plan of one batch at P cached positions: (ServingPlan, its row)."""
    plan = plan_serving(
        dataclasses.replace(cfg, seq=prompt), chip, batches=[batch], prompt=prompt,
        chips=chips, weights=weights, cache=cache,
    )  # fmt: skip
    return plan, plan.batches[0]


def largest_meeting(cfg, chip, most, prompt, chips, weights, cache, tpot):
    """The largest batch in 1..most whose step is at most `tpot` (None: any), or 0: the step
    only grows with B, so a bisection."""
    low, high = 0, most
    while low < high:
        mid = (low + high + 1) // 2
        step = step_at(cfg, chip, mid, prompt, chips, weights, cache)[1].times.floor_s
        low, high = (mid, high) if tpot is None or step <= tpot else (low, mid - 1)
    return low


def plan_serve(
    cfg,
    chip,
    *,
    prompt,
    output,
    chips=1,
    weights=None,
    cache=None,
    batch=None,
    prefill_mfu=BOOK_MFU,
    slo_ttft=None,
    slo_tpot=None,
    rate=None,
    page_size=PAGE_SIZE,
):
    """ServePlan of `cfg` (cfg.seq: the context a sequence may hold; cfg.dtype the compute
    dtype) on `chips` of `chip`. ValueError where prompt + output passes cfg.seq."""
    if prompt + output > cfg.seq:
        raise ValueError(
            f"--prompt {prompt:,} + --output {output:,} = {prompt + output:,} tokens: past "
            f"the context, {cfg.seq:,} positions"
        )
    one_token = dataclasses.replace(cfg, seq=1)
    per_token = decode_cost.kv_cache_bytes(one_token, 1, cache=cache)
    values = 2 * cfg.layers * cfg.n_kv_heads * cfg.head_dim
    values *= 1 if cache else decode_cost.dtype_bytes(cfg.dtype)
    held = decode_cost.stored_weight_bytes(cfg, weights=weights)
    free = max(0, int(chips * chip.hbm_bytes) - held)
    most = free // (per_token * (prompt + output))
    peak = chip.peak(cfg.dtype)
    flops = 2 * matmul_params(cfg) * prompt
    prefill_s = flops / (chips * peak * prefill_mfu)
    ttft_ok = slo_ttft is None or prefill_s <= slo_ttft
    asked = batch is not None
    if not asked:
        meeting = largest_meeting(cfg, chip, most, prompt, chips, weights, cache, slo_tpot)
        batch = max(1, meeting if ttft_ok else 0)
    serving, row = step_at(cfg, chip, batch, prompt, chips, weights, cache)
    step = row.times.floor_s
    generate_rate = batching.knee_rate(batch, step, output)
    replica_rate = batching.knee_rate(batch, step, output, prefill_s)
    pages = free // (page_size * per_token)
    min_colocated = min_disaggregated = None
    if rate is not None:
        min_colocated = math.ceil(rate / replica_rate) * chips
        # generate servers, and prefill servers of the same N chips, one prompt at a time
        min_disaggregated = (math.ceil(rate / generate_rate) + math.ceil(rate * prefill_s)) * chips
    return ServePlan(
        cfg, chip, chips, weights, cache, prompt, output, per_token, values, held, batch, asked,
        batch <= most, held + batch * prompt * per_token <= chips * chip.hbm_bytes, most,
        serving, step, row.times.floor_bound, prefill_mfu, flops, prefill_s,
        2 * cfg.layers * prompt * prompt * cfg.heads * cfg.head_dim / (chips * peak * prefill_mfu),
        batch / (step * chips), generate_rate, replica_rate, step + batch * prefill_s / output,
        batching.kv_tokens_freed_per_step(batch, prompt, output),
        batching.prefill_to_generate(prefill_s, batch, output, step), slo_ttft, slo_tpot,
        ttft_ok and (slo_tpot is None or step <= slo_tpot), page_size, pages,
        pages // batching.pages_of(prompt + output, page_size),
        batching.sequences_reserved(free // per_token, cfg.seq), rate, min_colocated,
        min_disaggregated,
    )  # fmt: skip

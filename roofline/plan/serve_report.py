"""The serve plan (serve_plan.py) as a student reads it, each line labelled predicted with
its units, and as JSON (--summary-out; bytes, seconds and counts): python -m roofline serve."""

from roofline.flops import model_line
from roofline.plan.serve_plan import MLPERF_SOURCE
from roofline.units import capacity, flop, gb, ms


def tflop(x):
    return f"{x / 1e12:,.1f} TFLOP" if x >= 1e12 else flop(x)


def rate_text(r):
    return f"{r:,.2f}" if r < 100 else f"{r:,.0f}"


def serve_lines(plan, heading, slo=None):
    """The plan as text, its first line `heading` (which model, from where); `slo` the
    name of the SLO preset its targets come from, if one."""
    cfg, chip, n, B, P, G = plan.cfg, plan.chip, plan.chips, plan.batch, plan.prompt, plan.output
    dtype = cfg.dtype
    weights, cache = plan.weights or dtype, plan.cache or dtype
    scales = ""
    if plan.cache:
        scales = (
            f" ({plan.kv_value_bytes_per_token:,} of values, 2·L·K·D, and a float32 scale a "
            "token and KV head for the keys and the values, as sessions/model/quantize.py "
            "keeps them)"
        )
    how = "as asked (--batch), never clamped" if plan.batch_asked else "the largest that "
    if not plan.batch_asked:
        how += "fits and meets the SLOs" if plan.meets_slos else "fits (none meets the SLOs)"
    hbm = capacity(chip.hbm_bytes, decimal=False)
    peak = chip.peak(dtype)
    lines = [
        heading,
        f"model: {model_line(cfg, length='T')}",
        f"chips: {n} x {chip.name}, {peak / 1e12:,.0f} TFLOP/s {dtype}, "
        f"{chip.hbm_bandwidth / 1e9:,.0f} GB/s and {capacity(chip.hbm_bytes)} HBM each "
        f"({chip.source})",
        f"requests: P = {P:,} prompt tokens, G = {G:,} output tokens; context "
        f"T = {cfg.seq:,} positions; weights {weights}, KV cache {cache}",
        "units: GB = 1e9 bytes, GiB = 2^30, KiB = 2^10; every figure below is predicted",
        "",
        f"predicted KV cache a token: {plan.kv_bytes_per_token:,} bytes "
        f"({plan.kv_bytes_per_token / 1024:,.1f} KiB){scales}",
        f"predicted weights held: {gb(plan.held_weight_bytes)}; caches of P + G = {P + G:,} "
        f"positions that fit beside them in {n} x {hbm}: {plan.max_batch:,}",
        f"predicted batch: B = {B:,} slots, {how}; "
        + ("fits" if plan.fits else f"does NOT fit at P + G = {P + G:,} positions")
        + f" ({'fits' if plan.fits_at_prompt else 'does not fit'} at P = {P:,}, the book's check)",
        f"predicted KV pages: {plan.kv_pages:,} of {plan.page_size} tokens; sequences of "
        f"P + G that fit paged: {plan.sequences_paged:,}, reserving T = {cfg.seq:,} each: "
        f"{plan.sequences_reserved:,}",
        f"predicted decode step: {ms(plan.decode_step_s)} at B = {B:,} with P = {P:,} cached "
        f"positions ({plan.decode_bound}-bound floor of roofline decode: no step is faster)",
        f"predicted prefill: {ms(plan.prefill_s)} for one prompt of {P:,} tokens at "
        f"{plan.prefill_mfu:.0%} MFU ({tflop(plan.prefill_flops)}, 2 a matmul weight "
        f"a token; attention's causal scores would add {ms(plan.prefill_attention_s)})",
        f"predicted time to first token: {ms(plan.prefill_s)} (one prompt's prefill, no "
        "queueing); time per output token: the decode step, "
        f"{ms(plan.tpot_colocated_s)} where prefills share the chips (+ B·prefill/G)",
        f"predicted decode throughput: {B / plan.decode_step_s:,.0f} tokens/s, "
        f"{plan.tokens_per_s_per_chip:,.0f} tokens/s per chip",
        f"predicted requests/s a replica of {n} chip{'s' if n > 1 else ''}: "
        f"{rate_text(plan.requests_per_s_per_replica)} (B / (G·step + B·prefill), prefill on "
        f"the same chips); {rate_text(plan.generate_requests_per_s)} generating alone "
        "(B / (G·step))",
        f"predicted KV tokens freed a step: B·(P + G)/G = {plan.kv_tokens_freed_per_step:,.1f}",
        f"predicted prefill servers per generate server (disaggregated, {n} chip"
        f"{'s' if n > 1 else ''} each): "
        f"prefill·B / (G·step) = {plan.prefill_to_generate:,.2f}",
    ]
    if plan.slo_ttft_s is not None or plan.slo_tpot_s is not None:
        lines.append(slo_line(plan))
        if slo:
            lines.append(f"SLO preset {slo}: MLPerf's Server limits ({MLPERF_SOURCE})")
    if plan.rate is not None:
        lines.append(
            f"predicted fewest chips for {plan.rate:g} requests/s: {min_chips(plan):,} "
            f"({plan.min_chips_colocated:,} as replicas of {n} doing both; "
            f"{plan.min_chips_disaggregated:,} as prefill and generate servers of {n})"
        )
    lines.append(
        "assumed: tensor parallelism over the N chips, their all-reduces left out; HBM's other "
        "tenants (activations, workspace) left out of what fits; prefill at the MFU given"
    )
    return lines


def slo_line(plan):
    """Whether the plan meets the TTFT and TPOT targets given."""
    parts = []
    if plan.slo_ttft_s is not None:
        ok = plan.prefill_s <= plan.slo_ttft_s
        parts.append(f"TTFT {ms(plan.prefill_s)} {'<=' if ok else '>'} {ms(plan.slo_ttft_s)}")
    if plan.slo_tpot_s is not None:
        ok = plan.decode_step_s <= plan.slo_tpot_s
        parts.append(f"TPOT {ms(plan.decode_step_s)} {'<=' if ok else '>'} {ms(plan.slo_tpot_s)}")
    verdict = "meets" if plan.meets_slos else "misses"
    targets = "p99 targets, against the napkin's one request"
    return f"predicted SLOs: {verdict} them: {'; '.join(parts)} ({targets})"


def min_chips(plan):
    """The fewer chips of the two ways to serve `rate`: replicas, or disaggregated servers."""
    return min(plan.min_chips_colocated, plan.min_chips_disaggregated)


def serve_summary(plan, **about):
    """The plan as JSON-ready numbers (--summary-out), with `about` (preset, source, ...)."""
    cfg = plan.cfg
    return {
        **about,
        "chip": plan.chip.name,
        "chips": plan.chips,
        "dtype": cfg.dtype,
        "weights": plan.weights or cfg.dtype,
        "cache": plan.cache or cfg.dtype,
        "prompt": plan.prompt,
        "output": plan.output,
        "context": cfg.seq,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "kv_value_bytes_per_token": plan.kv_value_bytes_per_token,
        "kv_scales_included": plan.cache is not None,
        "weight_bytes": plan.held_weight_bytes,
        "hbm_bytes": int(plan.chips * plan.chip.hbm_bytes),
        "batch": plan.batch,
        "batch_asked": plan.batch_asked,
        "fits": plan.fits,
        "fits_at_prompt": plan.fits_at_prompt,
        "max_batch": plan.max_batch,
        "decode_step_s": plan.decode_step_s,
        "decode_bound": plan.decode_bound,
        "prefill_mfu": plan.prefill_mfu,
        "prefill_flops": plan.prefill_flops,
        "prefill_s": plan.prefill_s,
        "prefill_attention_s": plan.prefill_attention_s,
        "ttft_s": plan.prefill_s,
        "tpot_s": plan.decode_step_s,
        "tpot_colocated_s": plan.tpot_colocated_s,
        "tokens_per_s_per_chip": plan.tokens_per_s_per_chip,
        "requests_per_s_per_replica": plan.requests_per_s_per_replica,
        "generate_requests_per_s": plan.generate_requests_per_s,
        "kv_tokens_freed_per_step": plan.kv_tokens_freed_per_step,
        "prefill_to_generate": plan.prefill_to_generate,
        "slo_ttft_s": plan.slo_ttft_s,
        "slo_tpot_s": plan.slo_tpot_s,
        "meets_slos": plan.meets_slos,
        "page_size": plan.page_size,
        "kv_pages": plan.kv_pages,
        "sequences_paged": plan.sequences_paged,
        "sequences_reserved": plan.sequences_reserved,
        "rate": plan.rate,
        "min_chips": None if plan.rate is None else min_chips(plan),
        "min_chips_colocated": plan.min_chips_colocated,
        "min_chips_disaggregated": plan.min_chips_disaggregated,
    }

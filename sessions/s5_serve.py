"""Session 5: serving more users from the same memory. int8 weights, an int8 KV
cache and grouped-query attention, each lever beside its prediction; then the
planner on a published model.

Session 3 showed that decode waits on memory: every step reads every weight, and
each sequence's whole cache. Fewer bytes are more tokens. int8 weights read 1 byte
a weight where float32 reads 4 (bfloat16 2), plus one scale per output channel; an
int8 cache 1 byte a value, plus one scale per token and head. Grouped-query
attention shares each key/value head among G = H / K query heads, so the cache
holds K heads, not H: that changes the model, so it has to be trained. Each lever
costs some quality, measured here through the decode path itself: the validation
loss, and how often greedy decoding picks the full model's token.

    python sessions/s2_train.py --checkpoint-every 200 && python sessions/s5_serve.py
    python sessions/s5_serve.py --random-params --preset tiny         # no checkpoint
    python sessions/s5_serve.py --train-kv-heads 150    # K = H, H/2, 1: trained, then served
    python sessions/s5_serve.py --target h100:1          # the int8 decode, compiled for a chip
"""

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from roofline import decode_cost
from roofline.flops import model_line
from roofline.hardware import find_chip, local_roofs
from roofline.plan.serving import plan_serving
from roofline.plan.serving_report import serving_lines, serving_summary
from roofline.timing import time_calls
from sessions.errors import UsageError, run_main
from sessions.inference import kv_cache, layout
from sessions.inference.quality import greedy_agreement, val_loss, validation_batches
from sessions.model import quantize
from sessions.model.config import PUBLISHED, TrainConfig
from sessions.plan import programs, serve_on_target
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.cli import NEW_TOKENS, serving_config
from sessions.run.levers import (
    kv_heads_lines,
    lever_table_lines,
    levers_summary,
    quality_lines,
    serve_flags,
    widening_line,
)
from sessions.run.serving import inference_config, load_params, prompt_for
from sessions.shard import sharding
from sessions.train import data
from sessions.train.step import train_briefly

REPEATS = 3  # each timing: one uncounted call (it compiles), then the median of 3
# The levers: (weights, cache), each "full" (the compute dtype) or "int8".
LEVERS = [("full", "full"), ("int8", "full"), ("full", "int8"), ("int8", "int8")]


def timed_decode(params, weights, cfg, prompt, B, n, int8_cache, roofs):
    """(roofline DecodeStep, Achieved) of n decode steps of B copies of `prompt` from
    `weights` (full or int8), the cache full or int8, timed as session 3 times decode."""
    P = len(prompt)
    prompts = jnp.asarray(np.tile(prompt, (B, 1)), jnp.int32)
    logits, cache = kv_cache.prefill(params, prompts, cfg, int8_cache)
    tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - P)))  # [B, T]: room for n more
    decode = kv_cache.repeatable_decode(
        weights, cache, tokens, logits, P, n, jax.random.key(0), cfg
    )
    step_s = time_calls(decode, repeats=REPEATS).median / n
    # Beside the roofline: the bytes this lever's step must read, weights once and B caches.
    kinds = {"weights": "int8" if isinstance(weights["embed"], quantize.Int8) else None}
    kinds["cache"] = "int8" if int8_cache else None
    peak, bandwidth = roofs.peak_flops, roofs.bandwidth
    step = decode_cost.decode_step_cost(cfg, B, peak_flops=peak, bandwidth=bandwidth, **kinds)
    return step, decode_cost.achieved(step, step_s, peak_flops=peak, bandwidth=bandwidth)


def main(argv=None):
    args = serve_flags(argv)
    if args.decode_impl != "xla":  # its levers are int8, which our kernels do not read
        raise UsageError("--decode-impl pallas: s5_serve.py times int8 levers; try s3_infer.py")
    if args.target:  # the decode of each lever compiled for a chip this machine lacks; exit
        target, devices = programs.devices_for(args.target)
        serving = serving_config(args, platform=target.chip.platform)  # that chip's defaults
        planned = serve_on_target.plan_levers(serving, args.batches, target, devices)
        return programs.write_plan(planned, args.hlo_out, args.summary_out)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    serving = serving_config(args)  # the model the flags ask for, and the prompt
    cfg, meta = inference_config(serving)  # a checkpoint's shapes, or the flags' (random)
    prompt, unit, _ = prompt_for(serving, cfg, meta)
    if unit == "token":  # a checkpoint keeps no corpus: s5 validates on the platform's own
        raise UsageError("s5_serve.py measures quality on bytes; this checkpoint is of token files")
    n = args.new_tokens or min(NEW_TOKENS, cfg.seq - len(prompt))
    kv_cache.check_lengths(cfg, len(prompt), max(n, 1))
    one_device = sharding.make_mesh(sharding.parse_mesh(None, 1), jax.devices()[:1])
    params, source = load_params(serving.checkpoint_dir, args.seed, cfg, meta, one_device)
    print(f"session 5 | 1 x {jax.devices()[0].device_kind} | {source}")
    print(f"model: {model_line(cfg, length='T')} | {cfg.dtype} | prompt {len(prompt)} {unit}s")
    roofs = local_roofs(cfg.dtype, stream="read", devices=1)
    print(f"roofs: {roofs.peak_flops / 1e12:.3f} TFLOP/s ({roofs.peak_source}), ", end="")
    print(f"{roofs.bandwidth / 1e9:.1f} GB/s ({roofs.bandwidth_source})")

    # 1. What each lever costs in quality, measured where it acts: the validation
    # loss of decode itself, teacher-forced (each position's true token fed in, the
    # cache filled a token at a time), on the batches session 2 validates on; and
    # the share of a greedy continuation's tokens it picks as full precision does.
    corpus = data.open_corpus(serving.corpus, cfg.seq)
    tc = TrainConfig(batch=meta["batch"], seed=meta["seed"]) if meta else TrainConfig(batch=4)
    val = validation_batches(corpus.val, cfg, tc)
    prompts = jnp.asarray(val[0]["inputs"][:16, : len(prompt)])  # 16 prompts of validation text
    quality = {}
    for w, c in LEVERS:
        int8 = {"int8_weights": w == "int8", "int8_cache": c == "int8"}
        quality[w, c] = (
            val_loss(params, cfg, val, **int8),
            greedy_agreement(params, cfg, prompts, n, **int8),
        )
    for line in quality_lines(quality, n, unit):
        print(line)

    # 2. What each lever buys: every weight once a step, in int8 a quarter of float32's
    # bytes (plus a scale per output channel), and each sequence's cache. The weights
    # are laid out for decode once ([out, in], sessions/inference/layout.py), then quantized.
    full = layout.decode_weights(params, cfg)
    weights = {"full": full, "int8": layout.quantize_decode_weights(full)}
    rows = []
    for w, c in LEVERS:
        for B in args.batches:
            step, got = timed_decode(params, weights[w], cfg, prompt, B, n, c == "int8", roofs)
            rows.append((w, c, step, got))
    for line in lever_table_lines(rows):
        print(line)
    # Bytes stored are not bytes read: what did this machine's XLA make of int8?
    copies = serve_on_target.float_copies_here(weights["int8"], cfg, args.batches[0])
    print(widening_line(copies, jax.default_backend()))

    # 3. Grouped-query attention changes the model: K = H, H/2 and 1 key/value heads,
    # each trained from scratch for the same steps on the same batches, then served.
    trained = []
    if args.train_kv_heads:
        # At least 4 query heads, so that H, H/2 and 1 are three models: the same width.
        H = max(cfg.heads, 4)
        base = dataclasses.replace(cfg, heads=H, head_dim=cfg.heads * cfg.head_dim // H)
        steps = dataclasses.replace(tc, steps=args.train_kv_heads, warmup=args.train_kv_heads // 10)
        B = args.batches[-1]
        for K in (H, H // 2, 1):
            gqa = dataclasses.replace(base, kv_heads=K)
            gqa_params, loss = train_briefly(gqa, steps, corpus.train, val)
            gqa_weights = layout.decode_weights(gqa_params, gqa)
            step, got = timed_decode(gqa_params, gqa_weights, gqa, prompt, B, n, False, roofs)
            trained.append(
                {
                    "cfg": gqa,
                    "kv_heads": K,
                    "val_loss": loss,
                    "cache_bytes": step.cache_bytes / B,
                    "batch": B,
                    "tokens_per_second": got.tokens_per_s,
                    "mbu": got.mbu,
                }
            )
        for line in kv_heads_lines(trained, args.train_kv_heads, unit):
            print(line)

    # 4. The same arithmetic for a published model on a datasheet's chip: which batch
    # fits, which roof binds it, with int8 weights and cache (roofline/plan/serving.py).
    published = PUBLISHED[args.plan]
    plan = plan_serving(
        published.model,
        find_chip(args.plan_chip),
        batches=[1, 8, 64],
        prompt=1024,
        weights="int8",
        cache="int8",
    )
    for line in serving_lines(plan, f"planned: {args.plan} ({published.source})"):
        print(line)

    if args.summary_out:
        summary = {
            "levers": levers_summary(rows, quality),
            "kv_heads": [{k: v for k, v in t.items() if k != "cfg"} for t in trained],
            "plan": serving_summary(plan, preset=args.plan),
            "model": dataclasses.asdict(cfg),
            "source": source,
            "peak_flops": roofs.peak_flops,
            "bandwidth": roofs.bandwidth,
        }
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

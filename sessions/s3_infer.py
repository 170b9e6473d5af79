"""Session 3: inference. A KV cache, prefill and decode, batched generation,
and the decode roofline.

Prefill reads the prompt like a training step and is compute-bound. Decode
makes one token per sequence per step, reading every weight and the whole
cache for it: memory-bound until the batch is large. This script loads the
model session 2 trained, times both, sets each batch size beside its
roofline, and ends with a sampled continuation. Our decode kernels (--decode-impl pallas)
run interpreted on a CPU, where a time means nothing: they decode once, untimed, beside
XLA's step.

    python sessions/s2_train.py --checkpoint-every 200 && python sessions/s3_infer.py
    python sessions/s3_infer.py --random-params --preset gpt2-bytes --batches 1,8
    python sessions/s3_infer.py --target h100:1               # compile only, for a chip
    python sessions/s3_infer.py --random-params --dtype bfloat16 --decode-impl pallas
        # on a CPU our kernels run interpreted: decoded once beside XLA's step, untimed
    python sessions/s3_infer.py --target h100:1 --decode-impl pallas --batches 1,8
        # and how long ours take to compile, beside XLA's decode (measured here)
    python sessions/s3_infer.py --target tpu-v5e:2x4 --mesh tp=8 --batches 8,64,512
"""

import dataclasses
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from roofline import decode_cost
from roofline.flops import model_line
from roofline.hardware import local_roofs
from roofline.timing import time_calls
from roofline.units import ms
from sessions.errors import UsageError, run_main
from sessions.inference import kernel_check, kernel_step, kv_cache, layout, step_times
from sessions.inference.sample import sample_tokens, show
from sessions.plan import compile_times, infer_on_target, kernels_on_target, programs
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.cli import NEW_TOKENS, infer_flags, make_folder, serving_config
from sessions.run.report import decode_table_lines, plot_decode
from sessions.run.serving import inference_config, load_params, prompt_for
from sessions.shard import sharding

# Each timing below: one uncounted call first (it compiles), then the median of
# REPEATS calls, each waited for with block_until_ready, since JAX returns before
# the work is done (roofline/timing.py).
REPEATS = 3
LAUNCH_SECONDS = 40  # the most our kernels' compile for h100:1 may take, decoding once


def main(argv=None):
    args = infer_flags(argv)
    if args.target:  # compile prefill and decode for a chip this machine lacks, report, exit
        target, devices = programs.devices_for(args.target)
        serving = serving_config(args, platform=target.chip.platform)  # that chip's defaults
        planned = infer_on_target.plan_inference(serving, args.mesh, args.batches, target, devices)
        if kernel_step.impl_for(args.decode_impl, target.chip.platform) == "pallas":
            cfg, _ = inference_config(serving)  # ours compiled for the chip: how long it took
            for line in compile_times.lines_on_target(cfg, planned.plans, target, devices):
                print(line)
        return programs.write_plan(planned, args.hlo_out, args.summary_out)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    make_folder(args.run_dir, "--run-dir")  # the plot's folder, made before any work
    devices = jax.devices() if args.mesh else jax.devices()[:1]
    sizes = sharding.parse_mesh(args.mesh, len(devices))
    # --decode-impl pallas: our kernels, compiled for a GPU, elsewhere interpreted: then
    # slowly, and their time says nothing about a GPU's, so they decode once, untimed.
    impl = kernel_step.impl_for(args.decode_impl, devices[0].platform)
    once = impl == "pallas-interpret"
    rows = (1,) if once else programs.DECODE_ROWS
    args.batches = args.batches or [b * sizes["data"] * sizes["fsdp"] for b in rows]
    for b in args.batches:
        if b % (sizes["data"] * sizes["fsdp"]):
            raise UsageError(f"--batches: {b} does not divide over data x fsdp of --mesh")
    serving = serving_config(args)  # the model the flags ask for, and the prompt
    cfg, meta = inference_config(serving)  # a checkpoint's shapes, or the flags' (random)
    prompt, unit, tokenizer = prompt_for(serving, cfg, meta)  # bytes, or token files' ids
    P = len(prompt)
    sharding.check_divisible(cfg, sizes["data"] * sizes["fsdp"], sizes)
    # As many new tokens as asked; by default NEW_TOKENS (interpreted: one compiled call of
    # kv_cache.STEPS), or as many as the context holds after the prompt (a prompt that fills
    # it leaves none: an error).
    n = args.new_tokens or min(kv_cache.STEPS if once else NEW_TOKENS, cfg.seq - P)
    kv_cache.check_lengths(cfg, P, max(n, 1))
    for B in args.batches if impl else []:  # what the kernels do not run, refused before any work
        kernel_step.check_supported(cfg, B, devices=len(devices), interpret=once)
    mesh = sharding.make_mesh(sizes, devices)
    with jax.set_mesh(mesh):
        params, source = load_params(serving.checkpoint_dir, args.seed, cfg, meta, mesh)
        print(f"session 3 | {len(devices)} x {devices[0].device_kind} | {source}")
        print(
            f"model: {model_line(cfg, length='T')} | {cfg.dtype} | prompt {P} "
            f"{unit}s, {n} decode steps | decode {impl or 'xla'}"
        )
        if once:  # no timing table: what the kernels are, and the sample they decoded
            text = decode_once(params, cfg, prompt, n, args, unit, tokenizer)
            return write_summary(args.summary_out, cfg, source, text, {})
        # The roofs of the whole mesh: each device's datasheet, or this CPU's measured
        # figures, which its simulated devices share (roofline.hardware.local_roofs).
        roofs = local_roofs(cfg.dtype, stream="read", devices=mesh.size)
        peak, bandwidth = roofs.peak_flops * mesh.size, roofs.bandwidth * mesh.size
        print(f"roofs: {peak / 1e12:.3f} TFLOP/s ({roofs.peak_source}), ", end="")
        print(f"{bandwidth / 1e9:.1f} GB/s ({roofs.bandwidth_source})")

        # Every decode step reads every weight, so they are laid out for it once:
        # in the compute dtype, each matmul weight [out, in] (sessions/inference/layout.py).
        weights = layout.decode_weights(params, cfg)
        key = jax.random.key(0)
        rows = []  # (roofline DecodeStep, Achieved, prefill seconds) per batch
        times = []  # its floor and estimate, on a GPU (sessions/inference/step_times.py)
        for B in args.batches:
            # The prompt, tiled into B rows [B, P], split over data x fsdp as a training batch is.
            prompts = jax.device_put(np.tile(prompt, (B, 1)), sharding.batch_sharding(mesh))

            # Prefill: the B·P prompt tokens through the model in one pass, like a training
            # forward pass: compute-bound, with the model's causal attention.
            prefill = functools.partial(kv_cache.prefill, params, prompts, cfg)
            prefill_s = time_calls(prefill, repeats=REPEATS).median
            logits, cache = prefill()
            # What it returns: the logits [B, V] for position P, and the cache, one
            # {"k": [B, H, D, T], "v": [B, H, T, D]} per layer, a key and a value for
            # each of the H heads at each of the T positions (2·L·B·T·H·D numbers),
            # slots 0..P-1 filled. Decode reads the filled ones and writes one a step.
            tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - P)))  # [B, T]: room for n more

            # Decode: one token per row per step, [B, 1] through the model, reading
            # every weight and the cache: memory-bound until B is large. decode_loop
            # queues ceil(n / STEPS) calls of one compiled program of kv_cache.STEPS
            # steps, without waiting for any; each call of `decode` runs the n steps
            # from the prompt's end again.
            decode = kv_cache.repeatable_decode(
                weights, cache, tokens, logits, P, n, key, cfg, impl
            )
            step_s = time_calls(decode, repeats=REPEATS).median / n

            # Beside the roofline: the bytes and FLOPs a step of this batch must move.
            step = decode_cost.decode_step_cost(cfg, B, peak_flops=peak, bandwidth=bandwidth)
            got = decode_cost.achieved(step, step_s, peak_flops=peak, bandwidth=bandwidth)
            rows.append((step, got, prefill_s))
            times.append(step_times.step_times(step, weights, cfg, B, impl))
        for line in decode_table_lines(rows, cfg, args.batches[-1], P, peak, bandwidth):
            print(line)
        if estimated := [(s.batch, k, t) for (s, *_), (k, t) in zip(rows, times) if t]:
            print("predicted (roofline/plan/decode_estimate.py), kernels a token as compiled:")
            for b, k, t in estimated:
                print(
                    f"  batch {b}: {k} kernels, floor {ms(t.floor_s)} ({t.floor_bound}), "
                    f"estimate {ms(t.estimate_s)} ({t.estimate_bound})"
                )
        path = os.path.join(args.run_dir, "decode_roofline.png")
        plot_decode([(s.batch, g.tokens_per_s) for s, g, _ in rows], cfg, peak, bandwidth, path)
        print(f"plot: {path}")
    # One device, outside the mesh: the sample is one sequence, from the decode step asked for.
    key = jax.random.key(1)
    sampled = sample_tokens(params, cfg, prompt, n, key, args.temperature, args.decode_impl)
    text = show(sampled, unit, tokenizer)
    print("sample:\n" + text)
    steps, measured, prefill_seconds = zip(*rows)
    summary = decode_cost.measured_summary(
        steps, measured, cfg, peak_flops=peak, bandwidth=bandwidth, times=[t for _, t in times]
    )
    summary.update(
        prefill_seconds=prefill_seconds[-1],
        prefill_batch=args.batches[-1],
        prefill_tokens_per_sec=args.batches[-1] * P / prefill_seconds[-1],
    )
    return write_summary(args.summary_out, cfg, source, text, summary)


def decode_once(params, cfg, prompt, n, args, unit, tokenizer):
    """--decode-impl pallas where the kernels run interpreted (a CPU): each batch decoded
    once with them and once with XLA's step, from one prefill and one key, untimed; what a
    token launches on the GPU they are for, compiled for it; where each kernel is written.
    Returns the sample: the first row of the kernels' first decode."""
    weights = layout.decode_weights(params, cfg)
    key = jax.random.key(1)
    sampled = None
    for B in args.batches:
        said = "then with ours in Mosaic GPU's interpreter (seconds a step here: untimed)"
        print(f"batch {B}: {n} tokens with XLA's step, {said}", flush=True)
        # Ours compile in seconds on JAX 0.10 and 0.11; Mosaic GPU's layout search on JAX 0.12
        # may take minutes (sessions/plan/kernels_on_target.py): LAUNCH_SECONDS.
        print("  " + kernels_on_target.decode_launches(cfg, B, seconds=LAUNCH_SECONDS))
        prompts = jnp.asarray(np.tile(prompt, (B, 1)))
        both = kernel_check.decode_both(
            weights, params, prompts, n, key, args.temperature, cfg, "pallas-interpret"
        )
        print("  " + kernel_check.compared_line(both, args.temperature))
        sampled = both.ours[0] if sampled is None else sampled
    print("our kernels, to read:")
    for path, what in kernel_check.kernel_files():
        print(f"  {path}  {what}")
    text = show(sampled, unit, tokenizer)
    print("sample:\n" + text)  # our kernels' tokens: the first row of their first decode
    return text


def write_summary(path, cfg, source, sample, summary):
    """--summary-out: `summary` with the model, its weights' source and the sample, as JSON."""
    if path:
        summary.update(model=dataclasses.asdict(cfg), source=source, sample=sample)
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

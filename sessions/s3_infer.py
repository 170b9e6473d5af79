"""Session 3: inference. A KV cache, prefill and decode, batched generation,
and the decode roofline.

Prefill reads the prompt like a training step and is compute-bound. Decode
makes one token per sequence per step, reading every weight and the whole
cache for it: memory-bound until the batch is large. This script loads the
model session 2 trained, times both, sets each batch size beside its
roofline, and ends with a sampled continuation.

    python sessions/s2_train.py --checkpoint-every 200 && python sessions/s3_infer.py
    python sessions/s3_infer.py --random-params --preset gpt2 --batches 1,8
    python sessions/s3_infer.py --target h100:1               # compile only, for a chip
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
from roofline.calibrate import read_bandwidth
from roofline.hardware import datasheet_chip, local_peak_flops
from roofline.timing import time_calls
from sessions import aot, inference, sharding
from sessions.accelerator import capability_defaults, check_accelerator_visible
from sessions.checkpoint import Checkpoints, newest_meta
from sessions.cli import ArgumentParser, add_shape_flags, configs_from_args, positive_int, run_main
from sessions.config import PRESETS, ModelConfig, TrainConfig, UsageError
from sessions.data import encode
from sessions.generate import generate
from sessions.model import init_params
from sessions.report import plot_decode
from sessions.train import init_state, make_optimizer

PROMPT = "The import statement "
SHAPES = ("vocab", "embed", "ff", "heads", "head_dim", "layers", "seq", "attention", "positions")
TRAINING_FLAGS = ("steps", "batch", "lr", "log_every", "data")


def parse_args(argv):
    parser = ArgumentParser(prog="s3_infer.py", description=__doc__.split("\n\n")[0])
    add_shape_flags(parser)
    parser.add_argument("--checkpoint-dir", default="runs/s2/checkpoints")
    parser.add_argument("--random-params", action="store_true", help="no checkpoint: speed only")
    parser.add_argument("--batches", help="decode batch sizes (default 1,4,16,64 x data x fsdp)")
    parser.add_argument("--new-tokens", type=positive_int, default=64, help="decode steps")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument("--mesh", help="axis=size,... over all devices (default: one device)")
    parser.add_argument("--summary-out", help="write the numbers here, as JSON")
    parser.add_argument("--run-dir", default="runs/s3", help="the plot goes here")
    parser.add_argument("--target", help="CHIP[:SHAPE] (h100:8, tpu-v5e:2x4): compile, plan, exit")
    parser.add_argument("--hlo-out", help="with --target: write the decode program (HLO) here")
    args = parser.parse_args(argv)
    for flag in TRAINING_FLAGS:
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} is a training flag (try --batches)")
    try:
        args.batches = args.batches and [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UsageError(f"--batches {args.batches}: positive integers, e.g. 1,4,16") from None
    if args.batches is not None and min(args.batches) < 1:
        raise UsageError(f"--batches {args.batches}: positive integers, e.g. 1,4,16")
    if args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature}: 0 (greedy) or positive")
    return args


def configure(args, platform=None):
    """(cfg, the checkpoint's metadata or None): the shapes, from the newest
    checkpoint of an s2 run or, with --random-params or --target, from the flags,
    for `platform` (default: this machine's)."""
    on_cpu = (platform or jax.default_backend()) == "cpu"
    # --dtype, or float32 on a GPU below compute capability 8.0 (sessions/accelerator.py).
    caps = capability_defaults(None if platform else jax.local_devices()[0], args.dtype)
    # The compute dtype, and XLA's attention (a checkpoint may name a kernel of another chip).
    compute = {
        "dtype": caps.dtype or ("float32" if on_cpu else "bfloat16"),
        "attention_impl": "einsum" if on_cpu else "fused",
    }
    if args.random_params or args.target:
        preset = args.preset or ("cpu" if on_cpu else "course")
        return configs_from_args(args, preset, **compute)[0], None
    meta = newest_meta(args.checkpoint_dir)
    if meta is None:
        raise UsageError(
            f"no checkpoint in {args.checkpoint_dir}: train one with `python sessions/s2_train.py "
            "--checkpoint-every 200` (it also saves at the end), or pass --random-params"
        )
    try:
        trained = ModelConfig(**meta["model"])
    except TypeError:
        raise UsageError(f"{args.checkpoint_dir}: a checkpoint of another version") from None
    # Shape flags (and --preset) may only confirm the checkpoint's shapes.
    flags = {f: getattr(args, f) for f in SHAPES if getattr(args, f, None) is not None}
    wanted = dataclasses.replace(PRESETS[args.preset].model if args.preset else trained, **flags)
    asked = [f for f in SHAPES if getattr(wanted, f) != getattr(trained, f)]
    if asked:
        theirs = ", ".join(f"{f}={getattr(trained, f)}" for f in asked)
        ours = ", ".join(f"{f}={getattr(wanted, f)}" for f in asked)
        raise UsageError(f"the checkpoint has {theirs}, not {ours}; drop the shape flags")
    return dataclasses.replace(trained, **compute), meta


def load(args, cfg, meta, mesh):
    """(params, where they came from), each shard built or restored on its device."""
    if meta is None:
        init = functools.partial(init_params, cfg)
        return sharding.init_sharded(init, jax.random.key(args.seed), mesh)[0], "random parameters"
    trained = ModelConfig(**meta["model"])  # as saved: the identity a restore checks
    tc = TrainConfig(batch=meta["batch"], seed=meta["seed"], steps=meta["steps"])
    init = functools.partial(init_state, cfg=trained, optimizer=make_optimizer(tc, tc.steps))
    abstract = sharding.abstract_sharded(init, jax.random.key(0), mesh)
    with Checkpoints(args.checkpoint_dir, 0, trained, tc) as checkpoints:
        step, state = checkpoints.restore_latest(abstract)
    return state["params"], f"checkpoint at step {step} of {checkpoints.directory}"


def time_batch(params, cfg, prompt, batch, n, mesh, repeats=3, best=False):
    """(prefill seconds, decode seconds per step) for `batch` copies of the prompt:
    the median of `repeats` timed calls, or the fastest (best)."""
    tokens = jax.device_put(np.tile(prompt, (batch, 1)), sharding.batch_sharding(mesh))
    prefill = time_calls(lambda: inference.prefill(params, tokens, cfg), repeats=repeats)
    logits, cache = inference.prefill(params, tokens, cfg)
    state = [jnp.pad(tokens, ((0, 0), (0, cfg.seq - len(prompt)))), cache, logits]
    key, weights = jax.random.key(0), inference.decode_weights(params, cfg)

    def steps():  # n steps from the prompt's end, each call rewriting the same slots
        tokens, cache, logits = state
        state[:] = inference.decode(
            weights, cache, tokens, logits, len(prompt), n, key, 1.0, cfg=cfg, greedy=False
        )
        return state

    decode = time_calls(steps, repeats=repeats)
    if best:
        return prefill.best, decode.best / n
    return prefill.median, decode.median / n


def plan_on_target(args):
    """--target: compile prefill and each batch's decode loop for a chip this
    machine lacks, print what each device holds and the decode roofline, exit."""
    target, devices = aot.devices_for(args.target)
    cfg, _ = configure(args, platform=target.chip.platform)
    prompt, preset = encode(args.prompt), args.preset or "course"
    inference.check_lengths(cfg, len(prompt), 1)  # the decode program takes any count of steps
    planned = aot.plan_decode(args.mesh, cfg, args.batches, len(prompt), preset, target, devices)
    if args.hlo_out and planned.compiled is not None:
        with open(args.hlo_out, "w") as f:
            f.write(planned.compiled.as_text())
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(planned.summary, f, indent=1)
    if "error" in planned.summary:
        raise UsageError(planned.summary["error"])
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.target:
        return plan_on_target(args)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    devices = jax.devices() if args.mesh else jax.devices()[:1]
    sizes = sharding.parse_mesh(args.mesh, len(devices))
    args.batches = args.batches or [b * sizes["data"] * sizes["fsdp"] for b in aot.DECODE_ROWS]
    for b in args.batches:
        if b % (sizes["data"] * sizes["fsdp"]):
            raise UsageError(f"--batches: {b} does not divide over data x fsdp of --mesh")
    cfg, meta = configure(args)
    sharding.check_divisible(cfg, sizes["data"] * sizes["fsdp"], sizes)
    prompt = encode(args.prompt)
    inference.check_lengths(cfg, len(prompt), args.new_tokens)
    mesh = sharding.make_mesh(sizes, devices)
    with jax.set_mesh(mesh):
        params, source = load(args, cfg, meta, mesh)
        print(f"session 3 | {len(devices)} x {devices[0].device_kind} | {source}")
        print(
            f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
            f"T={cfg.seq} | {cfg.dtype} | prompt {len(prompt)} bytes, "
            f"{args.new_tokens} decode steps"
        )
        # The roofs of the whole mesh. A CPU's are measured; its simulated devices share them.
        peak, peak_source = local_peak_flops(cfg.dtype)
        peak *= mesh.size
        chip = datasheet_chip()
        bandwidth = chip.hbm_bandwidth * mesh.size if chip else read_bandwidth()
        bw_source = f"{chip.name} datasheet" if chip else "measured read-only stream"
        print(f"roofs: {peak / 1e12:.3f} TFLOP/s ({peak_source}), ", end="")
        print(f"{bandwidth / 1e9:.1f} GB/s ({bw_source})")

        rows = []  # (roofline DecodeStep, Achieved, prefill seconds) per batch
        for b in args.batches:
            prefill_s, step_s = time_batch(params, cfg, prompt, b, args.new_tokens, mesh)
            step = decode_cost.decode_step_cost(cfg, b, peak_flops=peak, bandwidth=bandwidth)
            got = decode_cost.achieved(step, step_s, peak_flops=peak, bandwidth=bandwidth)
            rows.append((step, got, prefill_s))
        print_table(rows, cfg, args.batches[-1], len(prompt), peak, bandwidth)
        path = os.path.join(args.run_dir, "decode_roofline.png")
        plot_decode([(s.batch, g.tokens_per_s) for s, g, _ in rows], cfg, peak, bandwidth, path)
        print(f"plot: {path}")
    # One device, outside the mesh: the sample is one sequence.
    text = generate(params, cfg, args.prompt, args.new_tokens, jax.random.key(1), args.temperature)
    print("sample:\n" + text)

    if args.summary_out:
        steps, measured, prefill = zip(*rows)
        summary = decode_cost.measured_summary(
            steps, measured, cfg, peak_flops=peak, bandwidth=bandwidth
        )
        summary.update(
            prefill_seconds=prefill[-1],
            prefill_batch=args.batches[-1],
            prefill_tokens_per_sec=args.batches[-1] * len(prompt) / prefill[-1],
            model=dataclasses.asdict(cfg),
            source=source,
            sample=text,
        )
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def print_table(rows, cfg, prefill_batch, prompt_len, peak, bandwidth):
    prefill_s = rows[-1][2]
    print(
        f"prefill: {prefill_batch} x {prompt_len} tokens in {prefill_s * 1e3:.1f} ms, "
        f"{prefill_batch * prompt_len / prefill_s:,.0f} tokens/s"
    )
    print(
        f"  {'batch':>5} {'ms/step':>9} {'tokens/s':>10} {'MB/step':>9} {'mem ms':>8} "
        f"{'flop ms':>8} {'roof tok/s':>10} {'MBU':>6} {'MFU':>6}"
    )
    for s, g, _ in rows:
        print(
            f"  {s.batch:>5} {g.step_s * 1e3:>9.2f} {g.tokens_per_s:>10,.0f} {s.bytes / 1e6:>9.1f} "
            f"{s.memory_s * 1e3:>8.2f} {s.compute_s * 1e3:>8.3f} {s.tokens_per_s:>10,.0f} "
            f"{100 * g.mbu:>5.1f}% {100 * g.mfu:>5.1f}%"
        )
    with_cache = decode_cost.compute_bound_batch(cfg, peak_flops=peak, bandwidth=bandwidth)
    napkin = decode_cost.compute_bound_batch(cfg, peak_flops=peak, bandwidth=bandwidth, cache=False)
    where = f"from batch {with_cache:,.0f}" if with_cache else f"at no batch (T={cfg.seq})"
    print(
        f"decode turns compute-bound {where}; with the weights alone it would from batch "
        f"{napkin:,.0f}: each sequence's cache is its own and is read every step"
    )


if __name__ == "__main__":
    sys.exit(run_main(main))

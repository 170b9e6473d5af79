"""Session 2: the session-1 model with five add-ons, each of which can be
switched off to measure what it buys.

    1. attention             (--no-attention)  tokens read earlier tokens
    2. positional embeddings (--no-positions)  ... and know their order
    3. whole-step jit        (--no-jit)        forward, backward and update, compiled as one
    4. overlapped loading    (--no-overlap)    the next batch is ready before it is needed
    5. multichip             (--mesh)          params born sharded over every device

and one measurement: model FLOPs per second, 6·B·P plus attention, over the
chip's peak (MFU).

    python sessions/s2_train.py                       # the default: a few minutes on a CPU
    python sessions/s2_train.py --preset tiny --steps 3
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python sessions/s2_train.py --preset tiny --mesh fsdp=4,tp=2
    python sessions/s2_train.py --preset gpt2 --target tpu-v5e:2x4   # compile only, for a TPU
"""

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np

from roofline.compare import profile_table
from roofline.flops import napkin_train_flops, param_count, train_flops
from roofline.hardware import local_peak_flops
from roofline.memory import allocator_peak, step_memory
from roofline.profile import TraceWindow
from sessions import aot, data, multihost, sharding
from sessions.accelerator import capability_defaults, check_accelerator_visible
from sessions.attention import choose as choose_attention
from sessions.checkpoint import Checkpoints, Interrupted, SaveHook
from sessions.cli import (
    ArgumentParser,
    add_shape_flags,
    configs_from_args,
    non_negative_int,
    positive_int,
    run_main,
)
from sessions.config import UsageError
from sessions.generate import generate
from sessions.loop import TrainingDiverged, train_loop
from sessions.prefetch import Prefetcher, Synchronous
from sessions.report import plot_loss, summarize, summary_lines
from sessions.train import init_state, make_eval_step, make_optimizer, make_train_step

PROMPT = "The import statement "


def parse_args(argv):
    parser = ArgumentParser(prog="s2_train.py", description=__doc__.split("\n\n")[0])
    add_shape_flags(parser)
    parser.add_argument("--mesh", help="axis=size,... over data, fsdp, tp (default: fsdp=all)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="matmul dtype (default: bfloat16 on GPU/TPU, float32 on CPU)",
    )
    parser.add_argument(
        "--attention-impl",
        choices=["einsum", "fused", "cudnn", "splash"],
        help="einsum by hand (default on CPU); fused: the chip's fastest, cuDNN's flash "
        "kernel on NVIDIA, Pallas splash on TPU, else jax.nn.dot_product_attention",
    )
    parser.add_argument(
        "--target",
        metavar="CHIP[:SHAPE]",
        help="compile the step for a chip this machine lacks (tpu-v5e:2x4, h100:8; chips: "
        "python -m roofline chips), print its memory, collectives, kernels and roofline, exit",
    )
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--no-positions", action="store_true")
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="load each batch in the loop once the previous step is done (blocking loads)",
    )
    parser.add_argument(
        "--data-delay-ms",
        type=non_negative_int,
        default=0,
        help="sleep this long per batch: simulated slow storage",
    )
    parser.add_argument("--eval-every", type=positive_int)
    parser.add_argument("--metrics-out", help="write one JSON object per logged step here")
    parser.add_argument("--summary-out", help="write the closing summary here, as JSON")
    parser.add_argument(
        "--hlo-out", help="with --target: write the compiled program (HLO text) here, to read"
    )
    parser.add_argument("--run-dir", default="runs/s2", help="loss curve and outputs go here")
    parser.add_argument("--profile", metavar="DIR", help="trace a few steps into DIR (xprof)")
    parser.add_argument(
        "--show-sharding",
        action="store_true",
        help="print each weight's sharding even on one device",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=0,
        help="save every N steps, on SIGINT/SIGTERM and at the end (0: never)",
    )
    parser.add_argument("--checkpoint-dir", help="default: RUN_DIR/checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--prompt", help=f"start of the sample (default: '{PROMPT}')")
    parser.add_argument("--sample-bytes", type=non_negative_int, default=300)
    multihost.add_flags(parser)
    return parser.parse_args(argv)


def choose_configs(args, platform=None):
    """(preset, ModelConfig, TrainConfig, attention note) for the chip the step
    is built for: `platform` ("cpu", "gpu", "tpu"), by default this machine's.
    Accelerators default to the course's shapes, bf16 and their flash kernel."""
    here = platform is None  # the step runs on this machine, not on a --target chip
    platform = platform or jax.default_backend()
    on_cpu = platform == "cpu"
    preset = args.preset or ("cpu" if on_cpu else "course")
    # A GPU below compute capability 8.0 has neither bf16 tensor cores nor cuDNN's attention.
    caps = capability_defaults(
        jax.local_devices()[0] if here else None, args.dtype, args.attention_impl
    )
    overrides = {
        "attention": not args.no_attention,
        "positions": not args.no_positions,
        "dtype": caps.dtype or ("float32" if on_cpu else "bfloat16"),  # caps keeps --dtype
    }
    model_cfg, train_cfg = configs_from_args(args, preset, **overrides)
    if caps.attention_impl:  # below 8.0: XLA's attention, whatever the chip's default
        impl, note = caps.attention_impl, caps.note
    else:
        impl, note = choose_attention(args.attention_impl, platform, model_cfg, train_cfg.batch)
    model_cfg = dataclasses.replace(model_cfg, attention_impl=impl)
    if args.eval_every:
        train_cfg = dataclasses.replace(train_cfg, eval_every=args.eval_every)
    return preset, model_cfg, train_cfg, note


def plan_on_target(args):
    """--target: compile the step these flags describe for a chip this machine
    lacks, print what the compiler did and the roofline, and exit."""
    target, devices = aot.devices_for(args.target)
    preset, cfg, tc, note = choose_configs(args, platform=target.chip.platform)
    planned = aot.plan_target(args.mesh, cfg, tc, preset, target, devices, print, note)
    summary = planned.summary
    if args.hlo_out:
        with open(args.hlo_out, "w") as f:
            f.write(planned.compiled.as_text())
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    if "error" in summary:
        raise UsageError(summary["error"])
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.target:
        return plan_on_target(args)
    multihost.initialize(args)  # before anything touches a device
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    is_main = jax.process_index() == 0
    say = print if is_main else (lambda *a, **k: None)
    preset, cfg, tc, attention_note = choose_configs(args)
    B, S = tc.batch, cfg.seq

    # Data: bytes are tokens; batches are a pure function of (seed, step).
    train_tokens, val_tokens = data.split(data.load_corpus(args.data), S)
    unigram = data.unigram_entropy(train_tokens)

    # Multichip: a mesh over every device of every process, checked before use.
    sizes = sharding.parse_mesh(args.mesh, jax.device_count())
    sharding.check_divisible(cfg, B, sizes, jax.process_count())
    mesh = sharding.make_mesh(sizes)
    batch_sharding = sharding.batch_sharding(mesh)
    checkpoints = open_checkpoints(args, cfg, tc)

    optimizer = make_optimizer(tc, tc.steps)
    init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
    key = jax.random.key(tc.seed)
    with jax.set_mesh(mesh):
        # Shapes first (jax.ShapeDtypeStruct, with the rules' shardings), then
        # each device builds, or restores, only its own shards.
        abstract = sharding.abstract_sharded(init, key, mesh)
        shardings = jax.tree.map(lambda x: x.sharding, abstract)
        if args.resume:
            start, state = resume(checkpoints, abstract, tc.steps, say)
        else:
            start, state = 0, jax.jit(init, out_shardings=shardings)(key)

        flops = train_flops(cfg, B)
        peak = local_peak_flops(cfg.dtype)
        print_header(say, args, preset, cfg, tc, flops, peak, train_tokens, val_tokens, unigram)
        if attention_note:
            say(f"attention: {attention_note}")
        if mesh.size > 1 or args.show_sharding:
            for line in sharding.describe(state["params"], shardings["params"], mesh):
                say(line)
        held, total = sharding.bytes_per_device(state, shardings)
        say(
            f"params + optimizer state: {total / 2**20:.2f} MiB in all, "
            f"{held / 2**20:.2f} MiB per device"
        )
        if start:
            say(f"resumed from the checkpoint at step {start}")

        step_fn = make_train_step(
            cfg,
            optimizer,
            jit=not args.no_jit,
            state_shardings=shardings,
            batch_sharding=batch_sharding,
        )
        if not args.no_jit:
            step_fn = compile_ahead(step_fn, state, B, S, batch_sharding, say)

        make_batch = functools.partial(
            data.get_batch,
            train_tokens,
            batch=B,
            seq=S,
            seed=tc.seed,
            rows=sharding.process_rows(batch_sharding, B, S),
            delay_ms=args.data_delay_ms,
        )
        place = functools.partial(sharding.place_batch, sharding=batch_sharding)
        loader_class = Synchronous if args.no_overlap else Prefetcher
        evaluate = make_evaluator(cfg, val_tokens, tc, batch_sharding, jit=not args.no_jit)
        trace = TraceWindow(args.profile, start, tc.steps) if args.profile else None

        with contextlib.ExitStack() as stack:
            loader = stack.enter_context(loader_class(make_batch, place, start=start))
            save = None
            if checkpoints:
                stack.enter_context(checkpoints)
                save = stack.enter_context(SaveHook(checkpoints))

            def after_step(step, state):
                """Seconds spent on anything but the step (saving), for the loop's clock."""
                return (trace(step, state) if trace else 0.0) + (save(step, state) if save else 0.0)

            metrics_file = None
            if args.metrics_out and is_main:
                mode = "a" if args.resume else "w"  # a resumed run continues the file
                metrics_file = stack.enter_context(open(args.metrics_out, mode))
            state, history, seconds = train_loop(
                step_fn,
                state,
                loader,
                start=start,
                steps=tc.steps,
                log_every=tc.log_every,
                tokens_per_step=B * S,
                flops_per_step=flops,
                peak_flops=peak[0],
                n_devices=mesh.size,
                evaluate=evaluate,
                eval_every=tc.eval_every,
                log=say,
                metrics_file=metrics_file,
                on_step=after_step,
                wait_for_step=args.no_overlap,
            )
            if checkpoints:
                checkpoints.maybe_save(tc.steps, state, force=True)
                say(f"checkpoint saved at step {tc.steps} in {checkpoints.directory}")
        if trace and is_main:
            # The three columns for the steps just traced: napkin, XLA's count, the trace.
            compiled = None if args.no_jit else step_fn
            for line in profile_table(args.profile, cfg, B, compiled, peak, devices=mesh.size):
                say(line)

    # A sample, then the summary a student compares across runs.
    params = multihost.gather(state["params"])
    if args.sample_bytes and is_main:
        # The default prompt is cut to fit a short context; a given one must fit.
        prompt = args.prompt or PROMPT[: cfg.seq // 2]
        text = generate(params, cfg, prompt, args.sample_bytes, jax.random.key(tc.seed + 1))
        say("sample:\n" + text)
    summary = summarize(
        history,
        train_seconds=seconds,
        tokens_per_step=B * S,
        flops_per_step=flops,
        peak=peak,
        n_devices=mesh.size,
        unigram=unigram,
        first_step=start,
        memory=step_memory(None if args.no_jit else step_fn),
        allocator=allocator_peak(),
    )
    for line in summary_lines(summary):
        say(line)
    if args.summary_out and is_main:
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    if is_main:
        path = os.path.join(args.run_dir, "loss.png")
        plot_loss(history, path, unigram, f"s2_train.py --preset {preset}")
        say(f"  loss curve  {path}")
    return 0


def print_header(say, args, preset, cfg, tc, flops, peak, train_tokens, val_tokens, unigram):
    devices = jax.devices()
    processes = jax.process_count()
    say(
        f"session 2 | preset {preset} | {len(devices)} x {devices[0].device_kind} "
        f"({processes} process{'es' if processes > 1 else ''})"
    )
    say(
        f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
        f"S={cfg.seq} V={cfg.vocab} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype} "
        f"matmuls | attention {'on' if cfg.attention else 'off'}, "
        f"positions {'on' if cfg.positions else 'off'}"
    )
    say(
        f"step: {tc.batch} x {cfg.seq} = {tc.batch * cfg.seq:,} tokens | 6·B·P = "
        f"{napkin_train_flops(cfg, tc.batch) / 1e9:.2f} GFLOP | exact with attention = "
        f"{flops / 1e9:.2f} GFLOP"
    )
    say(f"peak: {peak[0] / 1e12:.3f} TFLOP/s per device ({peak[1]})")
    say(
        f"data: {data.describe_corpus(args.data)} | {len(train_tokens):,} "
        f"train / {len(val_tokens):,} val bytes | unigram baseline {unigram:.3f} nats/byte"
    )


def compile_ahead(step_fn, state, B, S, batch_sharding, say):
    """Compile from shapes alone, before the loop: no step is timed with
    compilation in it, and the loop can never trigger a recompile."""
    batch_shape = jax.ShapeDtypeStruct((B, S), np.int32, sharding=batch_sharding)
    start = time.perf_counter()
    compiled = step_fn.lower(state, {"inputs": batch_shape, "targets": batch_shape}).compile()
    say(f"compiled the train step in {time.perf_counter() - start:.1f} s")
    return compiled


def resume(checkpoints, abstract, steps, say):
    """(step, state) of the newest intact checkpoint, placed as `abstract` says."""
    try:
        start, state = checkpoints.restore_latest(abstract, log=say)
        if start >= steps:
            raise UsageError(f"--resume: the run already finished ({start} of {steps} steps)")
    except UsageError:
        checkpoints.close()
        raise
    return start, state


def open_checkpoints(args, cfg, tc):
    """Checkpoints for this run, or None when it keeps none."""
    if not (args.checkpoint_every or args.resume):
        return None
    directory = args.checkpoint_dir or os.path.join(args.run_dir, "checkpoints")
    checkpoints = Checkpoints(directory, args.checkpoint_every, cfg, tc)
    if not args.resume and checkpoints.steps():
        checkpoints.close()
        raise UsageError(
            f"{checkpoints.directory} already holds checkpoints (steps {checkpoints.steps()}); "
            "pass --resume to continue that run, or choose another --checkpoint-dir"
        )
    return checkpoints


def make_evaluator(cfg, val_tokens, tc, batch_sharding, jit=True):
    """params -> mean loss over a fixed set of validation batches."""
    eval_step = make_eval_step(cfg, jit=jit)
    B, S = tc.batch, cfg.seq
    rows = sharding.process_rows(batch_sharding, B, S)
    batches = [
        sharding.place_batch(
            data.get_batch(val_tokens, i, batch=B, seq=S, seed=tc.seed, stream=data.VAL, rows=rows),
            batch_sharding,
        )
        for i in range(tc.eval_batches)
    ]
    return lambda params: float(np.mean([eval_step(params, b) for b in batches]))


def cli(argv=None):
    try:
        return run_main(main, argv)
    except TrainingDiverged as e:
        print(f"error: {e}; try a lower --lr", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("stopped: interrupted (no checkpoints: pass --checkpoint-every N)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(cli())

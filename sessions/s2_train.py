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
"""

import contextlib
import dataclasses
import functools
import os
import sys
import time

import jax
import numpy as np

from roofline.flops import napkin_train_flops, param_count, train_flops
from roofline.hardware import local_peak_flops
from sessions import data, multihost, sharding
from sessions.cli import (
    ArgumentParser,
    add_shape_flags,
    configs_from_args,
    non_negative_int,
    positive_int,
    run_main,
)
from sessions.generate import generate
from sessions.loop import TrainingDiverged, train_loop
from sessions.prefetch import Prefetcher, Synchronous
from sessions.report import plot_loss, summary_lines
from sessions.train import init_state, make_eval_step, make_optimizer, make_train_step

PROMPT = "The import statement"


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
        choices=["einsum", "fused"],
        help="einsum by hand, or jax.nn.dot_product_attention (default on GPU)",
    )
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--no-positions", action="store_true")
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument("--no-overlap", action="store_true")
    parser.add_argument(
        "--data-delay-ms",
        type=non_negative_int,
        default=0,
        help="sleep this long per batch: simulated slow storage",
    )
    parser.add_argument("--eval-every", type=positive_int)
    parser.add_argument("--metrics-out", help="write one JSON object per logged step here")
    parser.add_argument("--run-dir", default="runs/s2", help="loss curve and outputs go here")
    parser.add_argument("--profile", metavar="DIR", help="trace a few steps into DIR (xprof)")
    parser.add_argument(
        "--show-sharding",
        action="store_true",
        help="print each weight's sharding even on one device",
    )
    parser.add_argument("--prompt", help=f"start of the sample (default: '{PROMPT}')")
    parser.add_argument("--sample-bytes", type=non_negative_int, default=300)
    multihost.add_flags(parser)
    return parser.parse_args(argv)


def choose_configs(args):
    on_cpu = jax.default_backend() == "cpu"
    preset = args.preset or ("cpu" if on_cpu else "course")
    overrides = {
        "attention": not args.no_attention,
        "positions": not args.no_positions,
        "dtype": args.dtype or ("float32" if on_cpu else "bfloat16"),
        "attention_impl": args.attention_impl or ("einsum" if on_cpu else "fused"),
    }
    model_cfg, train_cfg = configs_from_args(args, preset, **overrides)
    if args.eval_every:
        train_cfg = dataclasses.replace(train_cfg, eval_every=args.eval_every)
    return preset, model_cfg, train_cfg


def main(argv=None):
    args = parse_args(argv)
    multihost.initialize(args)  # before anything touches a device
    is_main = jax.process_index() == 0
    say = print if is_main else (lambda *a, **k: None)
    preset, cfg, tc = choose_configs(args)
    B, S = tc.batch, cfg.seq

    # Data: bytes are tokens; batches are a pure function of (seed, step).
    corpus = data.load_corpus(args.data)
    train_tokens, val_tokens = data.split(corpus, S)
    unigram = data.unigram_entropy(train_tokens)

    # Multichip: a mesh over every device of every process, checked before use.
    sizes = sharding.parse_mesh(args.mesh, jax.device_count())
    sharding.check_divisible(cfg, B, sizes, jax.process_count())
    mesh = sharding.make_mesh(sizes)
    batch_sharding = sharding.batch_sharding(mesh)

    optimizer = make_optimizer(tc, tc.steps)
    with jax.set_mesh(mesh):
        init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
        state, state_shardings = sharding.init_sharded(init, jax.random.key(tc.seed), mesh)

        devices = jax.devices()
        n_params = param_count(cfg)
        flops = train_flops(cfg, B)
        peak = local_peak_flops(cfg.dtype)
        say(
            f"session 2 | preset {preset} | {len(devices)} x {devices[0].device_kind} "
            f"({jax.process_count()} process{'es' if jax.process_count() > 1 else ''})"
        )
        say(
            f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
            f"S={S} V={cfg.vocab} | {n_params / 1e6:.2f}M params | {cfg.dtype} matmuls | "
            f"attention {'on' if cfg.attention else 'off'}, "
            f"positions {'on' if cfg.positions else 'off'}"
        )
        say(
            f"step: {B} x {S} = {B * S:,} tokens | 6·B·P = "
            f"{napkin_train_flops(cfg, B) / 1e9:.2f} GFLOP | exact with attention = "
            f"{flops / 1e9:.2f} GFLOP"
        )
        say(f"peak: {peak[0] / 1e12:.3f} TFLOP/s per device ({peak[1]})")
        say(
            f"data: {args.data or 'pydoc_data.topics (CPython docs)'} | {len(train_tokens):,} "
            f"train / {len(val_tokens):,} val bytes | unigram baseline {unigram:.3f} nats/byte"
        )
        if mesh.size > 1 or args.show_sharding:
            for line in sharding.describe(state["params"], state_shardings["params"], mesh):
                say(line)
        held, total = sharding.bytes_per_device(state, state_shardings)
        say(
            f"params + optimizer state: {total / 2**20:.2f} MiB in all, "
            f"{held / 2**20:.2f} MiB per device"
        )

        # The step: forward, backward and AdamW in one compiled program.
        step_fn = make_train_step(
            cfg,
            optimizer,
            jit=not args.no_jit,
            state_shardings=state_shardings,
            batch_sharding=batch_sharding,
        )
        if not args.no_jit:
            # Compile ahead of time from shapes alone, so no step is timed with
            # compilation in it and the loop can never trigger a recompile.
            batch_shape = jax.ShapeDtypeStruct((B, S), np.int32, sharding=batch_sharding)
            start = time.perf_counter()
            step_fn = step_fn.lower(state, {"inputs": batch_shape, "targets": batch_shape})
            step_fn = step_fn.compile()
            say(f"compiled the train step in {time.perf_counter() - start:.1f} s")

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
        loader_cls = Synchronous if args.no_overlap else Prefetcher
        evaluate = make_evaluator(cfg, val_tokens, tc, batch_sharding, jit=not args.no_jit)
        profiler = Profiler(args.profile, tc.steps) if args.profile else None

        with contextlib.ExitStack() as stack:
            batches = stack.enter_context(loader_cls(make_batch, place, start=0))
            metrics_file = None
            if args.metrics_out and is_main:
                metrics_file = stack.enter_context(open(args.metrics_out, "w"))
            state, history, seconds = train_loop(
                step_fn,
                state,
                batches,
                start=0,
                steps=tc.steps,
                log_every=tc.log_every,
                tokens_per_step=B * S,
                flops_per_step=flops,
                peak_flops=peak[0],
                n_devices=len(devices),
                evaluate=evaluate,
                eval_every=tc.eval_every,
                log=say,
                metrics_file=metrics_file,
                on_step=profiler,
            )
        if profiler:
            say(
                f"profile written to {args.profile}; open it with: "
                f"xprof --logdir {args.profile} --port 8791"
            )

    # A sample, then the summary a student compares across runs.
    params = multihost.gather(state["params"])
    if args.sample_bytes and is_main:
        # The default prompt is cut to fit a short context; a given one must fit.
        prompt = args.prompt or PROMPT[: cfg.seq // 2]
        text = generate(params, cfg, prompt, args.sample_bytes, jax.random.key(tc.seed + 1))
        say("sample:\n" + text)
    for line in summary_lines(
        history,
        train_seconds=seconds,
        tokens_per_step=B * S,
        flops_per_step=flops,
        peak=peak,
        n_devices=len(devices),
        unigram=unigram,
        first_step=0,
    ):
        say(line)
    if is_main:
        path = os.path.join(args.run_dir, "loss.png")
        plot_loss(history, path, unigram, f"s2_train.py --preset {preset}")
        say(f"  loss curve  {path}")
    return 0


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


class Profiler:
    """Traces steps first..first+count-1 with jax.profiler into logdir; the
    first step is left out when there are others, as it may still warm up."""

    def __init__(self, logdir, steps, count=3):
        self.logdir = logdir
        self.first = 1 if steps > 1 else 0
        self.last = min(self.first + count, steps) - 1
        self.active = False
        if self.first == 0:
            self._start()

    def _start(self):
        jax.profiler.start_trace(self.logdir)
        self.active = True

    def __call__(self, step, state):
        if step + 1 == self.first:
            jax.block_until_ready(state)  # open the window on a quiet device
            self._start()
        if step == self.last and self.active:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.active = False


def cli(argv=None):
    try:
        return run_main(main, argv)
    except TrainingDiverged as e:
        print(f"error: {e}; try a lower --lr", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())

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
    python sessions/s2_train.py --preset gpt2-bytes --target tpu-v5e:2x4   # compile only, for a TPU
"""

import contextlib
import functools
import json
import os
import sys

import jax

from roofline.flops import train_flops
from roofline.hardware import local_peak_flops
from roofline.measured.compare import profile_table
from roofline.measured.profile import TraceWindow
from roofline.memory import allocator_peak, step_memory
from sessions.errors import run_main
from sessions.inference import sample
from sessions.plan import programs, train_on_target
from sessions.run import checkpoint, multihost, preemption
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.cli import PROMPT, make_folder, resolve, train_flags
from sessions.run.report import header_lines, plot_loss, summarize, summary_lines
from sessions.shard import sharding
from sessions.train import data
from sessions.train.manual_fsdp import check_collectives, collectives_line, make_manual_step
from sessions.train.meter import Meter
from sessions.train.offload import check_offload
from sessions.train.prefetch import Prefetcher, Synchronous
from sessions.train.step import (
    abstract_batch,
    abstract_state,
    compile_ahead,
    make_evaluator,
    make_train_step,
)


def main(argv=None):
    args = train_flags(argv)
    if args.target:  # compile the step for a chip this machine lacks, report, exit
        target, devices = programs.devices_for(args.target)
        run = resolve(args, platform=target.chip.platform)  # that chip's defaults
        planned = train_on_target.plan_target(
            args.mesh, run, target, devices, print, args.collectives
        )
        return programs.write_plan(planned, args.hlo_out, args.summary_out)
    # Before anything touches a device: join the other processes, if any.
    multihost.initialize(args.coordinator, args.num_processes, args.process_id)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    is_main = jax.process_index() == 0
    say = print if is_main else (lambda *a, **k: None)
    run = resolve(args)  # preset + flags + this machine -> configs
    cfg, tc = run.model, run.train
    check_offload(tc.offload, jax.default_backend(), args.collectives)
    make_folder(args.run_dir, "--run-dir")  # for the loss curve: now, not after the last step
    B, S = tc.batch, cfg.seq

    # Data: bytes (or a tokenizer's ids) split into training and validation;
    # batches are a pure function of (seed, step).
    corpus = data.open_corpus(run.data, S)
    data.check_vocab(corpus, cfg.vocab)  # every token below the vocabulary, before step 1
    tokenizer = sample.load_tokenizer(args.tokenizer, corpus.unit)
    train_tokens = corpus.train
    unigram = data.unigram_entropy(train_tokens)

    # Multichip: a mesh over every device of every process, checked before use.
    sizes = sharding.parse_mesh(args.mesh, jax.device_count())
    sharding.check_divisible(cfg, B // tc.accum, sizes, jax.process_count())  # a microbatch
    check_collectives(args.collectives, sizes)
    mesh = sharding.make_mesh(sizes, multihost.mesh_devices())
    batch_sharding = sharding.batch_sharding(mesh)
    # Checkpoints: their folder is made here, before any step, and one named on the
    # command line gets at least the last step's.
    directory = args.checkpoint_dir or os.path.join(args.run_dir, "checkpoints")
    every, resume, named = args.checkpoint_every, args.resume, args.checkpoint_dir is not None
    checkpoints = checkpoint.open_for_run(directory, every, resume, cfg, tc, corpus.unit, named)

    # The state as shapes first (jax.ShapeDtypeStruct, each with its weight's
    # sharding: sessions/inference/shapes.py); then every device builds, or restores, only
    # its own shards.
    optimizer, init, abstract = abstract_state(cfg, tc, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, abstract)
    with jax.set_mesh(mesh):
        if args.resume:
            start, state = checkpoint.resume(checkpoints, abstract, tc.steps, say)
        else:
            start, state = 0, jax.jit(init, out_shardings=shardings)(jax.random.key(tc.seed))

    flops = train_flops(cfg, B)  # 6·B·P plus attention: the model FLOPs MFU counts
    peak = local_peak_flops(cfg.dtype)
    for line in header_lines(run, flops, peak, corpus, unigram):
        say(line)
    if mesh.size > 1 or args.show_sharding:
        for line in sharding.describe(state["params"], shardings["params"], mesh):
            say(line)
    if mesh.size > 1 or args.collectives == "manual":  # one device has no collectives
        say(collectives_line(args.collectives))
    if jax.process_count() > 1:
        say(sharding.rows_line(batch_sharding, B, S))
    held, total = sharding.bytes_per_device(state, shardings)
    say(f"params + optimizer state: {total / 2**20:.2f} MiB in all, ", end="")
    say(f"{held / 2**20:.2f} MiB per device" + ", AdamW's on the host" * (tc.offload != "none"))
    if start:
        say(f"resumed from the checkpoint at step {start}")

    # The step: forward, backward and AdamW as one program, compiled before the
    # loop from shapes alone (--no-jit: op by op, as session 1 ran).
    jit = not args.no_jit
    if args.collectives == "manual":  # every collective written out (sessions/train/manual_fsdp.py)
        step_fn = make_manual_step(
            cfg, optimizer, tc.clip, shardings, batch_sharding, jit=jit, accum=tc.accum
        )
    else:
        step_fn = make_train_step(
            cfg, optimizer, jit=jit, state_shardings=shardings, batch_sharding=batch_sharding,
            accum=tc.accum,
            offload=tc.offload,
        )  # fmt: skip
    if jit:
        with jax.set_mesh(mesh):
            step_fn = compile_ahead(step_fn, state, abstract_batch(B, S, batch_sharding), say)
    evaluate = make_evaluator(cfg, tc, corpus.val, batch_sharding, jit=jit)

    # The loader: each process cuts only the rows its devices hold. The
    # Prefetcher cuts and places the next batches on a thread while the
    # devices run this step ("lay track faster than the train").
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
    trace = TraceWindow(args.profile, start, tc.steps) if args.profile else None

    with contextlib.ExitStack() as stack, jax.set_mesh(mesh):
        loader = stack.enter_context(loader_class(make_batch, place, start=start))
        if checkpoints:
            stack.enter_context(checkpoints)
        # SIGINT/SIGTERM: every host stops after the same step, checked on log steps.
        save = stack.enter_context(preemption.SaveHook(checkpoints, agree_every=tc.log_every))
        metrics_file = None
        if args.metrics_out and is_main:  # a resumed run continues the file
            metrics_file = stack.enter_context(open(args.metrics_out, "a" if args.resume else "w"))
        meter = Meter(
            start=start, steps=tc.steps, log_every=tc.log_every, tokens_per_step=B * S,
            flops_per_step=flops, peak_flops=peak[0], n_devices=mesh.size, log=say,
            metrics_file=metrics_file,
        )  # fmt: skip

        for step in range(start, tc.steps):
            if args.no_overlap:
                jax.block_until_ready(state)  # blocking loads: the next batch waits for this step
            # step_fn returns at once: the devices run the step while Python
            # goes on to the next batch. Under the guard, any read of a device
            # value between log steps (a stray float(loss)) is an error, not a
            # silent stall.
            with (
                jax.profiler.StepTraceAnnotation("train", step_num=step),
                jax.transfer_guard_device_to_host("disallow"),
            ):
                # The prefetch: this batch was cut and placed while the last step ran.
                state, metrics = step_fn(state, next(loader))
            done = step + 1
            logged = meter.is_log_step(done)
            if logged:
                # The sync point: reading the loss waits for this step to finish,
                # the only wait between two log lines.
                record = meter.record(done, float(metrics["loss"]))
                if done % tc.eval_every == 0 or done == tc.steps:
                    record["val_loss"] = evaluate(state["params"])
                # Written before a save of this step: a run killed after that
                # save resumes past this step, so its line must be on disk.
                meter.write(record)
            # The profiler and the checkpoints: the seconds they take are not step time.
            meter.pause((trace(step, state) if trace else 0.0) + save(step, state))
            if logged:  # after logging, validation and saving: the clock starts again
                meter.restart(done)
        if checkpoints:
            checkpoints.maybe_save(tc.steps, state, force=True)
            say(f"checkpoint saved at step {tc.steps} in {checkpoints.directory}")

    if trace and is_main:
        # The three columns for the steps just traced: napkin, XLA's count, the trace.
        compiled = step_fn if jit else None
        for line in profile_table(args.profile, cfg, B, compiled, peak, devices=mesh.size):
            say(line)

    # A sample, then the summary a student compares across runs.
    params = multihost.gather(state["params"])
    if args.sample_bytes and is_main:
        prompt = sample.closing_prompt(args.prompt, PROMPT, corpus, cfg.seq, tokenizer)
        key = jax.random.key(tc.seed + 1)
        tokens = sample.sample_tokens(params, cfg, prompt, args.sample_bytes, key)
        say("sample:\n" + sample.show(tokens, corpus.unit, tokenizer))
    summary = summarize(
        meter.history,
        train_seconds=meter.train_seconds,
        tokens_per_step=B * S,
        flops_per_step=flops,
        peak=peak,
        n_devices=mesh.size,
        unigram=unigram,
        first_step=start,
        unit=corpus.unit,
        platform=mesh.devices.flat[0].platform,
        memory=step_memory(step_fn if jit else None),
        allocator=allocator_peak(),
        corpus=corpus.name,
        passes=corpus.passes(tc.steps * B * S),
    )
    for line in summary_lines(summary):
        say(line)
    if args.summary_out and is_main:
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    if is_main:
        title = f"s2_train.py --preset {run.preset}"
        path = os.path.join(args.run_dir, "loss.png")
        path = plot_loss(meter.history, path, unigram, title, corpus.unit)
        say(f"  loss curve  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

"""python -m roofline: predict a training step's cost, measure it, compare; plan serving.

    python -m roofline chips                                  # the chip table, with sources
    python -m roofline calibrate                              # measure this machine, cache it
    python -m roofline predict --preset gpt2 --batch 32 --chip h100
    python -m roofline predict --preset llama2-7b --chip a100 --chips 2048 --tokens 2e12 --mfu 0.4
    python -m roofline decode --preset llama3-8b --chip h100 --batches 1,8,64 --context 8192
    python -m roofline serve --preset llama3-70b --chip tpu-v5e --chips 8 --weights int8 \
        --cache int8 --prompt 2048 --output 512 --slo mlperf-llama2-70b --rate 10
    python -m roofline compare runs/profile_s2                # a trace, read back
    python -m roofline memory --preset llama3-8b --chip h100 --chips 8 --batch-tokens 1048576 \
        --remat block --weights bfloat16 --master --shard params      # what fills HBM

A preset of predict, decode, serve and memory is a published model (sessions/model/config.py
PUBLISHED: its own config.json; `gpt2` is GPT-2's 124M with its 50,257 tokens) or a course
preset (PRESETS: our bytes, V=256; `gpt2-bytes` is GPT-2's shapes on them); the first line
says which.

Bad input (an unknown chip or preset, a number that is not positive, --kv-heads that
does not divide the heads, int8 where there is no decode, a directory with no trace)
is one line on stderr and exit status 2.
"""

import argparse
import dataclasses
import json
import os
import sys

from roofline.calibrate import calibrate_lines
from roofline.flags import parse_args
from roofline.flops import ledger
from roofline.hardware import chips_lines, find_chip, local_memory_chip, measured_chip
from roofline.measured.compare import compare
from roofline.measured.record import HLO, comparison_summary, load_hlo, load_metadata, roofs_for
from roofline.measured.table import report_lines
from roofline.measured.trace import read_trace
from roofline.plan import memory_report
from roofline.plan.serve_plan import SLO_PRESETS, plan_serve
from roofline.plan.serve_report import serve_lines, serve_summary
from roofline.plan.serving import plan_serving, splits_heads
from roofline.plan.serving_report import serving_lines, serving_summary
from roofline.plan.training_memory import Recipe, plan_memory
from roofline.predict import predict_train_step, train_step_lines, training_run, training_run_lines
from sessions.errors import UsageError
from sessions.model.config import PRESETS, PUBLISHED, ModelConfig
from sessions.run.cli import (
    MODEL_FLAGS,
    given,
    resolve,
)


def model_from_args(args, published=False, **overrides):
    """(ModelConfig, batch) of the preset with the shape flags applied: a published
    model's config (with `published`, where one has that name), or a course preset by
    the session scripts' own resolve; attention as --attention-impl says (einsum if not)."""
    impl = args.attention_impl or "einsum"
    if args.kv_heads:
        overrides["kv_heads"] = args.kv_heads
    if published and args.preset in PUBLISHED:
        model = PUBLISHED[args.preset]
        fields = {**given(args, MODEL_FLAGS), "attention_impl": impl, **overrides}
        return dataclasses.replace(model.model, **fields), args.batch or model.batch
    # memory's --weights and --master are the napkin's recipe, decode's --weights int8 its
    # lever: neither is a run's, which keeps the preset's float32 weights.
    run_args = argparse.Namespace(**{**vars(args), "weights": None, "master": None})
    run = resolve(run_args, platform="cpu", attention_impl=impl, **overrides)
    return run.model, run.train.batch


def preset_source(name):
    """Which preset a name is, and where its shapes come from: the first line's words."""
    if name in PUBLISHED:
        return f"{name}, published: {PUBLISHED[name].source}"
    return f"{name}, a course preset (sessions/model/config.py: our bytes)"


def table_chip(name):
    try:
        return find_chip(name)
    except KeyError as e:
        raise UsageError(e.args[0]) from None


def predict_lines(args):
    """predict's lines and its --summary-out numbers."""
    if lever := next((f for f in ("weights", "cache") if getattr(args, f)), None):
        raise UsageError(
            f"--{lever} int8 is a decode lever, and predict plans a training step: "
            f"use python -m roofline decode --{lever} int8"
        )
    if (args.tokens is None) != (args.mfu is None):
        raise UsageError("--tokens and --mfu go together: a run's tokens, and its MFU")
    if args.mfu and args.mfu > 1:
        raise UsageError(f"--mfu {args.mfu:g}: a fraction in (0, 1] (40% is 0.4)")
    if args.chip == "local":
        dtype = args.dtype or "float32"
        chip = measured_chip("float32" if dtype == "tf32" else dtype)
    else:
        chip, dtype = table_chip(args.chip), args.dtype or "bfloat16"
    # tf32 is a float32 matmul mode: activations stay float32.
    cfg, batch = model_from_args(args, True, dtype="float32" if dtype == "tf32" else dtype)
    p = predict_train_step(cfg, batch, chip, dtype=dtype, chips=args.chips)
    summary = {"preset": args.preset, "chip": chip.name, "chips": args.chips, "batch": batch}
    summary |= {"params": ledger(cfg, batch).params, "step_seconds": p.step_s, "bound": p.bound}
    lines = [
        f"predict: {preset_source(args.preset)}",
        *train_step_lines(cfg, batch, chip, dtype, args.chips),
    ]
    if args.tokens:
        peak = chip.peak(dtype)
        run = training_run(cfg, int(args.tokens), peak_flops=peak, mfu=args.mfu, chips=args.chips)
        summary |= {"tokens": run.tokens, "mfu": args.mfu, "training_flops": run.flops}
        summary |= {"napkin_flops": run.napkin_flops, "days": run.days}
        lines += ["", *training_run_lines(run, chip, dtype, args.chips, args.mfu)]
    return lines, summary


def context_of(args, model):
    """--context, or the model's own; past a learned position table's rows, bad input."""
    context = args.context or model.seq
    if context > model.seq and model.learned_positions:  # a table of model.seq rows ends there
        raise UsageError(
            f"--context {context:,}: {args.preset}'s learned position table has {model.seq:,} rows"
        )
    return context


def what_if(lines, context, model):
    """A context past the published one: said on the second line (a rotary model's)."""
    if context > model.seq:  # rotary positions: no table to outgrow, but never trained there
        lines.insert(
            1,
            f"what-if: {context:,} positions, past the {model.seq:,} it was published "
            "with; rotary positions have no table to outgrow, the weights never saw them",
        )


def check_heads_split(args, cfg):
    """--chips that split the query heads and the key/value heads evenly, or bad input."""
    if (n := args.chips) > 1 and not splits_heads(cfg, n):
        counts = ", ".join(str(m) for m in range(1, cfg.heads + 1) if splits_heads(cfg, m))
        raise UsageError(
            f"--chips {n}: tensor parallelism splits the {cfg.heads} query heads and the "
            f"{cfg.n_kv_heads} key/value heads evenly (try {counts})"
        )


def serving_plan_lines(args):
    """decode's lines and its --summary-out numbers (roofline/plan/serving.py)."""
    if args.chip == "local":
        raise UsageError("decode plans a chip of the table (python -m roofline chips)")
    chip = table_chip(args.chip)
    model = PUBLISHED[args.preset].model if args.preset in PUBLISHED else PRESETS[args.preset].model
    context = context_of(args, model)
    prompt = args.prompt or min(1024, context)
    if prompt > context:
        raise UsageError(f"--prompt {prompt:,}: longer than the context, {context:,} positions")
    cfg = dataclasses.replace(model, dtype=args.dtype, kv_heads=args.kv_heads or model.kv_heads)
    check_heads_split(args, cfg)
    levers = {k: getattr(args, k) for k in ("batches", "chips", "weights", "cache")}
    levers["kernels_per_layer"] = args.kernels_per_layer
    plan = plan_serving(cfg, chip, context=context, prompt=prompt, **levers)
    course = "sessions/model/config.py"
    source = PUBLISHED[args.preset].source if args.preset in PUBLISHED else course
    heading = f"decode: {preset_source(args.preset)}"
    lines = serving_lines(plan, heading)
    what_if(lines, context, model)
    summary = serving_summary(plan, preset=args.preset, source=source)
    return lines, summary | {"published_context": model.seq}


def serve_plan_lines(args):
    """serve's lines and its --summary-out numbers (roofline/plan/serve_plan.py)."""
    if args.chip == "local":
        raise UsageError("serve plans a chip of the table (python -m roofline chips)")
    chip = table_chip(args.chip)
    published = args.preset in PUBLISHED
    model = PUBLISHED[args.preset].model if published else PRESETS[args.preset].model
    context = context_of(args, model)
    if args.prefill_mfu > 1:
        raise UsageError(f"--prefill-mfu {args.prefill_mfu:g}: a fraction in (0, 1] (40% is 0.4)")
    cfg = dataclasses.replace(model, dtype=args.dtype, seq=context)
    check_heads_split(args, cfg)
    ttft, tpot = SLO_PRESETS.get(args.slo, (None, None))  # a preset; either flag overrides it
    levers = {k: getattr(args, k) for k in ("chips", "weights", "cache", "batch", "prefill_mfu")}
    levers |= {"rate": args.rate, "page_size": args.page_size}
    try:
        plan = plan_serve(
            cfg, chip, prompt=args.prompt, output=args.output,
            slo_ttft=args.slo_ttft or ttft, slo_tpot=args.slo_tpot or tpot, **levers,
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    lines = serve_lines(plan, f"serve: {preset_source(args.preset)}", args.slo)
    what_if(lines, context, model)
    source = PUBLISHED[args.preset].source if published else "sessions/model/config.py"
    return lines, serve_summary(plan, preset=args.preset, source=source, slo=args.slo)


def memory_plan_lines(args):
    """memory's lines and its --summary-out numbers (roofline/plan/training_memory.py)."""
    if args.batch:  # a flag of every model command, and not this one's measure of a step
        raise UsageError(f"--batch {args.batch}: memory counts tokens (--batch-tokens)")
    recipe = Recipe(args.weights, args.master, args.grads, args.optimizer, args.optimizer_dtype)
    cfg, _ = model_from_args(args, True, **({"dtype": args.dtype} if args.dtype else {}))
    names = ("tp", "accum", "seq_shards", "sequence_parallel", "loss_chunks", "offload")
    levers = {k: getattr(args, k) for k in names}
    levers |= {"stages": args.pipeline_stages, "microbatches": args.microbatches}
    levers |= {"remat": args.policy, "scan": bool(args.scan_layers)}
    chip = local_memory_chip() if args.chip == "local" else table_chip(args.chip)
    try:
        plan = plan_memory(cfg, chip, chips=args.chips, batch_tokens=args.batch_tokens,
                           recipe=recipe, shard=args.shard, **levers)  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    heading = f"memory: {preset_source(args.preset)}"
    return memory_report.memory_lines(plan, heading), memory_report.memory_summary(plan)


def compare_lines(args):
    if not os.path.isdir(args.logdir):
        raise UsageError(f"no such directory: {args.logdir}")
    # The compiled step, if the run left it: it classifies the trace's ops and
    # is predicted op by op.
    hlo_text = load_hlo(args.logdir)
    try:
        trace = read_trace(args.logdir, hlo_text=hlo_text)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    saved = load_metadata(args.logdir, ModelConfig)
    if args.preset:  # the model given on the command line; XLA's count only if it is what ran
        cfg, batch = model_from_args(args)
        same = saved and saved.cfg == cfg and saved.batch == batch
        cost, devices = saved.cost if same else None, saved.devices if same else 1
        hlo_text = hlo_text if same else None
    elif saved:
        cfg, batch, cost, devices = saved.cfg, saved.batch, saved.cost, saved.devices
    else:
        raise UsageError(
            f"{args.logdir} has no roofline.json saying what ran; "
            "name the model: --preset NAME [--batch N ...]"
        )
    # The roofs of the chip the trace was captured on, wherever it is read.
    roofs = roofs_for(saved.chip if saved else None, cfg.dtype, devices, trace.platform)
    c = compare(cfg, batch, roofs, devices=devices, cost=cost, trace=trace, hlo_text=hlo_text)
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(comparison_summary(c), f, indent=1)
    lines = report_lines(c, args.logdir)
    if hlo_text is None:
        lines.append(
            f"no per-op prediction: {args.logdir} has no {HLO} of the step that ran "
            "(s2_train.py --profile writes it)"
        )
    return lines


def main(argv=None):
    args = parse_args(argv, __doc__.split("\n\n")[0])
    summary = None
    try:
        if args.command == "chips":
            lines = chips_lines()
        elif args.command == "calibrate":
            lines = calibrate_lines(args.dtype)
        elif args.command == "predict":
            lines, summary = predict_lines(args)
        elif args.command == "decode":
            lines, summary = serving_plan_lines(args)
        elif args.command == "serve":
            lines, summary = serve_plan_lines(args)
        elif args.command == "memory":
            lines, summary = memory_plan_lines(args)
        else:
            lines = compare_lines(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    if summary is not None and args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Session 6: what fills a chip's memory in training, and the levers that move it.

    python sessions/s6_memory.py                      # this machine: a minute or two
    python sessions/s6_memory.py --target h100:1      # compiled for a chip, nothing run
    python sessions/s6_memory.py --preset course --batch 32 --summary-out s6.json

1. The napkin: one step's bytes by component, before anything is compiled
   (roofline/plan/training_memory.py; `python -m roofline memory` prints the same).
2. The levers, each a compiled step: remat with the layers unrolled, remat with the
   layers under lax.scan, and accumulation. For each, the napkin beside XLA's own plan,
   the step's time (remat's recompute shows here), its FLOPs, the compile time, and the
   loss after the same steps: no lever changes the arithmetic. Then how the weights are
   stored: float32 cast each step, bfloat16 with a float32 master copy, bfloat16 alone.
3. Compile time against depth: an unrolled step is L copies of the layer to compile,
   a scanned one a single body.
4. Two published models, planned: LLaMA-3-70B on TPU v5p (the chips that merely hold
   its state, and the batch that then fits) and LLaMA-3-8B on one H100 (does full
   training fit, and with which recipe?).
"""

import dataclasses
import json
import sys

import jax

from roofline.flops import param_count
from roofline.hardware import find_chip
from roofline.memory import usable_fraction
from roofline.plan.memory_report import memory_lines
from roofline.plan.training_memory import Recipe, plan_memory
from sessions.errors import UsageError, run_main
from sessions.model.config import LEVERS, PUBLISHED, TRAIN_LEVERS
from sessions.plan import programs
from sessions.plan.memory_levers import H100, RECIPES, TABLE, compile_seconds, measure_lever
from sessions.plan.memory_tables import lessons, lever_table, recipe_lessons
from sessions.run.cli import ArgumentParser, add_shape_flags, output_file, resolve
from sessions.train import data


def s6_flags(argv):
    parser = ArgumentParser(prog="s6_memory.py", description=__doc__.split("\n\n")[0])
    add_shape_flags(parser)  # --preset, --batch, --steps (steps run a lever), the shapes
    parser.add_argument("--target", metavar="CHIP[:SHAPE]", help="compile for this chip only")
    parser.add_argument("--summary-out", type=output_file, help="write the levers as JSON")
    # What resolve reads that this session sets itself: the levers are its table's rows.
    parser.set_defaults(dtype=None, attention_impl=None, no_attention=False, no_positions=False)
    parser.set_defaults(eval_every=None, **dict.fromkeys((*LEVERS, *TRAIN_LEVERS)))
    args = parser.parse_args(argv)
    if args.batch is None:
        args.batch = 64  # on the cpu preset, activations are 80% of the step's bytes
    args.steps = args.steps or 8
    if args.steps < 2:  # the first step is not timed (roofline/timing.py)
        raise UsageError(f"--steps {args.steps}: at least 2, the first untimed")
    return args


def napkin(run, chip, here):
    """Part 1: the step's bytes by component, on the napkin, judged against `chip`'s
    memory. Run here (a CPU: no HBM of its own, the host's RAM shared with everything
    else), the bytes are the same on any chip, and the verdict is one H100's: say so."""
    cfg, tc = run.model, run.train
    plan = plan_memory(cfg, chip, batch_tokens=tc.batch * cfg.seq)
    heading = f"memory: preset {run.preset}, {tc.batch} sequences a step (predicted)"
    if here:
        heading += (
            f"; judged against one {chip.name}'s memory, not this {jax.default_backend()}'s: "
            "the bytes are the same on any chip"
        )
    return memory_lines(plan, heading)


def depth_lines(run):
    """Part 3: compile seconds of the step at L and 2L layers, unrolled and scanned."""
    depths = (run.model.layers, 2 * run.model.layers)
    lines = [f"compile seconds   {'loop':>8} {'scan':>8}"]
    timings = {}
    for layers in depths:
        timings[layers] = [compile_seconds(run, layers, scan) for scan in (False, True)]
        loop, scan = timings[layers]
        lines.append(f"  {layers:>3} layers     {loop:>8.1f} {scan:>8.1f}")
    return lines, timings


def published_lines():
    """Part 4: two published models, planned on the napkin alone, each with its chip's
    flash attention (no [S, S] probabilities kept), judged against what JAX may use."""
    llama70 = dataclasses.replace(PUBLISHED["llama3-70b"].model, attention_impl="splash", seq=4096)
    v5p = find_chip("tpu-v5p")
    # The scaling book's recipe (bf16 weights, float32 Adam) with a bf16 gradient, its
    # 4 saved [tokens, E] tensors a layer, all the state sharded (ZeRO-3, FSDP); and its
    # layout: 4M tokens of 4,096 on 1,024 data x 2 sequence x 4 tensor chips.
    levers = {"remat": 4, "recipe": Recipe("bfloat16", grads="bfloat16"), "shard": "params"}
    chips = plan_memory(llama70, v5p, batch_tokens=0, **levers).min_chips
    book = {"chips": 8192, "tp": 4, "seq_shards": 2, "batch_tokens": 1024 * 4096, **levers}
    step = plan_memory(llama70, v5p, **book)
    sp = plan_memory(llama70, v5p, sequence_parallel=True, **book)
    verdict = "fits" if step.fits else "does not fit"
    lines = [
        f"LLaMA-3-70B on TPU v5p ({v5p.hbm_bytes / 1e9:.0f} GB a chip), 12 bytes a parameter:",
        f"  its state alone fills {chips} chips",
        f"  the scaling book's layout, 4M tokens (1,024 x 4,096) on 1,024 data x 2 sequence x "
        f"4 tensor: {step.per_chip['total'] / 1e9:.2f} GB a chip, {verdict}; with sequence "
        f"parallelism {sp.per_chip['total'] / 1e9:.2f} GB",
        f"  ({step.per_chip['total'] / 1e9:.1f} of {v5p.hbm_bytes / 1e9:.0f} GB: memory does not "
        "set the book's chip count; the step's time does)",
    ]
    llama8 = dataclasses.replace(PUBLISHED["llama3-8b"].model, attention_impl="cudnn")
    usable = H100.hbm_bytes * usable_fraction("gpu")
    lines.append(
        f"LLaMA-3-8B on one H100 ({H100.hbm_bytes // 2**30} GiB; {usable / 1e9:.2f} GB usable by "
        "JAX, its default 75%), block remat, seq 8,192:"
    )
    for name, recipe in (
        ("float32 weights, AdamW (16 B)", Recipe()),
        ("bf16 weights, float32 master (18 B)", Recipe("bfloat16", True)),  # s2's recipe
        ("bf16 weights and grads, f32 AdamW (12 B)", Recipe("bfloat16", grads="bfloat16")),
        ("all bf16 (8 B)", Recipe("bfloat16", False, "bfloat16", "adamw", "bfloat16")),
        ("bf16, SGD with momentum (6 B)", Recipe("bfloat16", False, "bfloat16", "sgd", "bfloat16")),
    ):
        plan = plan_memory(llama8, H100, batch_tokens=0, remat="block", recipe=recipe)
        state = sum(plan.per_chip[k] for k in ("params", "master", "grads", "optimizer"))
        fits = f"{plan.max_batch_tokens:,} tokens a step fit" if plan.max_batch_tokens else "no"
        lines.append(f"  {name:<42} state {state / 1e9:6.1f} GB: {fits}")
    return lines


def main(argv=None):
    args = s6_flags(argv)
    target = devices = None
    if args.target:
        target, devices = programs.devices_for(args.target)
    run = resolve(args, platform=target.chip.platform if target else None)
    sizes, _ = programs.target_mesh(None, target, devices) if target else ({}, None)
    rows = 4 * sizes.get("data", 1) * sizes.get("fsdp", 1)  # 4 microbatches on each device
    if run.train.batch % rows:
        raise UsageError(f"--batch {run.train.batch}: a multiple of {rows}, for 4 microbatches")
    where = target.name if target else f"this {jax.default_backend()}"
    print(f"session 6 | preset {run.preset} | {run.train.batch} x {run.model.seq} tokens | {where}")

    print("\n1. the napkin")
    print("\n".join(napkin(run, target.chip if target else H100, here=not target)))

    print("\n2. the levers, compiled" + ("" if target else f" and run {args.steps} steps each"))
    corpus = None if target else data.open_corpus(run.data, run.model.seq)

    def measured(levers):
        kw = {"steps": 0 if target else args.steps, "corpus": corpus, "target": target}
        return [(lever, measure_lever(run, lever, devices=devices, **kw)) for lever in levers]

    rows = measured(TABLE)
    print("\n".join(lever_table(rows, ran=not target)))
    print("\n".join(lessons(rows)))
    print("\nhow the weights are stored, with bf16 matmuls (block remat, scanned):")
    recipes = measured(RECIPES)
    print("\n".join(lever_table(recipes, ran=not target, title="recipe")))
    print("\n".join(recipe_lessons(recipes, param_count(run.model), on_cpu=where == "this cpu")))

    timings = {}
    if not target:
        print("\n3. compile time against depth")
        lines, timings = depth_lines(run)
        print("\n".join(lines))

    print("\n4. two published models, on the napkin")
    print("\n".join(published_lines()))

    if args.summary_out:
        summary = {
            "preset": run.preset,
            "batch": run.train.batch,
            "where": where,
            "levers": [dataclasses.asdict(row) for _, row in rows + recipes],
            "compile_seconds_by_layers": {str(k): v for k, v in timings.items()},
        }
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

"""Decode speed, as ratios measured in one run (session 3's goals):

1. the cached decoder against the generator it replaced, which reran the
   model over the whole [1, S] window for every byte and waited on the host
   after each (kept below as the baseline): cpu preset, batch 1, greedy, the
   same tokens; goal >= 10x;
2. decode MBU at batch 1 for gpt2-bytes shapes in the run's dtype (bfloat16 on a
   GPU or TPU, float32 on a CPU, as s2_train.py trains; --dtype), against the
   read-only bandwidth (a chip's datasheet, a CPU's measured in this run);
   goal >= 70%;
3. decode tokens/s against batch, beside the roofline's rate: at gpt2-bytes shapes,
   whose weights (340 MB) stream from memory as the roofline assumes, and at
   the cpu preset, whose weights (3.3 MB) sit in the L3 cache, where the
   roofline's memory bound does not hold and XLA's choice of matmul
   routine decides (docs/session-3.md, "Decode speed, as ratios in one run").

Goal 1 compares two algorithms on the same tokens, so it runs in float32:
in bfloat16 two programs that round in different orders may break a tie of
the greedy argmax differently.

With --decode-impl xla,pallas, goals 2 and 3 set XLA's decode step beside ours
(sessions/inference/kernel_step.py, two Mosaic GPU kernels a layer), batch by batch:
tokens/s, MBU and the kernels a token launches, read off the compiled program.
Ours runs bfloat16 at batches up to 8 (larger ones print "-"); on a CPU it runs in
Mosaic GPU's interpreter, far slower than XLA's: a check that it runs, not a speed.

python scripts/bench_decode.py
python scripts/bench_decode.py --preset tiny --mbu-preset tiny --batches 1,2 \\
        --cache-batches 1,2  # seconds
python scripts/bench_decode.py --decode-impl xla,pallas --dtype bfloat16  # on a GPU
python scripts/bench_decode.py --decode-impl xla,pallas --dtype bfloat16 --batches 1,8 \\
        --embed 2048 --ff 8192 --heads 16 --head-dim 128 --layers 24 --cache-batches none
"""

import dataclasses
import itertools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from roofline import decode_cost
from roofline.hardware import local_roofs
from roofline.timing import time_calls
from scripts.harness.naive_step import uncached_generate
from sessions.errors import UsageError, course_preset, run_main
from sessions.inference import kernel_step, kv_cache, layout, step_times
from sessions.model import init_params
from sessions.model.config import PRESETS
from sessions.run.cli import PROMPT, ArgumentParser, positive_int, resolve, train_flags
from sessions.shard import sharding
from sessions.train.data import text_to_tokens

SHAPE_FLAGS = ("embed", "ff", "heads", "head_dim", "layers", "seq")


def parse_args(argv):
    parser = ArgumentParser(prog="bench_decode.py", description=__doc__.split("\n\n")[0])
    presets = {"type": course_preset, "choices": sorted(PRESETS)}
    parser.add_argument("--preset", **presets, default="cpu", help="for 1 and 3")
    parser.add_argument("--mbu-preset", **presets, default="gpt2-bytes", help="for 2")
    parser.add_argument("--batches", default="1,2,4,8", help="for 3, at --mbu-preset")
    parser.add_argument(
        "--cache-batches", default="1,4,16,64", help="for 3, at --preset (none: no such table)"
    )
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="for 2 and 3 (default: the platform's)"
    )
    parser.add_argument("--summary-out", help="write the goals' figures here, as JSON")
    for flag in SHAPE_FLAGS:  # --mbu-preset's shape, changed where given (s3_infer.py's flags)
        parser.add_argument(f"--{flag.replace('_', '-')}", type=positive_int, help="for 2 and 3")
    parser.add_argument(
        "--decode-impl",
        default="xla",
        help="for 2 and 3: xla, pallas (our kernels; interpreted on a CPU, slowly) or both, "
        "xla,pallas: side by side",
    )
    args = parser.parse_args(argv)
    args.shape = {f: getattr(args, f) for f in SHAPE_FLAGS if getattr(args, f) is not None}
    args.decode_impl = args.decode_impl.split(",")
    if bad := [i for i in args.decode_impl if i not in ("xla", "pallas")]:
        raise UsageError(f"--decode-impl {bad[0]}: xla, pallas or xla,pallas")
    return args


def model(preset, dtype="float32", shape=None):
    """(ModelConfig, parameters) of the preset in `dtype`, its fields in `shape` changed."""
    cfg = dataclasses.replace(PRESETS[preset].model, dtype=dtype, **(shape or {}))
    return cfg, init_params(cfg, jax.random.key(0))


def against_uncached(args, prompt):
    """Goal 1: (ratio, same tokens?)."""
    cfg, params = model(args.preset)
    n = min(args.new_tokens, cfg.seq - len(prompt))
    # Best of the repeats, for both: the least disturbed run of each on a shared machine.
    old = time_calls(lambda: uncached_generate(params, cfg, prompt, n), repeats=args.repeats)
    new = time_calls(lambda: kv_cache.generate(params, cfg, prompt[None], n), repeats=args.repeats)
    same = (
        uncached_generate(params, cfg, prompt, n)
        == kv_cache.generate(params, cfg, prompt[None], n)[0].tolist()
    )
    print(f"1. {args.preset} preset, batch 1, {len(prompt)}-byte prompt + {n} new tokens, greedy")
    print(f"   uncached (old generate)  {n / old.best:>10,.0f} tokens/s  (best of {old})")
    print(f"   cached (prefill + loop)  {n / new.best:>10,.0f} tokens/s  (best of {new})")
    print(f"   ratio {old.best / new.best:.1f}x; the same tokens: {'yes' if same else 'NO'}")
    return old.best / new.best, same


def decode_seconds(weights, params, cfg, prompt, batch, n, mesh, repeats, impl=None):
    """Seconds per decode step for `batch` copies of the prompt, n steps from its end:
    the fastest of `repeats` (the least disturbed on a shared machine), as
    sessions/s3_infer.py runs them. impl: the step (kernel_step.IMPLS)."""
    prompts = jax.device_put(np.tile(prompt, (batch, 1)), sharding.batch_sharding(mesh))
    logits, cache = kv_cache.prefill(params, prompts, cfg)
    tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - len(prompt))))
    key = jax.random.key(0)
    start = len(prompt)
    decode = kv_cache.repeatable_decode(weights, cache, tokens, logits, start, n, key, cfg, impl)
    return time_calls(decode, repeats=repeats).best / n


def decode_table(cfg, params, prompt, batches, args, roofs, mesh):
    """Rows (batch, Achieved), printed; with ours asked for, side_by_side's."""
    if args.decode_impl != ["xla"]:
        return side_by_side(cfg, params, prompt, batches, args, roofs, mesh)
    peak, bandwidth = roofs
    n = min(args.new_tokens, cfg.seq - len(prompt))
    weights = layout.decode_weights(params, cfg)  # laid out for decode, once per model
    print(
        f"   {'batch':>5} {'ms/step':>9} {'tokens/s':>10} {'roof tok/s':>10} {'MBU':>6} {'MFU':>6}"
    )
    rows = []
    for b in batches:
        step_s = decode_seconds(weights, params, cfg, prompt, b, n, mesh, args.repeats)
        step = decode_cost.decode_step_cost(cfg, b, peak_flops=peak, bandwidth=bandwidth)
        got = decode_cost.achieved(step, step_s, peak_flops=peak, bandwidth=bandwidth)
        print(
            f"   {b:>5} {step_s * 1e3:>9.2f} {got.tokens_per_s:>10,.0f} "
            f"{step.tokens_per_s:>10,.0f} "
            f"{100 * got.mbu:>5.1f}% {100 * got.mfu:>5.1f}%"
        )
        rows.append((b, got))
    return rows


def side_by_side(cfg, params, prompt, batches, args, roofs, mesh):
    """Each --decode-impl's step, batch by batch: ms a step, tokens/s, MBU, kernels a
    token and the estimate of its step (roofline/plan/decode_estimate.py: our kernels'
    bytes at what their grids keep in flight), printed in one row -> rows (batch,
    Achieved) of the first impl (those it runs). Appends {impl: {batch: (Achieved,
    kernels, DecodeTimes or None)}} to args.tables."""
    peak, bandwidth = roofs
    n = min(args.new_tokens, cfg.seq - len(prompt))
    weights = layout.decode_weights(params, cfg)
    impls = {name: kernel_step.impl_for(name, jax.default_backend()) for name in args.decode_impl}
    chip = step_times.local_chip()  # None: no estimate (a CPU)
    cells = f"{'ms/step':>8} {'tokens/s':>10} {'MBU':>6} {'kernels':>7} {'est ms':>7}"
    print(f"   {'batch':>5}" + "".join(f" | {name:>6} {cells}" for name in impls))
    table = {name: {} for name in impls}
    args.tables = [*getattr(args, "tables", []), table]
    for b in batches:
        line = f"   {b:>5}"
        for name, impl in impls.items():
            if impl and b > kernel_step.MAX_BATCH:  # ours takes batches up to 8
                line += f" | {name:>6} {'-':>8} {'-':>10} {'-':>6} {'-':>7} {'-':>7}"
                continue
            step_s = decode_seconds(weights, params, cfg, prompt, b, n, mesh, args.repeats, impl)
            step = decode_cost.decode_step_cost(cfg, b, peak_flops=peak, bandwidth=bandwidth)
            got = decode_cost.achieved(step, step_s, peak_flops=peak, bandwidth=bandwidth)
            kernels = step_times.kernels_a_token(weights, cfg, b, impl)
            times = chip and step_times.times_of(step, kernels, cfg, b, impl, chip)
            table[name][b] = got, kernels, times
            estimate = (
                "-" if not times or times.estimate_s is None else f"{times.estimate_s * 1e3:.3f}"
            )
            line += (
                f" | {name:>6} {step_s * 1e3:>8.3f} {got.tokens_per_s:>10,.0f} "
                f"{100 * got.mbu:>5.1f}% {kernels:>7} {estimate:>7}"
            )
        print(line)
    first = table[args.decode_impl[0]]
    return [(b, first[b][0]) for b in batches if b in first]


def no_slower(tables):
    """Ours no slower than XLA's at every batch both ran, in every table: True,
    False, or None where none ran both."""
    pairs = [
        (t["pallas"][b][0].tokens_per_s, t["xla"][b][0].tokens_per_s)
        for t in tables
        for b in t.get("pallas", {})
        if b in t.get("xla", {})
    ]
    return all(ours >= xla for ours, xla in pairs) if pairs else None


def main(argv=None):
    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cache_batches = (
        [] if args.cache_batches == "none" else [int(b) for b in args.cache_batches.split(",")]
    )
    prompt = text_to_tokens(PROMPT)
    # The dtype s2_train.py trains in here (sessions/run/cli.py: the one home of platform defaults).
    s2_flags = ["--preset", args.mbu_preset, *(["--dtype", args.dtype] if args.dtype else [])]
    dtype = resolve(train_flags(s2_flags)).model.dtype
    print(f"{jax.devices()[0].device_kind}, JAX {jax.__version__}, {dtype} (goal 1: float32)")
    if "pallas" in args.decode_impl:  # what our kernels do not run, refused before any work
        for preset, shape in ((args.mbu_preset, args.shape), (args.preset, {})):
            kernel_step.check_supported(
                dataclasses.replace(PRESETS[preset].model, dtype=dtype, **shape),
                1,
                interpret=jax.devices()[0].platform != "gpu",  # impl_for's choice
            )
    ratio, same = against_uncached(args, prompt)

    # The roofs measured in this run, under the same load as the steps (a CPU's
    # figures vary with what else runs; an accelerator's come from its datasheet).
    measured_now = local_roofs(dtype, stream="read", devices=1, fresh=True)
    peak, bandwidth = measured_now.peak_flops, measured_now.bandwidth
    roofs = peak, bandwidth
    print(f"roofs: {peak / 1e12:.3f} TFLOP/s {dtype}, {bandwidth / 1e9:.1f} GB/s read-only")
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, jax.devices()[:1])
    with jax.set_mesh(mesh):
        cfg, params = model(args.mbu_preset, dtype, args.shape)
        mbu_model = dataclasses.asdict(cfg)
        changed = "".join(f", {f.replace('_', ' ')} {n}" for f, n in args.shape.items())
        print(f"2, 3. {args.mbu_preset} shapes{changed}: bytes per step = weights + batch x cache")
        rows = decode_table(cfg, params, prompt, sorted({1, *batches}), args, roofs, mesh)
        at_one = rows[0][1]
        cached = []
        if cache_batches:
            cfg, params = model(args.preset, dtype)
            print(f"   {args.preset} preset, its weights in the L3 cache: tokens/s against batch")
            cached = decode_table(cfg, params, prompt, cache_batches, args, roofs, mesh)
    growing = all(a.tokens_per_s < b.tokens_per_s for (_, a), (_, b) in itertools.pairwise(rows))
    grows_cached = all(
        a.tokens_per_s < b.tokens_per_s for (_, a), (_, b) in itertools.pairwise(cached)
    )
    print("goals:")
    print(f"   cached / uncached  {ratio:6.1f}x   (>= 10x: {'met' if ratio >= 10 else 'NOT met'})")
    met = "met" if at_one.mbu >= 0.7 else "NOT met"
    print(f"   MBU at batch 1     {100 * at_one.mbu:5.1f}%   (>= 70%: {met})")
    print(
        f"   tokens/s grows with batch: {'yes' if growing else 'no'} at {args.mbu_preset} shapes"
        + (f", {'yes' if grows_cached else 'no'} at the {args.preset} preset" if cached else "")
    )
    faster = no_slower(getattr(args, "tables", []))
    if faster is not None:
        print(f"   ours no slower than XLA's at every batch: {'yes' if faster else 'NO'}")
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(
                {
                    "device_kind": jax.devices()[0].device_kind,
                    "dtype": dtype,
                    "cached_over_uncached": ratio,
                    "same_tokens": same,
                    "mbu_preset": args.mbu_preset,
                    "mbu_model": mbu_model,
                    "mbu_batch_1": at_one.mbu,
                    "tokens_per_sec_batch_1": at_one.tokens_per_s,
                    "read_bandwidth": bandwidth,
                    "tokens_grow_with_batch": growing,
                    "decode_impls": [
                        {
                            impl: {
                                str(b): {
                                    "tokens_per_sec": got.tokens_per_s,
                                    "mbu": got.mbu,
                                    "kernels_per_token": kernels,
                                    "floor_step_seconds": times and times.floor_s,
                                    "estimate_step_seconds": times and times.estimate_s,
                                }
                                for b, (got, kernels, times) in rows.items()
                            }
                            for impl, rows in table.items()
                        }
                        for table in getattr(args, "tables", [])
                    ],
                },
                f,
                indent=1,
            )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run_main(main))

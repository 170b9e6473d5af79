"""Time the jitted training step of a preset: tokens/s, achieved TFLOP/s,
MFU and memory, held against the per-op prediction and the whole-step bound
of the same compiled step on this chip's roofs (roofline/measured/compare.py), and how
steady the step is over windows of steps run as training runs them. With
--compare naive, also the same step written as plainly as possible
(scripts/harness/naive_step.py), in the same run, and the ratio; with --compare flax,
the same model and step as Flax NNX writes them (sessions/model/flax_model.py), and
the ratio.

    python scripts/bench.py                            # course shapes, batch 32 on a CPU
    python scripts/bench.py --compare naive
    python scripts/bench.py --compare flax
    python scripts/bench.py --preset gpt2-bytes --batch 32   # on a GPU (bfloat16 there)
    python scripts/bench.py --weights bfloat16 --master   # session 6's recipe: no cast a step
    python scripts/bench.py --summary-out bench.json      # the figures, as JSON too
"""

import json
import sys
import time

import jax

from roofline.calibrate import measured
from roofline.flops import napkin_train_flops, train_flops
from roofline.hardware import local_peak_flops
from roofline.measured.compare import local_comparison
from roofline.memory import step_memory
from roofline.predict import utilisation
from roofline.timing import Timing, steadiness, time_calls
from roofline.units import ms
from scripts.harness.naive_step import make_naive_step
from sessions.errors import course_preset, run_main
from sessions.model.attention import IMPLEMENTATIONS
from sessions.model.config import LEVERS, PRESETS
from sessions.run.cli import FAMILY, ArgumentParser, positive_int, resolve
from sessions.train import data
from sessions.train.meter import run_utilisation
from sessions.train.step import init_state, make_optimizer, make_train_step


def parse_args(argv):
    parser = ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", type=course_preset, choices=sorted(PRESETS), default="course")
    parser.add_argument(
        "--batch", type=positive_int, help="default: 32 on a CPU, else the preset's"
    )
    parser.add_argument("--seq", type=positive_int)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"])
    parser.add_argument("--attention-impl", choices=sorted(IMPLEMENTATIONS))
    parser.add_argument("--repeats", type=positive_int, default=10)
    parser.add_argument("--warmup", type=positive_int, default=2)
    parser.add_argument("--windows", type=positive_int, default=6, help="for the steadiness")
    parser.add_argument(
        "--window-steps", type=positive_int, help="steps a window (default: 2 on a CPU, else 20)"
    )
    parser.add_argument("--compare", choices=["naive", "flax"], help="also time this step")
    parser.add_argument("--weights", choices=["float32", "bfloat16"], help="s2_train.py's")
    parser.add_argument("--master", action="store_true", default=None, help="s2_train.py's")
    parser.add_argument("--summary-out", help="write the step's figures here, as JSON")
    # What s2_train.py's resolve reads that this bench has no flag for: the preset's.
    shapes = ("embed", "ff", "heads", "head_dim", "layers", "vocab", *FAMILY)
    training = ("steps", "lr", "seed", "log_every", "eval_every", "data", "accum", "offload")
    training += LEVERS
    parser.set_defaults(**dict.fromkeys(shapes + training), no_attention=False, no_positions=False)
    return parser.parse_args(argv)


def configure(args):
    """(ModelConfig, TrainConfig) of --preset on this machine, as s2_train.py resolves
    them (dtype, the chip's attention kernel), with 32 sequences a step on a CPU."""
    if args.batch is None and jax.default_backend() == "cpu":
        args.batch = 32
    run = resolve(args)
    return run.model, run.train


def time_step(step, state, batch, args):
    """Timing of `step`, threading the (donated) state from call to call."""
    carry = [state]

    def call():
        carry[0], metrics = step(carry[0], batch)
        return metrics["loss"]

    return time_calls(call, repeats=args.repeats, warmup=args.warmup)


def time_windows(step, state, batches, windows, steps):
    """Seconds of each of `windows` windows of `steps` steps, run as the training
    loop runs them: dispatched back to back on fresh batches, the host waiting
    only at a window's end (the loop's log step)."""
    seconds, done = [], 0
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = step(state, batches[done % len(batches)])
            done += 1
        jax.block_until_ready(metrics["loss"])
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None):
    args = parse_args(argv)
    cfg, tc = configure(args)
    B, S = tc.batch, cfg.seq
    device = jax.local_devices()[0]
    optimizer = make_optimizer(tc, 1000)
    train_tokens, _ = data.split(data.default_corpus(), S)
    batches = [
        jax.device_put(data.get_batch(train_tokens, i, batch=B, seq=S, seed=0), device)
        for i in range(8)
    ]
    batch = batches[0]

    def fresh():
        return init_state(jax.random.key(0), cfg=cfg, optimizer=optimizer, weights=tc.weights)

    compiled = make_train_step(cfg, optimizer).lower(fresh(), batch).compile()
    ours = time_step(compiled, fresh(), batch, args)

    flops = train_flops(cfg, B)
    peak, peak_source = local_peak_flops(cfg.dtype)
    ceiling = measured(cfg.dtype)["matmul_flops"]
    memory, memory_source = step_memory(compiled, device)
    print(
        f"bench | preset {args.preset} | batch {B} x seq {S} = {B * S:,} tokens | {cfg.dtype} "
        f"| {tc.stored} "
        f"| {device.device_kind} | jax {jax.__version__}"
    )
    print(
        f"FLOPs per step: {flops / 1e9:.2f} GFLOP exact with attention "
        f"(6·B·P = {napkin_train_flops(cfg, B) / 1e9:.2f})"
    )
    print(f"step time       {ours}")
    print(f"tokens/s        {B * S / ours.median:,.0f}")
    achieved, mfu = run_utilisation(flops, ours.median, peak, 1)
    print(f"achieved        {achieved / 1e12:.3f} TFLOP/s")
    print(f"MFU             {100 * mfu:.1f}% of {peak / 1e12:.3f} TFLOP/s ({peak_source})")
    if device.platform != "cpu":
        against_ceiling = utilisation(flops, ours.median, measured_peak=ceiling).mfu_measured
        print(
            f"MFU (measured)  {100 * against_ceiling:.1f}% of the measured "
            f"matmul ceiling, {ceiling / 1e12:.1f} TFLOP/s"
        )
    if memory is not None:
        print(f"memory          {memory / 2**20:,.1f} MiB per device ({memory_source})")
    c = held_against(compiled, cfg, B, ours)
    k = args.window_steps or (2 if device.platform == "cpu" else 20)
    windows = time_windows(compiled, fresh(), batches, args.windows, k)
    print(
        f"steadiness      {100 * steadiness(windows):.1f}%: max |window - median| / median over "
        f"{args.windows - 1} windows of {k} steps after the first ("
        + ", ".join(f"{B * S * k / t:,.0f}" for t in windows)
        + " tokens/s)"
    )

    if args.compare == "naive":
        naive = time_step(make_naive_step(cfg, optimizer), fresh(), batch, args)
        _, ours_first = compiled(fresh(), batch)
        _, naive_first = make_naive_step(cfg, optimizer)(fresh(), batch)
        print(f"naive step      {naive}")
        print(f"naive MFU       {100 * run_utilisation(flops, naive.median, peak, 1)[1]:.1f}%")
        print(f"speed-up        {naive.median / ours.median:.2f}x (naive median / ours)")
        print(
            f"same numbers    first-step loss {float(ours_first['loss']):.6f} ours, "
            f"{float(naive_first['loss']):.6f} naive"
        )
    if args.compare == "flax":
        compare_flax(cfg, optimizer, fresh, batch, compiled, args)
    if args.summary_out:
        summary = {
            "preset": args.preset,
            "batch": B,
            "seq": S,
            "dtype": cfg.dtype,
            "stored": tc.stored,
            "device_kind": device.device_kind,
            "jax": jax.__version__,
            "step_seconds": ours.median,
            "tokens_per_sec": B * S / ours.median,
            "mfu": mfu,
            "peak_flops": peak,
            "peak_source": peak_source,
            "roofs": c.roof_name,
            "per_op_step_seconds": c.ops.step_s,
            "bound_step_seconds": c.napkin.step_s,
        }
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def held_against(compiled, cfg, B, ours):
    """Our measured tokens/s beside two predictions of the same compiled step
    on this chip's roofs: the per-op one (each op on its roof, in the
    compiler's order) and the whole-step bound (exact FLOPs at the peak, the
    least bytes at full bandwidth). Returns the comparison."""
    c = local_comparison(cfg, B, compiled, devices=1)
    tokens = B * cfg.seq
    print(f"held against the same compiled step on this chip's roofs ({c.roof_name}):")
    for name, seconds in (
        ("per-op prediction", c.ops.step_s),
        ("whole-step bound", c.napkin.step_s),
    ):
        print(
            f"  {name:<20}{ms(seconds):>10} a step {tokens / seconds:>14,.0f} tokens/s"
            f"   ours {seconds / ours.median:.2f}x of it"
        )
    return c


def compare_flax(cfg, optimizer, fresh, batch, compiled, args):
    """The Flax NNX step from the same initial weights. The two steps are timed
    call by call in turn, so that both see the same load on a shared machine."""
    from flax import nnx  # imported only when asked for

    from sessions.model import flax_model

    model = flax_model.from_params(fresh()["params"], cfg)
    opt = flax_model.make_flax_optimizer(model, optimizer)
    step = flax_model.make_flax_train_step()
    flax_first = step(model, opt, batch)  # also compiles
    carry = [fresh()]
    carry[0], ours_first = compiled(carry[0], batch)

    def ours_call():
        carry[0], metrics = compiled(carry[0], batch)
        return metrics["loss"]

    # nnx.cached_partial walks the model's object graph once, not on every call.
    cached = nnx.cached_partial(step, model, opt)
    calls = {
        "ours": ours_call,
        "flax": lambda: step(model, opt, batch)["loss"],
        "cached": lambda: cached(batch)["loss"],
    }
    times = {name: [] for name in calls}
    for _ in range(args.warmup):
        jax.block_until_ready([call() for call in calls.values()])
    for _ in range(args.repeats):
        for name, call in calls.items():
            times[name] += time_calls(call, repeats=1, warmup=0).times
    ours, flax, cached = (Timing(tuple(times[name])) for name in calls)
    print(f"ours, in turn   {ours}")
    print(f"flax nnx step   {flax}")
    print(f"flax / ours     {flax.median / ours.median:.2f}x (Flax NNX median / ours)")
    print(f"flax, cached    {cached} (nnx.cached_partial), {cached.median / ours.median:.2f}x ours")
    print(
        f"same numbers    first-step loss {float(ours_first['loss']):.6f} ours, "
        f"{float(flax_first['loss']):.6f} flax"
    )


if __name__ == "__main__":
    sys.exit(run_main(main))

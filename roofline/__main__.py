"""python -m roofline: predict a training step's cost, measure it, compare.

    python -m roofline chips                                  # the chip table, with sources
    python -m roofline calibrate                              # measure this machine, cache it
    python -m roofline predict --preset gpt2 --batch 32 --chip h100
    python -m roofline compare runs/profile_s2                # a trace, read back

Bad input (an unknown chip or preset, a number that is not positive, a
directory with no trace) is one line on stderr and exit status 2.
"""

import json
import os
import sys

from roofline import calibrate
from roofline.flops import flash_kernel, ledger_lines, model_line, train_bytes
from roofline.hardware import CHIPS, find_chip, measured_chip
from roofline.measured.compare import compare
from roofline.measured.record import HLO, comparison_summary, load_hlo, load_metadata, roofs_for
from roofline.measured.table import report_lines
from roofline.measured.trace import read_trace
from roofline.predict import predict_train_step
from sessions.attention import IMPLEMENTATIONS
from sessions.config import PRESETS, ModelConfig
from sessions.errors import UsageError
from sessions.run.cli import ArgumentParser, positive_int, resolve


def parse_args(argv):
    parser = ArgumentParser(prog="python -m roofline", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("chips", help="the chip table: peaks, bandwidths, sources")

    cal = commands.add_parser(
        "calibrate", help="measure this machine's matmul FLOP/s and copy bandwidth, and cache them"
    )
    cal.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")

    pred = commands.add_parser("predict", help="the best case for one training step on a chip")
    add_model_flags(pred)
    pred.add_argument(
        "--chip",
        default="local",
        help=f"one of {', '.join(sorted(CHIPS))}, or local (measured; the default)",
    )
    pred.add_argument(
        "--dtype",
        choices=["bfloat16", "float32", "tf32"],
        help="matmul dtype (default: bfloat16 on a table chip, float32 locally)",
    )
    pred.add_argument("--chips", type=positive_int, default=1, help="chips sharing the step")

    comp = commands.add_parser(
        "compare",
        help="napkin vs XLA vs a trace written by scripts/profile_s2.py or s2_train.py --profile",
    )
    comp.add_argument("logdir", help="the directory given to --profile")
    comp.add_argument("--summary-out", help="write the measured and predicted step as JSON")
    add_model_flags(comp, preset_default=None)
    comp.set_defaults(dtype=None)  # no --dtype: resolve's, float32 (as model_from_args resolves)
    return parser.parse_args(argv)


def add_model_flags(parser, preset_default="cpu"):
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=preset_default,
        help=f"named shapes (default: {preset_default})",
    )
    parser.add_argument("--batch", type=positive_int, help="sequences per step (default: preset's)")
    for flag in ("seq", "embed", "ff", "heads", "head-dim", "layers", "vocab"):
        parser.add_argument(f"--{flag}", type=positive_int)
    parser.add_argument(
        "--attention-impl",
        choices=sorted(IMPLEMENTATIONS),
        help="einsum and fused (XLA's) keep the [B, H, S, S] probabilities for "
        "backward; the flash kernels (cudnn, splash) do not",
    )
    # What the session scripts' resolve reads that one step's cost does not depend on.
    parser.set_defaults(steps=None, lr=None, seed=None, log_every=None, eval_every=None)
    parser.set_defaults(data=None, no_attention=False, no_positions=False)
    parser.set_defaults(kv_heads=None, rope=None, gated=None, tied=None)  # the preset's model


def model_from_args(args, **overrides):
    """(ModelConfig, TrainConfig) of the preset with the shape flags applied, by the
    session scripts' own resolve; attention as --attention-impl says (einsum if not)."""
    impl = args.attention_impl or "einsum"
    run = resolve(args, platform="cpu", attention_impl=impl, **overrides)
    return run.model, run.train


def chips_lines():
    def tflops(chip, dtype):
        return f"{chip.flops[dtype] / 1e12:,.1f}" if dtype in chip.flops else "-"

    row = "{:<15}{:>7}{:>8}{:>7}{:>10}{:>8}{:>9}{:>8}{:>7}{:>6}  {}".format
    lines = [
        "peak dense TFLOP/s per chip, memory, interconnect (bidirectional, per chip); "
        + "ridge = bf16 peak / HBM bandwidth; host = one host's worth, the default "
        + "of s2_train.py --target CHIP[:SHAPE]; cc = NVIDIA compute capability",
        row(
            "chip",
            "bf16",
            "tf32",
            "fp32",
            "HBM GB/s",
            "HBM GB",
            "ICI GB/s",
            "ridge",
            "host",
            "cc",
            "source",
        ),
    ]
    for name, chip in CHIPS.items():
        if name != chip.name:
            lines.append(f"{name:<15}the same as {chip.name}")
            continue
        link = f"{chip.interconnect / 1e9:,.0f}" if chip.interconnect else "-"
        lines.append(
            row(
                name,
                tflops(chip, "bfloat16"),
                tflops(chip, "tf32"),
                tflops(chip, "float32"),
                f"{chip.hbm_bandwidth / 1e9:,.0f}",
                f"{chip.hbm_bytes / 1e9:,.0f}",
                link,
                f"{chip.ridge('bfloat16'):,.0f}",
                chip.host_shape or "-",
                chip.compute_capability or "-",
                chip.source,
            )
        )
    fp16 = [
        f"{n} {c.flops['float16'] / 1e12:,.0f}"
        for n, c in CHIPS.items()
        if n == c.name and "float16" in c.flops
    ]
    lines.append(
        "below cc 8.0, no bf16 or tf32 tensor cores: bf16 matmuls run at the fp32 "
        f"rate; fp16 tensor TFLOP/s: {', '.join(fp16)}"
    )
    local = calibrate.cached("float32")
    if local:
        lines.append(
            f"local          {local['matmul_flops'] / 1e12:.3f} TFLOP/s float32 matmul, "
            f"{local['copy_bandwidth'] / 1e9:,.1f} GB/s copy: measured, cached in "
            f"{calibrate.CACHE}"
        )
    else:
        lines.append("local          not measured yet: python -m roofline calibrate")
    return lines


def calibrate_lines(dtype):
    m = calibrate.measured(dtype, refresh=True)
    lines = [
        f"{calibrate.device_key(dtype)}",
        f"  matmul  {m['matmul_flops'] / 1e12:.3f} TFLOP/s "
        f"({m['n']} x {m['n']} {dtype}, best of 5)",
        f"  copy    {m['copy_bandwidth'] / 1e9:,.1f} GB/s (read + write of a large array)",
        f"  read    {calibrate.read_bandwidth(refresh=True) / 1e9:,.1f} GB/s "
        "(read-only: decode's roof)",
    ]
    cache_bandwidth, cache_bytes = calibrate.cache_roof(refresh=True)
    if cache_bandwidth:
        lines.append(
            f"  cache   {cache_bandwidth / 1e9:,.1f} GB/s (read + write within the "
            f"{cache_bytes / 2**20:,.0f} MiB last-level cache: the per-op roof of small ops)"
        )
    return [*lines, f"cached in {calibrate.CACHE}"]


def predict_lines(args):
    if args.chip == "local":
        dtype = args.dtype or "float32"
        chip = measured_chip("float32" if dtype == "tf32" else dtype)
    else:
        try:
            chip = find_chip(args.chip)
        except KeyError as e:
            raise UsageError(e.args[0]) from None
        dtype = args.dtype or "bfloat16"
    # tf32 is a float32 matmul mode: activations stay float32.
    cfg, tc = model_from_args(args, dtype="float32" if dtype == "tf32" else dtype)
    batch = tc.batch
    p = predict_train_step(cfg, batch, chip, dtype=dtype, chips=args.chips)
    b = train_bytes(cfg, batch)
    kept = "with" if cfg.attention and not flash_kernel(cfg) else "without"
    return [
        f"predict: preset {args.preset} | {batch} x {cfg.seq} = {batch * cfg.seq:,} tokens per step"
        + f" | {model_line(cfg, length=None)} | {dtype}, {cfg.attention_impl} attention",
        f"chip: {args.chips} x {chip.name}: {chip.peak(dtype) / 1e12:,.1f} TFLOP/s {dtype}, "
        + f"{chip.hbm_bandwidth / 1e9:,.0f} GB/s memory ({chip.source})",
        "",
        *ledger_lines(cfg, batch),
        "",
        f"bytes per step, lower bound: {b.total / 1e9:,.2f} GB",
        f"  weights read once       {b.weights / 1e9:10,.2f} GB   float32 master copy",
        f"  gradients written once  {b.gradients / 1e9:10,.2f} GB   float32",
        f"  optimizer (AdamW)       {b.optimizer / 1e9:10,.2f} GB   "
        + "reads weights, gradients, m, v; writes weights, m, v",
        f"  activations for backward{b.activations / 1e9:10,.2f} GB   "
        + f"written and read once, {kept} the attention probabilities",
        "",
        "roofline (lower bounds: no step can be faster)",
        f"  compute-bound  {p.compute_s * 1e3:10,.2f} ms   exact FLOPs / (chips x peak)",
        f"  memory-bound   {p.memory_s * 1e3:10,.2f} ms   bytes / (chips x bandwidth)",
        f"  intensity {p.intensity:,.1f} FLOP/byte against a ridge of {p.ridge:,.1f}: "
        + f"{p.bound}-bound",
        f"  best case: {p.step_s * 1e3:,.2f} ms per step, {p.tokens_per_s:,.0f} tokens/s "
        + f"(MFU {100 * p.compute_s / p.step_s:.0f}% at that speed)",
    ]


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
        cfg, tc = model_from_args(args)
        same = saved and saved.cfg == cfg and saved.batch == tc.batch
        batch, cost, devices = tc.batch, saved.cost if same else None, saved.devices if same else 1
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
    args = parse_args(argv)
    try:
        if args.command == "chips":
            lines = chips_lines()
        elif args.command == "calibrate":
            lines = calibrate_lines(args.dtype)
        elif args.command == "predict":
            lines = predict_lines(args)
        else:
            lines = compare_lines(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m roofline's flags: each command's arguments, read off the command line.
With roofline/__main__.py, the only modules of roofline/ that import from sessions/
(its flag types, presets and attention choices)."""

import argparse

from roofline.hardware import CHIPS
from roofline.plan.serve_plan import BOOK_MFU, PAGE_SIZE, SLO_PRESETS
from roofline.plan.training_memory import DTYPE_BYTES, OFFLOADS, SHARDS
from sessions.errors import course_preset
from sessions.model.attention import IMPLEMENTATIONS
from sessions.model.config import PRESETS, PUBLISHED
from sessions.run.cli import ArgumentParser, output_file, positive_float, positive_int

PRESET_HELP = (
    f"a published model ({', '.join(PUBLISHED)}), or a course preset on bytes, V=256 "
    f"({', '.join(PRESETS)})"
)
CHIP_HELP = f"one of {', '.join(sorted(CHIPS))}"


def parse_args(argv, description):
    parser = ArgumentParser(prog="python -m roofline", description=description)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("chips", help="the chip table: peaks, bandwidths, sources")

    cal = commands.add_parser(
        "calibrate", help="measure this machine's matmul FLOP/s and copy bandwidth, and cache them"
    )
    cal.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")

    pred = commands.add_parser(
        "predict", help="the best case for one training step on a chip; with --tokens, a run"
    )
    add_model_flags(pred, published=True)
    add_kv_heads_flag(pred)
    pred.add_argument("--chip", default="local", help=f"{CHIP_HELP}, or local (measured; default)")
    pred.add_argument(
        "--dtype",
        choices=["bfloat16", "float32", "tf32"],
        help="matmul dtype (default: bfloat16 on a table chip, float32 locally)",
    )
    pred.add_argument("--chips", type=positive_int, default=1, help="chips sharing the step")
    pred.add_argument("--tokens", type=positive_float, help="a training run's tokens (2e12)")
    pred.add_argument("--mfu", type=positive_float, help="with --tokens: a fraction (0.4)")
    pred.add_argument("--summary-out", type=output_file, help="write the numbers as JSON")
    # decode's levers, refused here with the line that says so
    pred.add_argument("--weights", help=argparse.SUPPRESS)
    pred.add_argument("--cache", help=argparse.SUPPRESS)

    dec = commands.add_parser(
        "decode", help="serving a model on chips: bytes, fits, bound, tokens/s per batch"
    )
    dec.add_argument(
        "--preset", required=True, choices=sorted({*PUBLISHED, *PRESETS}), help=PRESET_HELP
    )
    dec.add_argument("--chip", default="h100", help=f"{CHIP_HELP} (default: h100)")
    dec.add_argument("--chips", type=positive_int, default=1, metavar="N", help="TP over N")
    dec.add_argument("--batches", type=batch_list, default=[1, 8, 64], help="default 1,8,64")
    dec.add_argument("--context", type=positive_int, help="T, cache positions (preset's seq)")
    add_kv_heads_flag(dec)
    dec.add_argument("--weights", choices=["int8"], help="int8: 1 byte + a scale per channel")
    dec.add_argument("--cache", choices=["int8"], help="int8: 1 byte + a scale per token, head")
    dec.add_argument("--prompt", type=positive_int, help="TTFT's tokens (1024, or T if less)")
    dec.add_argument(
        "--kernels-per-layer", type=positive_int, help="2: ours, 10 outside (XLA's: 13, 8)"
    )
    dec.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the compute dtype: the matmuls' peak, and every byte that is not int8",
    )
    dec.add_argument("--summary-out", type=output_file, help="write the plan as JSON")

    add_serve_flags(
        commands.add_parser(
            "serve", help="a model served within TTFT/TPOT targets: batch, pages, rates, chips"
        )
    )

    mem = commands.add_parser("memory", help="a training step's bytes a chip, and its levers")
    add_model_flags(mem, published=True)
    for action in mem._actions:  # --batch: refused with the line that says so, not offered
        if action.dest == "batch":
            action.help = argparse.SUPPRESS
    add_memory_flags(mem)
    mem.add_argument("--summary-out", type=output_file, help="write the plan as JSON")

    comp = commands.add_parser(
        "compare",
        help="napkin vs XLA vs a trace written by scripts/profile_s2.py or s2_train.py --profile",
    )
    comp.add_argument("logdir", help="the directory given to --profile")
    comp.add_argument("--summary-out", help="write the measured and predicted step as JSON")
    add_model_flags(comp, preset_default=None)
    comp.set_defaults(dtype=None, kv_heads=None)  # no --dtype: resolve's, float32
    return parser.parse_args(argv)


def batch_list(text):
    try:
        return [positive_int(b) for b in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}': positive integers, e.g. 1,8,64") from None


def add_kv_heads_flag(parser):
    parser.add_argument("--kv-heads", type=positive_int, help="K: key/value heads, dividing H")


def add_model_flags(parser, preset_default="cpu", published=False):
    parser.add_argument(
        "--preset",
        type=None if published else course_preset,  # compare reads our own runs alone
        choices=sorted({*PUBLISHED, *PRESETS} if published else PRESETS),
        default=preset_default,
        help=f"{PRESET_HELP if published else 'named shapes'} (default: {preset_default})",
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
    parser.set_defaults(steps=None, lr=None, seed=None, log_every=None, eval_every=None, accum=None)
    parser.set_defaults(data=None, no_attention=False, no_positions=False)
    parser.set_defaults(kv_heads=None, rope=None, gated=None, tied=None)  # the preset's model
    # The model's own levers: memory's --remat is the napkin's, as is its --scan-layers.
    parser.set_defaults(remat=None, scan_layers=None, loss_chunks=None, sequence_parallel=None)
    parser.set_defaults(offload=None)  # the step's own: none


def _remat(text):
    return int(text) if text.isdigit() and int(text) > 0 else text


def add_memory_flags(parser):
    """python -m roofline memory's levers (the model's flags are the command line's)."""
    parser.add_argument(
        "--chip", default="h100", help=f"{CHIP_HELP}, or local: this machine (default: h100)"
    )
    parser.add_argument("--chips", type=positive_int, default=1, help="chips the step runs on (N)")
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor parallel over T of them")
    parser.add_argument(
        "--seq-shards", type=positive_int, help="each sequence split over N chips (default: "
        "1, or the fewest that make the batch divide)"
    )  # fmt: skip
    parser.add_argument("--batch-tokens", type=positive_int, required=True, help="tokens a step")
    parser.add_argument(
        "--remat", dest="policy", type=_remat, default="none",
        help="a policy (none, dots, block, MaxText's names, names:a,b) or N tensors of E",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=DTYPE_BYTES, help="the compute dtype (default: the preset's; "
        "bfloat16 with --weights bfloat16)"
    )  # fmt: skip
    parser.add_argument("--weights", choices=DTYPE_BYTES, default="float32")
    parser.add_argument("--master", action="store_true", help="a float32 copy of bf16 weights")
    parser.add_argument("--grads", choices=DTYPE_BYTES, default="float32")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--optimizer-dtype", choices=DTYPE_BYTES, default="float32")
    parser.add_argument("--shard", choices=SHARDS, default="none", help="ZeRO's stages 0 to 3")
    parser.add_argument("--accum", type=positive_int, default=1, help="microbatches a step")
    parser.add_argument("--scan-layers", action="store_true", help="their weights stacked")
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        default=False,
        help="with --tp: what tp copies, sharded",
    )
    parser.add_argument("--loss-chunks", type=positive_int, default=1, help="loss over N chunks")
    parser.add_argument("--offload", choices=OFFLOADS, help="those bytes in host memory")
    parser.add_argument("--pipeline-stages", type=positive_int, default=1, help="P (napkin)")
    parser.add_argument("--microbatches", type=positive_int, help="M, a pipeline's (default P)")


def add_serve_flags(parser):
    """python -m roofline serve's flags: the model, its chips, the requests, the targets."""
    parser.add_argument(
        "--preset", required=True, choices=sorted({*PUBLISHED, *PRESETS}), help=PRESET_HELP
    )
    parser.add_argument("--chip", required=True, help=CHIP_HELP)
    parser.add_argument("--chips", type=positive_int, default=1, metavar="N", help="TP over N")
    parser.add_argument("--weights", choices=["int8"], help="int8: 1 byte + a scale per channel")
    parser.add_argument("--cache", choices=["int8"], help="int8: 1 byte + a scale per token, head")
    parser.add_argument("--prompt", type=positive_int, required=True, help="P, prompt tokens")
    parser.add_argument("--output", type=positive_int, required=True, help="G, output tokens")
    parser.add_argument("--context", type=positive_int, help="T a sequence may hold (preset's)")
    parser.add_argument("--batch", type=positive_int, help="B slots (default: the most that fit)")
    parser.add_argument(
        "--prefill-mfu", type=positive_float, default=BOOK_MFU, help="default 0.4, the book's"
    )
    parser.add_argument(
        "--slo", choices=sorted(SLO_PRESETS), help="MLPerf's Server limits (loadgen/mlperf.conf)"
    )
    parser.add_argument("--slo-ttft", type=positive_float, help="seconds to the first token")
    parser.add_argument("--slo-tpot", type=positive_float, help="seconds per output token")
    parser.add_argument("--rate", type=positive_float, help="requests/s to serve: fewest chips")
    parser.add_argument("--page-size", type=positive_int, default=PAGE_SIZE, help="default 16")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="compute dtype"
    )
    parser.add_argument("--summary-out", type=output_file, help="write the plan as JSON")

"""Command-line plumbing of the session scripts: their flags, turned into
configs once (library code never sees the flags), and bad input on one line.

    args = train_flags(argv)           # s2_train.py's flags (infer_flags: s3_infer.py's)
    run = resolve(args)                # Resolved(preset, model, train, attention_note, data)
    serving = serving_config(args)     # s3's and s5's: Serving(model, shapes, checkpoint_dir, ...)

What a flag leaves open (each platform's preset, dtype, corpus, attention): run/defaults.py.
"""

import argparse
import os
from typing import NamedTuple

import jax

from sessions.errors import UsageError, course_preset
from sessions.model.attention import IMPLEMENTATIONS
from sessions.model.config import LEVERS, PRESETS, REMAT_POLICIES, TRAIN_LEVERS, ModelConfig
from sessions.run import multihost
from sessions.run.defaults import configs_for, serving_attention

PROMPT = "The import statement "  # the sample's start, in both sessions' scripts
NEW_TOKENS = 64  # s3_infer.py's decode steps, where the context holds them after the prompt


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's own errors (unknown flag, bad type) on one line, exit 2.
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text):
    value = int(text) if text.lstrip("-").isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got '{text}'")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def output_file(text):
    """A file to write later, its directory checked now, not after an hour's training."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text) or not os.path.isdir(folder):
        what = "is a directory" if os.path.isdir(text) else f"its directory {folder} does not exist"
        raise argparse.ArgumentTypeError(f"cannot write '{text}': {what}")
    return text


def make_folder(path, name):
    """Make a folder a run writes into now, before it does any work: a path that cannot
    be one (a file's name, or under /proc) stops the run on one line, not after its last
    step. `name` says which it is, as the user gave it (--run-dir, checkpoint folder)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{name} {path}: a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{name} {path}: cannot make this folder ({e.strerror})") from None


def add_shape_flags(parser):
    """--preset and the flags that override its fields (None: keep the preset's)."""
    parser.add_argument(
        "--preset",
        type=course_preset,
        choices=sorted(PRESETS),
        help="named shapes (default: cpu on a CPU, course on GPU/TPU)",
    )
    for flag in ("steps", "seq", "embed", "ff", "heads", "head-dim", "layers"):
        parser.add_argument(f"--{flag}", type=positive_int)
    parser.add_argument("--batch", type=positive_int, help="sequences per step, all devices")
    parser.add_argument(
        "--vocab",
        type=positive_int,
        help="vocabulary size: at least 256 on bytes; above every token of token files "
        "(GPT-2's: 50304); any for --target",
    )
    parser.add_argument("--lr", type=positive_float)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--log-every", type=positive_int)
    parser.add_argument(
        "--data",
        help="docs (CPython's docs, the CPU default), stdlib (its source, the GPU/TPU default), "
        "a text file, folder or glob, or token files: nanoGPT's train.bin, llm.c's "
        "'dir/*_train_*.bin' (with --vocab)",
    )
    # Session 5's switches of the model, None unless given: a served checkpoint's must match.
    parser.add_argument("--kv-heads", type=positive_int, metavar="K", help="key/value heads")
    for flag, dest, action, what in (
        ("--rope", "rope", "store_true", "rotary positions, not a learned table"),
        ("--gated", "gated", "store_true", "SwiGLU feed-forward: three matrices"),
        ("--untied", "tied", "store_false", "an output projection, not the embedding's"),
    ):
        parser.add_argument(flag, dest=dest, action=action, default=None, help=what)


def add_tokenizer_flag(parser):
    parser.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="a Hugging Face tokenizer.json that reads the ids of token files as text "
        "(needs `pip install tokenizers`; default: print ids)",
    )


def add_chip_flags(parser, what):
    """--dtype, --mesh and --target, as both sessions take them."""
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="matmul dtype (default: bfloat16 on GPU/TPU, float32 on CPU)",
    )
    parser.add_argument("--mesh", help="axis=size,... over data, fsdp, tp")
    parser.add_argument(
        "--target",
        metavar="CHIP[:SHAPE]",
        help=f"compile {what} for a chip this machine lacks (tpu-v5e:2x4, h100:8; chips: "
        "python -m roofline chips), print its memory, collectives, kernels, roofline; exit",
    )
    parser.add_argument(
        "--hlo-out", type=output_file, help="with --target: write the compiled program here"
    )
    parser.add_argument(
        "--summary-out", type=output_file, help="write the closing numbers here, as JSON"
    )


def train_flags(argv=None):
    """s2_train.py's flags, parsed."""
    parser = ArgumentParser(prog="s2_train.py", description="Session 2: train a transformer.")
    add_shape_flags(parser)
    add_chip_flags(parser, "the step")
    parser.add_argument(
        "--attention-impl",
        choices=sorted(IMPLEMENTATIONS),
        help="einsum by hand (default on CPU); fused: the chip's fastest, cuDNN's flash "
        "kernel on NVIDIA, Pallas splash on TPU, else jax.nn.dot_product_attention; "
        "pallas: our own flash kernel (sessions/kernels/flash.py; interpreted on a CPU, slow)",
    )
    parser.add_argument(
        "--collectives", choices=["auto", "manual"], default="auto",
        help="FSDP's collectives: inserted by the partitioner (auto), or written by hand "
        "under jax.shard_map (manual: meshes over data and fsdp, tp=1)",
    )  # fmt: skip
    parser.add_argument("--remat", help=f"a layer keeps: {', '.join(REMAT_POLICIES)}, names:a,b")
    parser.add_argument("--scan-layers", action="store_true", default=None, help="lax.scan")
    parser.add_argument("--sequence-parallel", action="store_true", help="S over tp between blocks")
    parser.add_argument("--accum", type=positive_int, help="microbatches a step, one update")
    parser.add_argument("--weights", choices=["float32", "bfloat16"], help="(bf16: computed so)")
    parser.add_argument("--master", action="store_true", default=None, help="a float32 copy")
    parser.add_argument("--loss-chunks", type=positive_int, help="the loss in N parts of S")
    parser.add_argument("--offload", help="optimizer: its state in host memory (GPU, TPU)")
    for flag in ("--no-attention", "--no-positions", "--no-jit", "--show-sharding"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--no-overlap", action="store_true", help="load each batch in the loop")
    parser.add_argument("--data-delay-ms", type=non_negative_int, default=0, help="slow storage")
    parser.add_argument("--eval-every", type=positive_int)
    parser.add_argument("--metrics-out", type=output_file, help="one JSON line a logged step")
    parser.add_argument("--run-dir", default="runs/s2", help="loss curve and outputs go here")
    parser.add_argument("--profile", metavar="DIR", help="trace a few steps into DIR (xprof)")
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=0,
        help="save every N steps, on SIGINT/SIGTERM and at the end (0: only with --checkpoint-dir)",
    )
    parser.add_argument("--checkpoint-dir", help="saves at the end (default: RUN_DIR/checkpoints)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument(
        "--prompt",
        help=f"start of the sample (default: '{PROMPT}', cut to fit); on token files, ids "
        "('464 1330', default: the validation split's first)",
    )
    add_tokenizer_flag(parser)
    parser.add_argument(
        "--sample-bytes", type=non_negative_int, default=300, help="(tokens, on token files)"
    )
    multihost.add_flags(parser)
    return parser.parse_args(argv)


def infer_parser(prog="s3_infer.py", description="Session 3: inference."):
    """s3_infer.py's flags, which s5_serve.py takes too (sessions/run/levers.py)."""
    parser = ArgumentParser(prog=prog, description=description)
    add_shape_flags(parser)
    add_chip_flags(parser, "prefill and decode")
    parser.add_argument("--checkpoint-dir", default="runs/s2/checkpoints")
    parser.add_argument("--random-params", action="store_true", help="no checkpoint: speed only")
    parser.add_argument("--batches", help="s3: 1,4,16,64 x data x fsdp; s5: 1,8,64")
    parser.add_argument("--new-tokens", type=positive_int, help=f"{NEW_TOKENS}, or what fits")
    parser.add_argument("--prompt", default=PROMPT, help="text; ids ('464 1330') on token files")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    add_tokenizer_flag(parser)
    parser.add_argument("--run-dir", default="runs/s3", help="the plot goes here")
    parser.add_argument(
        "--decode-impl",
        choices=["xla", "pallas"],
        default="xla",
        help="the decode step: XLA's (default), or ours, two Mosaic GPU kernels a layer "
        "(sessions/inference/kernel_step.py; bfloat16, batches up to 8). On a CPU ours runs in "
        "Mosaic GPU's interpreter: slow, for stepping through, not for speed",
    )
    # What resolve reads that s3 has no flag for: the model as trained, XLA's attention.
    parser.set_defaults(no_attention=False, no_positions=False, attention_impl=None)
    parser.set_defaults(eval_every=None, **dict.fromkeys((*LEVERS, *TRAIN_LEVERS)))
    return parser


def infer_flags(argv=None, parser=None):
    """s3_infer.py's flags (or `parser`'s, built on infer_parser), parsed and checked."""
    args = (parser or infer_parser()).parse_args(argv)
    if training := list(given(args, ("steps", "batch", "lr", "log_every", "data"))):
        raise UsageError(f"--{training[0].replace('_', '-')} is a training flag (try --batches)")
    try:
        args.batches = args.batches and [positive_int(b) for b in args.batches.split(",")]
    except argparse.ArgumentTypeError:
        raise UsageError(f"--batches {args.batches}: positive integers, e.g. 1,4,16") from None
    if args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature}: 0 (greedy) or positive")
    return args


FAMILY = ("kv_heads", "rope", "gated", "tied")  # session 5's switches
MODEL_FLAGS = ("seq", "embed", "ff", "heads", "head_dim", "layers", "vocab", *FAMILY)
TRAIN_FLAGS = ("steps", "batch", "lr", "seed", "log_every", "eval_every", *TRAIN_LEVERS)
READ = ("preset", "dtype", "attention_impl", "no_attention", "no_positions", "data", *LEVERS)


def given(args, names):  # {name: value} of the flags among `names` that were set
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def resolve(args, platform=None, **model_overrides):
    """sessions.run.defaults.Resolved configs for the chip the step is built for: `platform`
    ("cpu", "gpu", "tpu"; None: this machine's, whose device also says its compute
    capability). What it reads is each a flag of the command or fixed by its parser's
    set_defaults; model_overrides are ModelConfig fields set over the flags."""
    if missing := [name for name in (*READ, *MODEL_FLAGS, *TRAIN_FLAGS) if name not in vars(args)]:
        raise TypeError(f"resolve reads {', '.join(missing)}: not a flag of this command")
    device = None if platform else jax.local_devices()[0]  # this machine's, when it is the chip
    flags = {"attention": not args.no_attention, "positions": not args.no_positions}
    return configs_for(
        platform or jax.default_backend(),
        device,
        preset=args.preset,
        dtype=args.dtype,
        attention_impl=args.attention_impl,
        data=args.data,
        model_fields={**given(args, (*MODEL_FLAGS, *LEVERS)), **flags, **model_overrides},
        train_fields=given(args, TRAIN_FLAGS),
    )


SHAPES = (*MODEL_FLAGS, "attention", "positions")


class Serving(NamedTuple):
    """s3_infer.py's and s5_serve.py's flags as configs (serving_config): the model to
    serve, and its prompt."""

    model: ModelConfig  # preset + shape flags, the platform's dtype, XLA's attention
    shapes: dict  # those the flags ask for (all, with --preset): a checkpoint's must match
    checkpoint_dir: str | None  # None: random parameters (--random-params, --target)
    prompt: str
    tokenizer: str | None  # a tokenizer.json that writes token ids as text
    preset: str  # the preset's name, as resolve chose it
    corpus: str  # the platform's corpus, as session 2 trains on it: s5 validates on it
    decode_impl: str  # "xla", or "pallas": our kernels (sessions/inference/kernel_step.py)


def serving_config(args, platform=None):
    """Serving for s3_infer.py's (and s5_serve.py's) flags on `platform` (None: this machine's)."""
    attention = serving_attention(platform or jax.default_backend())
    checkpoint_dir = None if args.random_params or args.target else args.checkpoint_dir
    held = {"kv_heads": None} if checkpoint_dir else {}  # K must divide the checkpoint's H
    run = resolve(args, platform, attention_impl=attention, **held)
    asked = [f for f in SHAPES if args.preset or f in given(args, MODEL_FLAGS)]
    shapes = {f: getattr(run.model, f) for f in asked} | given(args, ("kv_heads",))
    text = args.prompt, args.tokenizer
    return Serving(run.model, shapes, checkpoint_dir, *text, run.preset, run.data, args.decode_impl)

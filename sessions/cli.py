"""Command-line plumbing shared by the session scripts: flags that override a
preset's fields, checked, and bad input reported on one line with exit status 2."""

import argparse
import dataclasses
import sys

from sessions.config import PRESETS, UsageError


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


def add_shape_flags(parser):
    """--preset and the flags that override its fields (None: keep the preset's)."""
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="named shapes (default: cpu on a CPU, course on GPU/TPU)",
    )
    parser.add_argument("--steps", type=positive_int)
    parser.add_argument("--batch", type=positive_int, help="sequences per step, all devices")
    parser.add_argument("--seq", type=positive_int)
    parser.add_argument("--embed", type=positive_int)
    parser.add_argument("--ff", type=positive_int)
    parser.add_argument("--heads", type=positive_int)
    parser.add_argument("--head-dim", type=positive_int)
    parser.add_argument("--layers", type=positive_int)
    parser.add_argument("--lr", type=positive_float)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--log-every", type=positive_int)
    parser.add_argument("--data", help="a text file, folder or glob (default: CPython's docs)")


def configs_from_args(args, preset_name, **model_overrides):
    """(ModelConfig, TrainConfig): the preset with every given flag applied."""
    preset = PRESETS[preset_name]
    model_fields = {
        "seq": args.seq,
        "embed": args.embed,
        "ff": args.ff,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "layers": args.layers,
        **model_overrides,
    }
    train_fields = {
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seed": args.seed,
        "log_every": args.log_every,
    }
    model = dataclasses.replace(
        preset.model, **{k: v for k, v in model_fields.items() if v is not None}
    )
    train = dataclasses.replace(
        preset.train, **{k: v for k, v in train_fields.items() if v is not None}
    )
    return model, train


def run_main(main, argv=None):
    """Call main(argv); a UsageError becomes one line on stderr and exit 2."""
    try:
        return main(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

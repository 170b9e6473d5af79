"""How a run stops that the user sees as one line, never a traceback.

The session scripts catch these at their entry point (run_main, below), print
the message on one line and exit with the status each one names. --preset gpt2,
the published GPT-2's name, is refused before that, by argparse, on one line too
(course_preset, below: --preset's type in every script that trains or serves ours).
"""

import argparse
import sys


class UsageError(ValueError):
    """A bad flag or input the user can fix (exit status 2)."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite (exit status 1)."""


class Interrupted(Exception):
    """SIGINT or SIGTERM, after the checkpoint was saved (exit status 130)."""


def run_main(main, argv=None):
    """main(argv), with every way a run stops on purpose turned into one line
    on stderr and its exit status (the classes above)."""
    try:
        return main(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"error: {e}; try a lower --lr", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("stopped: interrupted (no checkpoints: pass --checkpoint-every N)", file=sys.stderr)
        return 130


def course_preset(name):
    """--preset's type in the course's scripts, read before argparse checks its choices
    (PRESETS): a name is one model, and gpt2 is the published GPT-2, the planner's."""
    if name == "gpt2":
        raise argparse.ArgumentTypeError(
            "gpt2 is the published GPT-2 (V=50,257), which python -m roofline plans "
            "(predict, decode, memory); the course's GPT-2 on bytes is gpt2-bytes"
        )
    return name

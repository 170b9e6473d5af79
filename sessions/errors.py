"""How a run stops that the user sees as one line, never a traceback.

The session scripts catch these at their entry point (run_main, below), print
the message on one line and exit with the status each one names.
"""

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

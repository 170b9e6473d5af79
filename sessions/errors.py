"""How a run stops that the user sees as one line, never a traceback.

The session scripts catch these at their entry point (sessions.run.cli.run_main),
print the message on one line and exit with the status each one names.
"""


class UsageError(ValueError):
    """A bad flag or input the user can fix (exit status 2)."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite (exit status 1)."""


class Interrupted(Exception):
    """SIGINT or SIGTERM, after the checkpoint was saved (exit status 130)."""

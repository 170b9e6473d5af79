"""Stopping on a signal: every host stops after the same step and saves together.

SIGINT (Ctrl-C) or SIGTERM (a spot or preemptible VM's notice, a scheduler's
cancel) only sets a flag, so a save never starts in the middle of a step.

On one host the loop acts on the flag after the step it arrived in. On a pod
that would deadlock: SIGTERM reaches the hosts at different steps (or one host
only), the signalled host starts a save and waits in orbax's cross-process
barrier, while the others go on into the next step's collectives, waiting for
it. So the hosts agree first. Every `agree_every` steps each one contributes
its flag to an all-gather of one int32 per process, and all of them read the
same answer: go on, or save this step together and stop.

What the agreement costs: the all-gather waits for the step before it to
finish (it runs after it on the same devices), so it is put on the log steps,
where the loop waits for the loss anyway; what is left is one tiny
collective and a host round trip per log step. What it costs the stop: up to
`agree_every` steps pass between the signal and the save, so keep
--log-every x the step time well inside the notice a preemption gives
(30 s on a Compute Engine spot VM; the source is Google's "Preemption process"
page for spot VMs).

JAX ships the same idea, `multihost_utils.reached_preemption_sync_point`, tied
to the coordination service's own SIGTERM notifier; the flag here also covers
SIGINT, works the same on one process, and can be watched in a test.
"""

import signal
import time
from signal import SIGINT, SIGTERM

import jax

from sessions.errors import Interrupted
from sessions.run import multihost


class SaveHook:
    """Called by the training loop after every step: saves on checkpoint steps
    (checkpoints may be None: a run that keeps none) and, once the hosts agree
    that a signal has arrived, saves and stops."""

    def __init__(self, checkpoints, agree_every=1):
        self.checkpoints = checkpoints
        self.agree_every = agree_every if jax.process_count() > 1 else 1
        self.signal = 0  # the signal's number; 0: none
        self._previous = {s: signal.signal(s, self._on_signal) for s in (SIGINT, SIGTERM)}

    def _on_signal(self, signum, frame):
        self.signal = signum

    def agreed_stop(self, done):
        """(signal number, the process it reached) once the hosts agree to stop
        after step `done`, else None. Every host calls this after every step."""
        if done % self.agree_every:
            return None  # not an agreement step: even a signalled host goes on
        signals = multihost.every_process(self.signal)  # [processes]
        stopping = [p for p, number in enumerate(signals) if number]
        return (int(signals[stopping[0]]), stopping[0]) if stopping else None

    def __call__(self, step, state):
        """Returns the seconds spent saving, which are not step time."""
        done, saving = step + 1, 0.0
        stop = self.agreed_stop(done)
        if self.checkpoints and self.checkpoints.due(done, force=stop is not None):
            jax.block_until_ready(state)  # the step's own time ends here
            start = time.perf_counter()
            self.checkpoints.maybe_save(done, state, force=True)
            saving = time.perf_counter() - start
        if stop:
            number, process = stop
            where = f" on process {process}" if jax.process_count() > 1 else ""
            saved = (
                f"the checkpoint is saved in {self.checkpoints.directory}: "
                "rerun with --resume to continue"
                if self.checkpoints
                else "no checkpoint was kept (pass --checkpoint-every N to keep one)"
            )
            raise Interrupted(f"{signal.Signals(number).name}{where} after step {done}; {saved}")
        return saving

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

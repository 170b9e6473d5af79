"""The training loop's clock and log: what a step cost, read only every
`log_every` steps.

`step_fn(state, batch)` returns at once: JAX dispatches the work to the
devices and hands back futures. Reading the loss (`float(loss)`) waits for
the step to finish; doing that every step would leave the devices idle while
Python prepares the next one. So s2_train.py's loop reads the loss only on
log steps, and the Meter times the steps between two such reads: wall time,
less what the loop spent on work of its own (validation, saves, the profiler),
which `pause` hands it.
"""

import json
import math
import time

from roofline.predict import utilisation
from sessions.errors import TrainingDiverged


class Meter:
    """Times steps start..steps-1 between log steps and writes one record per
    log step: to `metrics_file` (the --metrics-out JSON lines) first, then to
    the screen, so a line seen on the screen is in the file. peak_flops is of
    one device."""

    def __init__(
        self,
        *,
        start,
        steps,
        log_every,
        tokens_per_step,
        flops_per_step,
        peak_flops,
        n_devices,
        log=print,
        metrics_file=None,
    ):
        self.steps, self.log_every = steps, log_every
        self.per_step = (tokens_per_step, flops_per_step, peak_flops, n_devices)
        self.say, self.metrics_file = log, metrics_file
        self.history = []  # one record per log step
        self.train_seconds = 0.0  # in steps, between log steps
        self.last_step, self.paused = start, 0.0
        self.last_time = time.perf_counter()

    def is_log_step(self, done):
        return done % self.log_every == 0 or done == self.steps

    def pause(self, seconds):
        """Seconds since the last log step spent on anything but steps."""
        self.paused += seconds

    def record(self, done, loss):
        """The record of log step `done`, its loss just read (which waited for the step)."""
        seconds = time.perf_counter() - self.last_time - self.paused
        self.train_seconds += seconds
        record = make_record(done, loss, seconds / (done - self.last_step), *self.per_step)
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the loss became {loss} at step {done}")
        return record

    def write(self, record):
        self.history.append(record)
        if self.metrics_file is not None:
            self.metrics_file.write(json.dumps(record) + "\n")
            self.metrics_file.flush()
        self.say(format_record(record))

    def restart(self, done):
        """After a log step's validation and saves: the clock starts again."""
        self.last_time, self.last_step, self.paused = time.perf_counter(), done, 0.0


def make_record(step, loss, step_time, tokens_per_step, flops_per_step, peak_flops, n_devices):
    """One log line's numbers; step_time is seconds per step, peak_flops of one device."""
    flops_per_s, mfu = run_utilisation(flops_per_step, step_time, peak_flops, n_devices)
    return {
        "step": step,
        "loss": loss,
        "step_time_s": step_time,
        "tokens_per_sec": tokens_per_step / step_time,
        "tflops_per_device": flops_per_s / 1e12,
        "mfu": mfu,
        "mfu_exceeds_peak": impossible_mfu(mfu),
    }


def run_utilisation(flops_per_step, step_time, peak_flops, n_devices):
    """(model FLOP/s per device, MFU) of a step that took step_time seconds, by
    roofline.predict.utilisation. The run divides by one peak per device, the
    datasheet's where the chip table has the chip, else measured
    (roofline.hardware.local_peak_flops; the header names which): the ratio is
    the same either way, so it goes in as the datasheet's."""
    use = utilisation(flops_per_step, step_time, datasheet_peak=peak_flops, chips=n_devices)
    return use.flops_per_s, use.mfu_datasheet


def impossible_mfu(mfu):
    """No step does more FLOPs per second than its chip's peak: an MFU above 1
    says the peak it was divided by is wrong for this chip (a table entry that
    is not this part, a measurement taken under load), not that the step is fast."""
    return mfu > 1


def format_record(r):
    mfu = f"MFU {100 * r['mfu']:5.1f}%"
    if impossible_mfu(r["mfu"]):
        mfu = f"MFU n/a ({100 * r['mfu']:.0f}% of a wrong peak)"
    line = (
        f"step {r['step']:>6} | loss {r['loss']:.3f} | {r['tokens_per_sec']:>10,.0f} tok/s"
        f" | {r['tflops_per_device']:7.3f} TFLOP/s/device | {mfu}"
    )
    if "val_loss" in r:
        line += f" | val {r['val_loss']:.3f}"
    return line

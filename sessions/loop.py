"""The training loop: hand batches to the step, and look at the numbers only
every `log_every` steps.

`step_fn(state, batch)` returns at once: JAX dispatches the work to the
devices and hands back futures. Reading the loss (`float(loss)`) waits for
the step to finish; doing that every step would leave the devices idle while
Python prepares the next one. So the loop reads the loss only on log steps,
and between them runs under a transfer guard that turns any accidental
device-to-host read into an error instead of a silent slowdown.
"""

import json
import math
import time

import jax


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def train_loop(
    step_fn,
    state,
    batches,
    *,
    start,
    steps,
    log_every,
    tokens_per_step,
    flops_per_step,
    peak_flops,
    n_devices,
    evaluate=None,
    eval_every=0,
    log=print,
    metrics_file=None,
    on_step=None,
    wait_for_step=False,
):
    """Runs steps start..steps-1. Returns (state, history, seconds spent in steps).

    wait_for_step: wait for each step to finish before asking for the next
    batch, so loading and computing never overlap (session 1's blocking loads;
    s2_train.py --no-overlap).

    history: one dict per log line (the --metrics-out JSON objects).
    peak_flops: of one device. on_step(step, state), if given, is called after
    every step, and on a log step after its line is written (the profiler and
    the checkpoints use it); it returns the seconds it spent on work of its own
    (a save), which are not counted as step time.
    """
    history = []
    train_seconds = 0.0
    last_time, last_step = time.perf_counter(), start
    paused = 0.0  # seconds since last_time spent in on_step's own work
    for step in range(start, steps):
        if wait_for_step:
            jax.block_until_ready(state)
        with (
            jax.profiler.StepTraceAnnotation("train", step_num=step),
            jax.transfer_guard_device_to_host("disallow"),
        ):
            state, metrics = step_fn(state, next(batches))
        done = step + 1
        logged = not (done % log_every and done != steps)
        if logged:
            loss = float(metrics["loss"])  # waits for this step: the only sync between logs
            seconds = time.perf_counter() - last_time - paused
            train_seconds += seconds
            step_time = seconds / (done - last_step)
            record = make_record(
                done, loss, step_time, tokens_per_step, flops_per_step, peak_flops, n_devices
            )
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the loss became {loss} at step {done}")
            if evaluate is not None and (done % eval_every == 0 or done == steps):
                record["val_loss"] = evaluate(state["params"])
            history.append(record)
            # Written before on_step, which may save a checkpoint of this step: a
            # run killed after that save resumes past this step, so its line must
            # be on disk already. Written before it is printed, so a line seen on
            # the screen is in the file.
            if metrics_file is not None:
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
            log(format_record(record))
        if on_step is not None:
            paused += on_step(step, state) or 0.0
        if logged:
            # Restart the clock after logging, validation and saving: not step time.
            last_time, last_step, paused = time.perf_counter(), done, 0.0
    return state, history, train_seconds


def make_record(step, loss, step_time, tokens_per_step, flops_per_step, peak_flops, n_devices):
    """One log line's numbers; step_time is seconds per step, peak_flops of one device."""
    mfu = flops_per_step / step_time / (peak_flops * n_devices)
    return {
        "step": step,
        "loss": loss,
        "step_time_s": step_time,
        "tokens_per_sec": tokens_per_step / step_time,
        "tflops_per_device": flops_per_step / step_time / n_devices / 1e12,
        "mfu": mfu,
        "mfu_exceeds_peak": impossible_mfu(mfu),
    }


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

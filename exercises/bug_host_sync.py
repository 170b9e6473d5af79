"""Find the bug: a training loop that waits for every step.

broken_loop() is correct but slow: float(loss) copies the loss to the host,
and to do so it must wait until the step that computes it has finished.
Every step. Meanwhile the next step is not dispatched, so the device idles
while Python runs the loop body, and the asynchronous dispatch that JAX
does for free is thrown away.

The tool: a profile (jax.profiler.trace, opened in xprof) shows gaps
between the steps on the device; or run the loop under
jax.transfer_guard_device_to_host("disallow"), which turns the implicit
copy in float(loss) into an error that points at the line.
"""

import jax


def broken_loop(step_fn, state, batches):
    """Run step_fn over batches; returns (state, losses: a float per step)."""
    losses = []
    for batch in batches:
        state, metrics = step_fn(state, batch)
        losses.append(float(metrics["loss"]))  # one host sync per step
    return state, losses


def train_loop(step_fn, state, batches, log_every=10):
    """broken_loop without the sync every step: returns (state, losses).

    step_fn(state, batch) -> (state, {"loss": scalar array, ...});
    losses: a Python float per step, in order, like broken_loop's. Keep each
    loss on the device as it comes and fetch them log_every at a time (and
    the rest at the end) with one jax.device_get, so the host waits for the
    device only once per log_every steps.
    Hint: a list of pending device arrays; jax.device_get(list) -> numpy values.
    """
    raise NotImplementedError

"""Profile: trace a few training steps with jax.profiler, for the viewer and
for roofline/measured/trace.py to read back.

    state, run_dir = capture(step_fn, state, batches, "runs/profile")
    profile = roofline.measured.trace.read_trace("runs/profile")

jax.profiler writes where xprof (and TensorBoard's profile plugin) look for
runs, LOGDIR/plugins/profile/<timestamp>/, per host a `<host>.xplane.pb`
(everything: open it with `xprof --logdir LOGDIR --port 8791`) and a
`<host>.trace.json.gz` (the timeline as Chrome trace events).

Each traced step is drained (`jax.block_until_ready`) before the next one is
dispatched. A GPU's trace does not say which execution of a program a kernel
belongs to (roofline/measured/trace.py), so its kernels are assigned to the step
marker that began before them; with the host running ahead, as it does in
training, step n+1's marker would be stamped while step n's kernels still
ran, and the steps would blur. Drained, every traced step runs alone: its time
in the trace is the device time of one step, without the host's dispatch of
the next one hidden behind it (the dispatch shows as a gap between steps,
which the reader leaves out). It costs the traced steps the overlap of
dispatch with compute, a few milliseconds at most; the other steps of the run
are untouched.
"""

import time

import jax

from roofline.measured.trace_ops import run_dirs


def open_command(logdir):
    """The command that opens a trace directory in the xprof viewer."""
    return f"xprof --logdir {logdir} --port 8791"


def start_trace(logdir):
    """jax.profiler.start_trace without its Python tracer. The tables read the
    XLA ops, never Python's calls, and tracing every Python call slows a CPU
    step: a jitted [4096,512] matmul, tanh and matmul took 7.0 ms a call
    untraced, 10.0 ms traced with JAX's default options and 7.0 ms with the
    Python tracer off (2-core AMD EPYC Zen 4, jax 0.10.2)."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    jax.profiler.start_trace(logdir, profiler_options=options)


def capture(step_fn, state, batches, logdir, *, steps=3, name="train"):
    """Run one warm-up step, then `steps` steps under the profiler into logdir.

    step_fn(state, batch) -> (state, metrics), as the training loop calls it;
    batches: an iterator of batches. Each step is wrapped in a
    StepTraceAnnotation(name, step_num=i), the marker xprof's step views use,
    and drained before the next (see the module's docstring). The trace opens
    and closes on a quiet device, so the window holds exactly these steps.
    Returns (state, the run directory written)."""
    state, metrics = step_fn(state, next(batches))  # compiles, if it must
    jax.block_until_ready((state, metrics))
    before = set(run_dirs(logdir))
    start_trace(logdir)
    try:
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(name, step_num=i):
                state, metrics = step_fn(state, next(batches))
            jax.block_until_ready((state, metrics))  # drained: step i ends before i+1 starts
    finally:
        jax.profiler.stop_trace()
    new = sorted(set(run_dirs(logdir)) - before)
    return state, (new or run_dirs(logdir))[-1]


class TraceWindow:
    """For a training loop: traces a few of its steps into logdir, the loop
    calling window(step, state) after each step. The run's first step is left
    out when there are others, as it may still be warming up. Each traced step
    is drained before the loop dispatches the next (see the module's docstring)."""

    def __init__(self, logdir, start, steps, count=3):
        self.logdir = logdir
        self.first = start + 1 if steps > start + 1 else start
        self.last = min(self.first + count, steps) - 1
        self.active = False
        if self.first == start:
            self._open()

    def _open(self):
        start_trace(self.logdir)
        self.active = True

    def __call__(self, step, state):
        """Returns the seconds spent opening or closing the trace (writing it
        out takes a while), which are not step time. Waiting for a traced step
        to finish is step time, and is not returned."""
        opening = step + 1 == self.first
        if self.active or opening:
            jax.block_until_ready(state)  # a traced step ends before the next begins
        spent = 0.0
        if opening or (step == self.last and self.active):
            start = time.perf_counter()
            if opening:
                self._open()
            if step == self.last and self.active:
                jax.profiler.stop_trace()
                self.active = False
            spent = time.perf_counter() - start
        return spent

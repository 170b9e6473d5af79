"""Read a trace back, from any chip: the steps in it, each step's time, and
where that time went.

    profile = read_trace("runs/profile")     # the newest run under it
    profile.step_s, profile.kind_fractions()

The ops come from roofline/measured/trace_ops.py (the planes, lines and stats each
runtime writes); the kind of each from roofline/compiled/kinds.py.

A step is one execution of the step's program. The CPU says which ops belong
to which execution (run_id), the TPU too (the XLA Modules event they fall in).
A GPU does not, so its kernels are split at the host's step markers
(jax.profiler.StepTraceAnnotation: an event whose `step_num` stat numbers the
step), each kernel going to the last marker that began before it. That is
right only if each traced step finished on the device before the next was
dispatched, hence capture() and TraceWindow (roofline/measured/profile.py) drain the
device after every traced step.
"""

import bisect
import collections
import dataclasses
import statistics

from roofline.compiled.kinds import (
    KINDS,
    classify_hlo,
    hlo_from_trace,
    kind_from_category,
    kind_from_name,
)
from roofline.measured.kernel_ops import COMMAND_BUFFER, attribute, named_op
from roofline.measured.trace_ops import PS, latest_run, load_ops


def _executions(ops, markers):
    """{step number: [ops]}: each device's executions of the program, numbered.

    Where every op says which execution it belongs to, a device's executions
    are taken in time order and numbered by the step markers (or counted on from
    the first marker, if the counts differ). Otherwise each op goes to the last
    marker that began before it (see the module's docstring)."""
    steps = collections.defaultdict(list)
    by_device = collections.defaultdict(list)
    for op in ops:
        by_device[op.device].append(op)
    for (host, _), mine in by_device.items():
        marks = markers.get(host, [])
        if all(op.execution is not None for op in mine):
            groups = collections.defaultdict(list)
            for op in mine:
                groups[op.execution].append(op)
            ordered = sorted(groups.values(), key=lambda g: min(op.start_ps for op in g))
            first = marks[0][1] if marks else 0
            numbers = (
                [n for _, n in marks]
                if len(marks) == len(ordered)
                else [first + i for i in range(len(ordered))]
            )
            for number, group in zip(numbers, ordered):
                steps[number] += group
        else:
            starts = [t for t, _ in marks]
            for op in mine:
                i = bisect.bisect_right(starts, op.start_ps) - 1
                steps[marks[max(i, 0)][1] if marks else 0].append(op)
    return dict(sorted(steps.items()))


def _self_times(ops):
    """Each op's own time: its time minus what the ops nested inside it on the
    same line cover (a while loop's event encloses its body's). Nested means
    starting and ending within it: on a GPU, consecutive kernels of one stream
    overlap by up to a few microseconds in the trace's timestamps (seen on an
    H100: 0.1-4.3 us), and such a pair is one op after another, not a parent
    and its child. What the nested ops cover is their union, so no op's own
    time is negative. One number per op, picoseconds."""
    own = [op.end_ps - op.start_ps for op in ops]
    by_line, inside = collections.defaultdict(list), collections.defaultdict(list)
    for i, op in enumerate(ops):
        by_line[op.line].append(i)
    for indices in by_line.values():
        indices.sort(key=lambda i: (ops[i].start_ps, -ops[i].end_ps))
        stack = []  # each op on it holds the one above it
        for i in indices:
            while stack and ops[stack[-1]].end_ps < ops[i].end_ps:
                stack.pop()
            if stack:
                inside[stack[-1]].append(ops[i])
            stack.append(i)
    for parent, children in inside.items():
        own[parent] -= _busy(children)
    return own


def _busy(ops):
    """Picoseconds during which at least one of the ops ran."""
    busy, reach = 0, None
    for start, end in sorted((op.start_ps, op.end_ps) for op in ops):
        start = start if reach is None else max(start, reach)
        if end > start:
            busy += end - start
            reach = end
    return busy


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """One step as the trace saw it, averaged over devices. Seconds."""

    step: int
    wall_s: float  # from the step's first op starting to its last op ending
    busy_s: float  # time at least one op of the step was running
    by_kind: dict  # kind -> seconds, "idle" included; the values add up to wall_s
    by_op: dict = dataclasses.field(default_factory=dict)  # HLO op name -> seconds


def step_profile(number, ops, kind_of):
    """One step's StepProfile from its ops on every device.

    The step's wall time on a device runs from its first op's start to its last
    op's end: the device time of one step. The time before its first op, while
    the host dispatched it, is not in it: the traced steps were drained one by
    one, and in training that dispatch overlaps the previous step. Busy time is
    split between kinds in proportion to the ops' own times: several ops run at
    once (CPU threads, GPU streams) and their times add up to more than the
    wall clock. Each op's share (by_op) is split the same way, so an op's
    seconds, summed over the ops of a kind, are that kind's seconds."""
    by_device = collections.defaultdict(list)
    for op in ops:
        by_device[op.device].append(op)
    walls, busies, kinds = [], [], dict.fromkeys(KINDS, 0.0)
    by_op = collections.Counter()
    for mine in by_device.values():
        wall = max(op.end_ps for op in mine) - min(op.start_ps for op in mine)
        busy = _busy(mine)
        own = _self_times(mine)
        total_own = sum(own) or 1
        for op, t in zip(mine, own):
            kinds[kind_of(op)] += t / total_own * busy
            by_op[op.name] += t / total_own * busy
        kinds["idle"] += wall - busy
        walls.append(wall)
        busies.append(busy)
    seconds = PS / len(walls)  # picoseconds summed over devices -> seconds per device
    return StepProfile(
        step=number,
        wall_s=sum(walls) * seconds,
        busy_s=sum(busies) * seconds,
        by_kind={k: v * seconds for k, v in kinds.items()},
        by_op={name: v * seconds for name, v in by_op.items()},
    )


@dataclasses.dataclass(frozen=True)
class TraceProfile:
    """What a trace says about the steps in it."""

    run_dir: str
    platform: str  # "cpu", "gpu" or "tpu": where the ops ran
    module: str  # the step's program, e.g. jit_train_step
    devices: int
    steps: tuple  # of StepProfile
    classified_by: str  # "HLO", "the TPU's op categories" or "op names"
    other_modules: tuple = ()  # programs that also ran in the window, not counted
    buffered_kernels: float = 0.0  # kernels a step and device run from command buffers
    buffered_by: str = ""  # how they were matched to their ops

    @property
    def step_s(self):
        """Median wall time per step."""
        return statistics.median(s.wall_s for s in self.steps)

    def kind_seconds(self):
        """Mean seconds per step spent on each kind of work."""
        return {k: statistics.fmean(s.by_kind.get(k, 0.0) for s in self.steps) for k in KINDS}

    def op_seconds(self):
        """Mean seconds per step of each HLO op (by name, all its executions in
        the step), per device: its own time, nested ops' taken out, scaled as
        the kinds are (StepProfile), so the ops of a kind add up to it."""
        names = {name for s in self.steps for name in s.by_op}
        return {n: statistics.fmean(s.by_op.get(n, 0.0) for s in self.steps) for n in names}

    def kind_fractions(self):
        """Share of the mean step's wall time per kind; adds up to 1."""
        seconds = self.kind_seconds()
        total = sum(seconds.values())
        return {k: v / total for k, v in seconds.items()}


def read_trace(logdir, hlo_text=None):
    """Per-step wall time and time by kind of work, from the newest trace in logdir.

    The step's program is the one with the most op time in the window.
    hlo_text: the compiled step's HLO (`compiled.as_text()`) to classify ops
    by; if absent, or not the program that ran (it lacks the traced op names),
    a TPU's own op categories are used, else the HLO that xprof extracts from
    the trace, else kinds are guessed from op names."""
    run_dir = latest_run(logdir)
    platform, ops, markers = load_ops(run_dir)
    if not ops:
        raise ValueError(f"{run_dir}: the trace holds no XLA ops (was a step run while tracing?)")
    time_by_module = collections.Counter()
    for op in ops:
        time_by_module[op.module] += op.end_ps - op.start_ps
    module = time_by_module.most_common(1)[0][0]
    ops = [op for op in ops if op.module == module]

    op_names = _names_said(ops)
    known = classify_hlo(hlo_text) if hlo_text else {}
    categories = any(op.category for op in ops)
    if len(op_names & known.keys()) < 0.9 * len(op_names):  # not the program that ran
        hlo_text = None if categories else hlo_from_trace(run_dir, module, op_names)
        known = classify_hlo(hlo_text) if hlo_text else {}

    def kind_of(op):
        if op.name in known:
            return known[op.name]
        return kind_from_category(op.category) if op.category else kind_from_name(op.name)

    by = "HLO" if known else "the TPU's op categories" if categories else "op names"
    executions = _executions(ops, markers)
    buffered = sum(bool(COMMAND_BUFFER.match(op.name)) for op in ops)
    if buffered:
        executions = {n: _name_kernels(step_ops, hlo_text) for n, step_ops in executions.items()}
    steps = tuple(step_profile(n, step_ops, kind_of) for n, step_ops in executions.items())
    return TraceProfile(
        run_dir=run_dir,
        platform=platform,
        module=module,
        devices=len({op.device for op in ops}),
        steps=steps,
        classified_by=by,
        other_modules=tuple(sorted(m for m in time_by_module if m != module)),
        buffered_kernels=buffered / max(len(steps), 1) / max(len({op.device for op in ops}), 1),
        buffered_by="the program's schedule" if buffered and hlo_text else "kernel names",
    )


def _names_said(ops):
    """The op names the trace gives: the runtime's, or for a kernel run from a
    command buffer the op its own name says (a library's kernel says none)."""
    names = {named_op(op.kernel) if COMMAND_BUFFER.match(op.name) else op.name for op in ops}
    return names - {None}


def _name_kernels(ops, hlo_text):
    """ops, each kernel run from a command buffer renamed after its HLO op:
    found by the program's schedule (roofline/measured/kernel_ops.py), or without the
    program's HLO, by what its name says (a library's kernel keeps its own)."""
    by_device = collections.defaultdict(list)
    for op in ops:
        by_device[op.device].append(op)
    named = []
    for mine in by_device.values():
        mine.sort(key=lambda op: op.start_ps)
        found = attribute([(op.kernel, op.name) for op in mine], hlo_text) if hlo_text else {}
        for i, op in enumerate(mine):
            name = found.get(i, op.name)
            if COMMAND_BUFFER.match(name):
                name = named_op(op.kernel) or op.kernel
            named.append(dataclasses.replace(op, name=name))
    return named

"""Profile: trace a few training steps with jax.profiler, then read the trace
back without a viewer.

    state, run_dir = capture(step_fn, state, batches, "runs/profile")
    profile = read_trace("runs/profile")
    profile.step_s, profile.kind_fractions()

`capture` writes where xprof (and TensorBoard's profile plugin) look for runs,
LOGDIR/plugins/profile/<timestamp>/, two files per host:

    <host>.xplane.pb         everything, for the viewer: open it with
                             `xprof --logdir LOGDIR --port 8791`
    <host>.trace.json.gz     the timeline as Chrome trace events (JSON)

`read_trace` reads the JSON timeline. Each XLA op that ran is an event with
its start `ts` and duration `dur` in microseconds and, in `args`, the op's
name in the compiled program (`hlo_op`), the program (`hlo_module`), one id
per execution of the program (`run_id`) and, on a CPU, the device
(`device_ordinal`). One execution of the step's program is one step; the
StepTraceAnnotation markers, on the Python thread, give the step numbers.

What kind of work an op did (a matmul, elementwise arithmetic, a copy) is not
in its name: XLA names fusions after a couple of the ops inside them, and on a
CPU a matmul may run inside a `ynn_fusion` next to plain elementwise ones. So
each op is looked up in the compiled program's HLO text, which xprof's
converter extracts from the .xplane.pb; without it, the name is all we have.
"""

import contextlib
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import sys
import time

import jax

KINDS = ("matmul", "elementwise", "copy/transpose", "collective", "other", "idle")
KIND_NOTES = {
    "matmul": "dot/convolution, and fusions or library calls built around one",
    "elementwise": "fused elementwise arithmetic and reductions",
    "copy/transpose": "copies, transposes, fusions that write a new layout",
    "collective": "all-reduce, all-gather, reduce-scatter, all-to-all, permutes",
    "other": "gather/scatter, control flow, other custom calls",
    "idle": "no op running: the device waited on the host",
}


def open_command(logdir):
    """The command that opens a trace directory in the xprof viewer."""
    return f"xprof --logdir {logdir} --port 8791"


def capture(step_fn, state, batches, logdir, *, steps=3, name="train"):
    """Run one warm-up step, then `steps` steps under the profiler into logdir.

    step_fn(state, batch) -> (state, metrics), as the training loop calls it;
    batches: an iterator of batches. Each step is wrapped in a
    StepTraceAnnotation(name, step_num=i), the marker xprof's step views use.
    The device is drained (block_until_ready) before the trace opens and
    before it closes, so the window holds exactly these steps; within it the
    steps run as in training, dispatched ahead without waiting.
    Returns (state, the run directory written)."""
    state, metrics = step_fn(state, next(batches))  # compiles, if it must
    jax.block_until_ready((state, metrics))
    before = set(_run_dirs(logdir))
    jax.profiler.start_trace(logdir)
    try:
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(name, step_num=i):
                state, metrics = step_fn(state, next(batches))
        jax.block_until_ready((state, metrics))
    finally:
        jax.profiler.stop_trace()
    new = sorted(set(_run_dirs(logdir)) - before)
    return state, (new or _run_dirs(logdir))[-1]


class TraceWindow:
    """For a training loop: traces a few of its steps into logdir, the loop
    calling window(step, state) after each step. The run's first step is left
    out when there are others, as it may still be warming up."""

    def __init__(self, logdir, start, steps, count=3):
        self.logdir = logdir
        self.first = start + 1 if steps > start + 1 else start
        self.last = min(self.first + count, steps) - 1
        self.active = False
        if self.first == start:
            self._open()

    def _open(self):
        jax.profiler.start_trace(self.logdir)
        self.active = True

    def __call__(self, step, state):
        """Returns the seconds spent opening or closing the trace (writing it
        out takes a while), which are not step time."""
        spent = 0.0
        if step + 1 == self.first or (step == self.last and self.active):
            jax.block_until_ready(state)  # open or close on a quiet device
            start = time.perf_counter()
            if step + 1 == self.first:
                self._open()
            if step == self.last and self.active:
                jax.profiler.stop_trace()
                self.active = False
            spent = time.perf_counter() - start
        return spent


def _run_dirs(logdir):
    """Run directories under logdir, oldest first (their names are timestamps)."""
    pattern = os.path.join(logdir, "plugins", "profile", "*", "*.trace.json.gz")
    return sorted({os.path.dirname(p) for p in glob.glob(pattern)})


def latest_run(logdir):
    """The newest run directory of a trace directory (or logdir itself if it is one)."""
    if glob.glob(os.path.join(logdir, "*.trace.json.gz")):
        return logdir
    runs = _run_dirs(logdir)
    if not runs:
        raise FileNotFoundError(
            f"no trace under {logdir} (expected plugins/profile/*/"
            "*.trace.json.gz, as jax.profiler writes)"
        )
    return runs[-1]


# What each HLO opcode does, for the time-by-kind breakdown.
MATMUL_OPS = {"dot", "convolution", "ragged-dot"}
COPY_OPS = {"copy", "transpose", "copy-start", "copy-done"}
COLLECTIVE_PREFIXES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
OTHER_OPS = {
    "gather",
    "scatter",
    "while",
    "conditional",
    "call",
    "sort",
    "rng",
    "rng-bit-generator",
    "infeed",
    "outfeed",
    "send",
    "recv",
    "send-done",
    "recv-done",
}
# Library calls that are matmuls: cuBLAS/cuBLASLt GEMMs, cuDNN's fused attention.
MATMUL_CALL = re.compile(r"gemm|matmul|cublas|fmha|flash", re.IGNORECASE)

HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
INSTRUCTION = re.compile(
    r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\(.*?\)|\S+)\s+([a-z][\w\-]*)\((.*)$"
)
CALLS = re.compile(r"calls=%?([\w.\-]+)")
TARGET = re.compile(r'custom_call_target="([^"]*)"')


def opcode_kind(opcode, target=""):
    """The kind of one unfused HLO instruction."""
    if opcode in MATMUL_OPS or (opcode == "custom-call" and MATMUL_CALL.search(target)):
        return "matmul"
    if opcode.startswith(COLLECTIVE_PREFIXES):
        return "collective"
    if opcode in COPY_OPS:
        return "copy/transpose"
    if opcode in OTHER_OPS or opcode == "custom-call":
        return "other"
    return "elementwise"


def classify_hlo(hlo_text):
    """{instruction name: kind} for every instruction of an HLO module's text.

    A fusion takes the kind of what is inside it, in this order: a matmul (a
    dot with its prologue and epilogue fused in is a matmul), a collective, a
    copy or transpose (it writes a new layout, usually the expensive part), a
    gather or scatter ("other"); otherwise it is elementwise work."""
    computations, current = {}, None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t")):
            header = HEADER.match(line)
            current = header.group(1) if header else None
            if current:
                computations[current] = []
            continue
        found = INSTRUCTION.match(line)
        if found and current:
            name, opcode, rest = found.groups()
            calls = CALLS.search(rest)
            target = TARGET.search(rest)
            computations[current].append(
                (name, opcode, calls.group(1) if calls else None, target.group(1) if target else "")
            )

    inner = {}  # computation -> kinds of the instructions in it, nested calls included

    def kinds_inside(computation, seen=()):
        if computation not in inner:
            kinds = set()
            for _, opcode, calls, target in computations.get(computation, []):
                kinds.add(opcode_kind(opcode, target))
                if calls and calls not in seen:
                    kinds |= kinds_inside(calls, (*seen, computation))
            inner[computation] = kinds
        return inner[computation]

    kinds = {}
    for instructions in computations.values():
        for name, opcode, calls, target in instructions:
            if opcode == "fusion" and calls:
                inside = kinds_inside(calls)
                kind = next(
                    (k for k in ("matmul", "collective", "copy/transpose", "other") if k in inside),
                    "elementwise",
                )
            else:
                kind = opcode_kind(opcode, target)
            kinds[name] = kind
    return kinds


def kind_from_name(op_name):
    """A guess from an op's name alone, for traces without their HLO."""
    name = op_name.lower()
    if re.search(r"\bdot|conv|gemm|cublas|matmul", name):
        return "matmul"
    if any(p in name for p in COLLECTIVE_PREFIXES):
        return "collective"
    if "copy" in name or "transpose" in name:
        return "copy/transpose"
    if "gather" in name or "scatter" in name:
        return "other"
    return "elementwise"


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 for a while: xprof's C++ converters log every
    fallback they take there, which is noise in a table meant for a student."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def hlo_from_trace(run_dir, module, op_names=()):
    """The HLO text of `module` as recorded in the run's .xplane.pb, or None.

    xprof's converter writes one <module>(<program id>).hlo_proto.pb per
    compiled program into the run directory (as its viewer does on first
    open) and renders any of them as text. The trace names the module but not
    the program id; when several programs share the name, the one holding
    the most of the traced op names wins (the newest, on a tie)."""
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        return None
    xspaces = sorted(glob.glob(os.path.join(run_dir, "*.xplane.pb")))
    if not xspaces:
        return None
    candidates = []
    try:
        with _quiet_stderr():
            raw_to_tool_data.xspace_to_tool_names(xspaces)  # writes the *.hlo_proto.pb files
            for path in glob.glob(os.path.join(run_dir, f"{glob.escape(module)}(*).hlo_proto.pb")):
                program = os.path.basename(path).removesuffix(".hlo_proto.pb")
                text, _ = raw_to_tool_data.xspace_to_tool_data(
                    xspaces,
                    "graph_viewer",
                    {"graph_viewer_options": {"module_name": program, "type": "long_txt"}},
                )
                text = text.decode() if isinstance(text, bytes) else text
                found = len(set(op_names) & classify_hlo(text).keys())
                program_id = int(re.search(r"\((\d+)\)$", program).group(1))
                candidates.append((found, program_id, text))
    except (ValueError, RuntimeError, OSError):
        return None  # an xprof that cannot read this trace: fall back to op names
    return max(candidates)[2] if candidates else None


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """One step as the trace saw it, averaged over devices. Seconds."""

    step: int
    wall_s: float  # from the previous step's last op ending to this step's last op ending
    busy_s: float  # time at least one op of the step was running
    by_kind: dict  # kind -> seconds, "idle" included; the values add up to wall_s


@dataclasses.dataclass(frozen=True)
class TraceProfile:
    """What a trace says about the steps in it."""

    run_dir: str
    module: str  # the step's program, e.g. jit_train_step
    devices: int
    steps: tuple  # of StepProfile
    classified_by: str  # "HLO" or "op names"
    other_modules: tuple = ()  # programs that also ran in the window, not counted

    @property
    def step_s(self):
        """Median wall time per step."""
        return statistics.median(s.wall_s for s in self.steps)

    def kind_seconds(self):
        """Mean seconds per step spent on each kind of work."""
        return {k: statistics.fmean(s.by_kind.get(k, 0.0) for s in self.steps) for k in KINDS}

    def kind_fractions(self):
        """Share of the mean step's wall time per kind; adds up to 1."""
        seconds = self.kind_seconds()
        total = sum(seconds.values())
        return {k: v / total for k, v in seconds.items()}


def _load_events(run_dir):
    """Complete events ('X') of every host's trace in the run, with their process name."""
    events = []
    for host, path in enumerate(sorted(glob.glob(os.path.join(run_dir, "*.trace.json.gz")))):
        with gzip.open(path, "rt") as f:
            trace = json.load(f)["traceEvents"]
        processes = {
            e["pid"]: e["args"]["name"]
            for e in trace
            if e.get("ph") == "M" and e.get("name") == "process_name"
        }
        for e in trace:
            if e.get("ph") == "X" and "dur" in e:
                events.append({**e, "host": host, "process": processes.get(e.get("pid"), "")})
    return events


def _self_times(ops):
    """Each op's time minus the time of ops nested inside it on the same thread
    (a while loop's event encloses its body's). Returns one float per op, in us."""
    own = [op["dur"] for op in ops]
    by_thread = {}
    for i, op in enumerate(ops):
        by_thread.setdefault(op.get("tid"), []).append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (ops[i]["ts"], -ops[i]["dur"]))
        stack = []
        for i in indices:
            while stack and ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] <= ops[i]["ts"]:
                stack.pop()
            if stack:
                own[stack[-1]] -= ops[i]["dur"]
            stack.append(i)
    return own


def _busy(ops, start, end):
    """Microseconds within [start, end] during which at least one op ran."""
    spans = sorted((max(op["ts"], start), min(op["ts"] + op["dur"], end)) for op in ops)
    busy, reach = 0.0, start
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            busy += b - a
            reach = b
    return busy


def _step_program(events, run_dir):
    """(name, ops) of the program with the most op time: the training step.

    On an accelerator, only the device's own timeline counts, not the host's
    launch events; on a CPU the ops run on host threads, tagged with the
    device they ran for. Each op gets a "device" key."""
    ops = [e for e in events if "hlo_op" in e.get("args", {})]
    if not ops:
        raise ValueError(f"{run_dir}: the trace holds no XLA ops (was a step run while tracing?)")
    on_device = [e for e in ops if e["process"].startswith("/device:")]
    ops = on_device or ops
    for e in ops:
        e["device"] = (e["host"], e["pid"] if on_device else e["args"].get("device_ordinal", "0"))
    time_by_module = {}
    for e in ops:
        module = e["args"].get("hlo_module", "")
        time_by_module[module] = time_by_module.get(module, 0) + e["dur"]
    module = max(time_by_module, key=time_by_module.get)
    others = tuple(sorted(m for m in time_by_module if m != module))
    return module, [e for e in ops if e["args"].get("hlo_module", "") == module], others


def _steps(ops, events):
    """[(step number, the ops of that step)], in time order: one execution of the
    program (one `run_id`) per step, numbered by the StepTraceAnnotation markers."""
    markers = sorted(
        (e["ts"], int(e["args"]["step_num"])) for e in events if "step_num" in e.get("args", {})
    )
    executions = {}
    for e in ops:
        run = e["args"].get("run_id")
        if run is None:  # no execution ids: the last step marker before the op
            run = max((i for i, (ts, _) in enumerate(markers) if ts <= e["ts"]), default=0)
        executions.setdefault((e["host"], run), []).append(e)
    ordered = sorted(executions.values(), key=lambda step: min(op["ts"] for op in step))
    if len(markers) == len(ordered):
        numbers = [n for _, n in markers]
    else:  # a marker missing or extra: count on from the first
        numbers = [(markers[0][1] if markers else 0) + i for i in range(len(ordered))]
    return list(zip(numbers, ordered))


def _step_profile(number, step_ops, devices, previous_end, kind_of):
    """One step's StepProfile, averaged over devices. previous_end: each device's
    last op end so far, in microseconds (updated here)."""
    walls, busies, kinds = [], [], dict.fromkeys(KINDS, 0.0)
    for device in devices:
        mine = [e for e in step_ops if e["device"] == device]
        if not mine:
            continue
        end = max(e["ts"] + e["dur"] for e in mine)
        start = previous_end.get(device, min(e["ts"] for e in mine))
        previous_end[device] = end
        busy = _busy(mine, start, end)
        own = _self_times(mine)
        total_own = sum(own) or 1.0
        for e, t in zip(mine, own):
            kinds[kind_of(e["args"]["hlo_op"])] += t / total_own * busy
        kinds["idle"] += (end - start) - busy
        walls.append(end - start)
        busies.append(busy)
    n = len(walls) * 1e6  # averaged over devices, in seconds
    return StepProfile(
        step=number,
        wall_s=sum(walls) / n,
        busy_s=sum(busies) / n,
        by_kind={k: v / n for k, v in kinds.items()},
    )


def read_trace(logdir, hlo_text=None):
    """Per-step wall time and time by kind of work, from the newest trace in logdir.

    The step's program is the one with the most op time in the window. Each
    of its executions is one step; step i's wall time runs from the end of
    step i-1's last op (for the first step: its first op) to the end of its own
    last op, so a gap where the device waited for the host counts as "idle"
    in the step that waited. Busy time is split between kinds in proportion
    to the ops' own times: on a CPU several ops run at once on different
    threads and their times add up to more than the wall clock.

    hlo_text: the compiled step's HLO (`compiled.as_text()`) to classify ops
    by; if absent, or not the program that ran (it lacks the traced op names),
    the HLO is extracted from the trace by xprof, else kinds are guessed from
    op names."""
    run_dir = latest_run(logdir)
    events = _load_events(run_dir)
    module, ops, others = _step_program(events, run_dir)

    op_names = {e["args"]["hlo_op"] for e in ops}
    known = classify_hlo(hlo_text) if hlo_text else {}
    if len(op_names & known.keys()) < 0.9 * len(op_names):  # not the program that ran
        hlo_text = hlo_from_trace(run_dir, module, op_names)
        known = classify_hlo(hlo_text) if hlo_text else {}

    def kind_of(op_name):
        return known.get(op_name) or kind_from_name(op_name)

    devices = sorted({e["device"] for e in ops})
    previous_end = {}
    steps = tuple(
        _step_profile(number, step_ops, devices, previous_end, kind_of)
        for number, step_ops in _steps(ops, events)
    )
    return TraceProfile(
        run_dir=run_dir,
        module=module,
        devices=len(devices),
        steps=steps,
        classified_by="HLO" if known else "op names",
        other_modules=others,
    )

"""A compiled step predicted op by op: each op on its own roofline, the ops
run in the compiler's order, collectives and copies the compiler made
asynchronous overlapped with the ops between their start and their use.

    roofs = chip_roofs(chip, "bfloat16", precision)   # roofline/chip.py; measured on a CPU
    p = predict_ops(hlo_text, roofs, devices=8)
    p.step_s, p.seconds_by_kind, p.top(10)

Each op takes at least max(its matmul FLOPs / the matmul peak + its other
FLOPs / the vector peak, its HBM bytes / the bandwidth, its link bytes / the
link bandwidth), and is bound by whichever is largest (roofline/compiled/op_work.py
counts the work). The step is then a small simulation of one device: one
stream runs the ops in program order; an asynchronous collective runs on the
links, an asynchronous copy on the copy engines, from its start until the
first instruction that reads its result waits for it. A loop runs its body
once a trip. On a chip's datasheet roofs that is a best case with no
efficiency factor: every op at its roof, every overlap the schedule allows.
On a CPU the roofs are measured, each matmul shape's rate among them
(roofline/measured/op_table.py): a prediction, with the ceilings' best case beside it.
"""

import collections
import dataclasses
import re

from roofline.compiled.hlo import parse
from roofline.compiled.kinds import classify_hlo
from roofline.compiled.op_work import executed, program_work


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One op of the step, predicted: its work per step and its time."""

    name: str
    kind: str  # roofline.compiled.kinds.KINDS
    count: int  # executions per step
    flops: float  # per step
    bytes: float  # HBM bytes per step
    link_bytes: float  # per step
    seconds: float  # per step (count executions)
    bound: str  # "compute", "memory" or "links"
    asynchronous: bool
    source: str = ""  # the JAX operation it came from (its metadata's op_name)
    shape: str = ""  # its result's type, e.g. "bf16[4096,3072]"

    @property
    def intensity(self):
        """FLOPs per HBM byte; None for an op that moves nothing through HBM."""
        return self.flops / self.bytes if self.bytes else None


def op_time(work, kind, roofs, source="", shape=""):
    """The OpTime of one op's OpWork on these roofs."""
    times = {
        "compute": roofs.matmul_seconds(work) + work.other_flops / roofs.vector_peak,
        "memory": roofs.memory_seconds(work.hbm_bytes),
        "links": work.link_bytes / roofs.link if roofs.link else 0.0,
    }
    bound = max(times, key=times.get)
    n = work.count
    return OpTime(
        name=work.name,
        kind=kind,
        count=n,
        flops=n * work.flops,
        bytes=n * work.hbm_bytes,
        link_bytes=n * work.link_bytes,
        seconds=n * times[bound],
        bound=bound,
        asynchronous=work.asynchronous,
        source=source,
        shape=shape,
    )


@dataclasses.dataclass(frozen=True)
class OpPrediction:
    """The step predicted op by op, per device."""

    roofs: object  # roofline.chip.Roofs
    ops: tuple  # of OpTime, in program order
    step_s: float  # the simulated step
    seconds_by_kind: dict  # kind -> seconds of the step; adds up to step_s

    def top(self, n=10):
        """The n ops that cost most, by their predicted seconds per step, ops
        alike (same kind, source and result: one per layer) counted as one."""
        return sorted(group_alike(self.ops), key=lambda g: -g.seconds)[:n]

    matmul_flops: tuple = (0.0, 0.0)  # (padded to the tiles, unpadded) per step

    @property
    def totals(self):
        """(compute, memory, links) seconds: each op's FLOPs, bytes and link bytes
        on their roofs, summed as if nothing overlapped."""
        r = self.roofs
        flops = sum(o.flops for o in self.ops)
        return (
            flops / r.peak_flops,
            sum(o.bytes for o in self.ops) / r.bandwidth,
            sum(o.link_bytes for o in self.ops) / r.link if r.link else 0.0,
        )


@dataclasses.dataclass(frozen=True)
class OpGroup:
    """Ops alike, as one row: the same kind of work on the same shapes from the
    same JAX operation (one per layer, say), each op's figures summed."""

    name: str  # the first op's HLO name
    ops: tuple  # the names of all of them
    kind: str
    source: str
    shape: str
    flops: float  # per step, all of them
    bytes: float
    link_bytes: float
    seconds: float
    bound: str  # the bound of most of their time
    asynchronous: bool

    @property
    def label(self):
        more = f" (x{len(self.ops)})" if len(self.ops) > 1 else ""
        return f"{self.name}{more}"


def group_alike(ops):
    """[OpGroup] of ops alike, in the order their first op runs."""
    groups = {}
    for o in ops:
        key = (o.kind, o.source, o.shape, o.bound, o.asynchronous)
        groups.setdefault(key, []).append(o)
    found = []
    for (kind, source, shape, bound, asynchronous), alike in groups.items():
        found.append(
            OpGroup(
                name=alike[0].name,
                ops=tuple(o.name for o in alike),
                kind=kind,
                source=source,
                shape=shape,
                flops=sum(o.flops for o in alike),
                bytes=sum(o.bytes for o in alike),
                link_bytes=sum(o.link_bytes for o in alike),
                seconds=sum(o.seconds for o in alike),
                bound=bound,
                asynchronous=asynchronous,
            )
        )
    return found


PHASES = ("forward", "backward", "update", "added")


def phase(source):
    """Which part of a training step an op's source belongs to: JAX names what
    it differentiates jvp(...) and the backward pass transpose(jvp(...)); what
    is outside both is the update (the optimizer) and the step's bookkeeping;
    what the compiler added names no JAX operation."""
    if not source:
        return "added"  # by the compiler, with no JAX operation of its own: copies, DMAs
    if source.startswith("transpose(jvp"):
        return "backward"
    return "forward" if source.startswith("jvp(") else "update"


def _source(op):
    """The JAX operation an instruction came from: its op_name, without jit(...)/."""
    found = re.search(r'op_name="([^"]*)"', op.attributes.get("metadata", ""))
    name = found.group(1) if found else ""
    return re.sub(r"^jit\([^)]*\)/", "", name)


def _run(name, computations, times, trips):
    """(seconds, {kind: seconds}) of one execution of a computation on one device
    (see the module's docstring); loops inside it run their body once a trip."""
    clock, free, pending, source = 0.0, collections.Counter(), {}, {}
    by_kind = collections.Counter()
    for op in computations[name]:
        if op.opcode == "while":
            body, condition = op.calls["body"][0], op.calls["condition"][0]
            trip = max(trips.get(body, 1) // max(trips.get(name, 1), 1), 1)
            for part in (body, condition):
                seconds, kinds = _run(part, computations, times, trips)
                clock += trip * seconds
                by_kind.update({k: trip * v for k, v in kinds.items()})
            continue
        if op.opcode in ("call", "conditional"):  # a call runs its computation; a
            # conditional one of its branches, here the longest: which is unknown
            runs = [_run(c, computations, times, trips) for c in op.called if c in computations]
            if runs:
                seconds, kinds = max(runs, key=lambda r: r[0])
                clock += seconds
                by_kind.update(kinds)
            continue
        if op.opcode in ("get-tuple-element", "bitcast") and op.operands:
            source[op.name] = source.get(op.operands[0], op.operands[0])
        ready = [pending.pop(n) for n in {source.get(n, n) for n in op.operands} if n in pending]
        if ready and max(ready)[0] > clock:  # wait for what it reads
            until, kind = max(ready)
            by_kind[kind] += until - clock
            clock = until
        t = times.get(op.name)
        if t is None:
            continue
        once = t.seconds / max(t.count, 1)
        if t.asynchronous:  # runs on its engine; the stream goes on
            engine = "links" if t.link_bytes else "copies"
            free[engine] = max(clock, free[engine]) + once
            pending[op.name] = (free[engine], t.kind)
        elif t.link_bytes:  # a collective the stream waits for
            until = max(clock, free["links"]) + once
            by_kind[t.kind] += until - clock
            clock = free["links"] = until
        else:
            by_kind[t.kind] += once
            clock += once
    if pending:  # started, never read here: done by the computation's end
        until, kind = max(pending.values())
        if until > clock:
            by_kind[kind] += until - clock
            clock = until
    return clock, by_kind


def predict_ops(hlo_text, roofs, devices=1):
    """The OpPrediction of a compiled program (its HLO text) on these roofs."""
    module = parse(hlo_text)
    kinds = classify_hlo(hlo_text)
    work = program_work(hlo_text, devices, roofs.tile)
    ops = {op.name: op for _, op in module.instructions()}
    times = {
        w.name: op_time(
            w,
            kinds.get(w.name, "other"),
            roofs,
            source=_source(ops[w.name]),
            shape=re.sub(r"\{[^}]*\}", "", ops[w.name].type_text),
        )
        for w in work
    }
    ordered = executed(module)
    computations = {c.name: c.instructions for c, _ in ordered}
    trips = {c.name: n for c, n in ordered}
    step_s, by_kind = _run(module.entry.name, computations, times, trips)
    return OpPrediction(
        roofs=roofs,
        ops=tuple(times[w.name] for w in work),
        step_s=step_s,
        seconds_by_kind=dict(by_kind),
        matmul_flops=(
            sum(w.count * w.matmul_flops for w in work),
            sum(w.count * w.unpadded_matmul_flops for w in work),
        ),
    )

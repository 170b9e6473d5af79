"""What the compiler did: read a compiled program instead of trusting the source.

Takes a `jax.stages.Compiled` (or its HLO text) and returns named quantities:
memory per device, XLA's FLOP count, the collectives the partitioner inserted,
the custom kernels it chose, and the dtypes of the matmuls. Nothing here
needs the program's source, so it works the same for this machine and for a
chip compiled for deviceless (roofline/plan/targets.py).
"""

import collections
import math
import re
from typing import NamedTuple

from roofline.compiled.arrays import array_bytes, arrays
from roofline.compiled.hlo import parse
from roofline.memory import planned_bytes

# Collectives as HLO names them; the "-start" forms are their asynchronous halves.
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

# Custom calls worth a name; others (layout and sharding markers) are not kernels.
KERNELS = {
    "__cudnn$fmhaSoftmax": "cuDNN flash attention, forward",
    "__cudnn$fmhaSoftmaxBackward": "cuDNN flash attention, backward",
    "__cudnn$fmhaSoftmaxDropout": "cuDNN flash attention with dropout, forward",
    "__cublas$gemm": "cuBLAS matmul",
    "__cublas$lt$matmul": "cuBLASLt matmul",
    "tpu_custom_call": "Pallas (Mosaic) kernel on TPU",
}
NOT_KERNELS = {
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "ConcatBitcast",
    "AllocateBuffer",
    "MoveToHost",
    "MoveToDevice",
    "LayoutConstraint",
    "AsyncCollectiveStart",
    "AsyncCollectiveDone",
    "AssumeGatherIndicesInBound",
    "GatherScatterIndicesBitpacked",
}


def group_size(attributes, devices):
    """Devices in each replica group of a collective, from its HLO attributes.

    Three spellings: explicit groups {{0,1,2,3},{4,5,6,7}}; iota groups
    [2,4]<=[8] (2 groups of 4); and mesh axes, mesh['axis_0'=2,'axis_1'=4] {'axis_1'}."""
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if mesh:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", mesh.group(2)))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
    if iota:
        return int(iota.group(2))
    explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
    if explicit:
        return len(explicit.group(1).split(","))
    return devices  # replica_groups={} means every device


def link_bytes(kind, output_bytes, n):
    """Bytes one device sends over its links for one collective, on a ring of n
    devices (How to Scale Your Model, chapter 3): an all-gather passes on the
    n-1 shards it did not have; a reduce-scatter the n-1 partial sums of
    shards it does not keep; an all-reduce is both."""
    if kind == "collective-permute":
        return output_bytes  # the buffer goes to one neighbour
    if n <= 1:
        return 0
    if kind == "all-gather" or kind == "all-to-all":
        return output_bytes * (n - 1) // n
    if kind == "reduce-scatter":
        return output_bytes * (n - 1)
    if kind == "all-reduce":
        return 2 * output_bytes * (n - 1) // n
    raise ValueError(f"not a collective: {kind}")


class Collective(NamedTuple):
    count: int  # collectives executed per step (a combined one moves many arrays at once)
    output_bytes: int  # bytes of their results, per device
    bytes: int  # bytes each device sends over its links (ring model), per step


def collectives(hlo_text, devices, in_loops=None, by_group=False):
    """{kind: Collective} for the collectives in a compiled (partitioned) HLO
    module, per step: one inside a loop counts once per trip (roofline/compiled/loops.py).
    in_loops=True keeps only those inside a while loop, False those outside any.
    by_group=True: keyed by (kind, devices per group) instead, which tells the
    mesh axes apart: on data=2,fsdp=4 an all-reduce over data has groups of 2.

    A TPU's async collective fusions spread one collective over several fusions
    (its start and the pieces that overlap compute), each naming the collective
    with the same channel_id: counted once. Outside fusions each instruction is
    a collective of its own, whatever its channel: `jax.shard_map` gives every
    collective it writes one channel, and the permutes of a ring written out by
    hand (sessions/shard/collective_matmul.py) share one; each of them runs."""
    module = parse(hlo_text)
    times = module.trip_counts
    fused = fusion_bodies(module)
    done_types, found, seen = {}, [], set()
    for computation, op in module.instructions():
        kind, phase = collective_kind(op.opcode)
        if kind is None or (in_loops is not None and (computation.name in times) != in_loops):
            continue
        if phase == "-done":
            if op.operands:  # the start it completes
                done_types[op.operands[0]] = op.type_text
            continue
        repeat = times.get(computation.name, 1)
        channel = op.attributes.get("channel_id")
        if channel and computation.name in fused:
            if (kind, channel, repeat) in seen:
                continue
            seen.add((kind, channel, repeat))
        n = group_size(op.attribute_text, devices)
        found.append((op.name, kind, phase, op.type_text, n, repeat))
    totals = collections.defaultdict(lambda: [0, 0, 0])
    for name, kind, phase, type_text, n, repeat in found:
        # An async start's own type holds its operands too; its -done holds the result.
        out = array_bytes(done_types.get(name, type_text) if phase else type_text)
        t = totals[(kind, n) if by_group else kind]
        t[0] += repeat
        t[1] += repeat * out
        t[2] += repeat * link_bytes(kind, out, n)
    return {kind: Collective(*t) for kind, t in sorted(totals.items())}


def fusion_bodies(module):
    """Names of the computations that fusion instructions call."""
    return {name for _, op in module.instructions() if op.opcode == "fusion" for name in op.called}


def collective_kind(opcode):
    """(collective kind, "-start", "-done" or "") of an opcode, or (None, "")."""
    for phase in ("-start", "-done", ""):
        if opcode.endswith(phase) and opcode.removesuffix(phase) in COLLECTIVES:
            return opcode.removesuffix(phase), phase
    return None, ""


def collectives_summary(found):
    """{kind: Collective} as JSON-ready values."""
    return {kind: c._asdict() for kind, c in found.items()}


def collectives_table(programs, devices):
    """Lines comparing the collectives of compiled programs of one step, side by side:
    programs {label: jax.stages.Compiled or its HLO text}, e.g. {"manual": ..., "auto":
    ...}. One row per kind: ops per step and MiB each device sends (ring model)."""
    found = {
        label: collectives(p if isinstance(p, str) else p.as_text(), devices)
        for label, p in programs.items()
    }
    kinds = sorted({kind for f in found.values() for kind in f})
    lines = [f"{'collective':<20}" + "".join(f"{label:>23}" for label in found)]
    for kind in kinds:
        row = f"{kind:<20}"
        for f in found.values():
            c = f.get(kind, Collective(0, 0, 0))
            row += f"{c.count:>7} ops {c.bytes / 2**20:>7.3f} MiB"
        lines.append(row)
    return lines


def kernels(hlo_text):
    """{custom call target: count}, leaving out sharding and layout markers."""
    targets = (op.target for _, op in parse(hlo_text).instructions() if op.target)
    return dict(collections.Counter(t for t in targets if t not in NOT_KERNELS))


def kernel_lines(found):
    """One line per custom kernel: its name, what it is, how many calls."""
    return [
        f"{target} x{n}: {KERNELS.get(target, 'custom call')}"
        for target, n in sorted(found.items())
    ]


_MATMUL_CALLS = ("__cublas$gemm", "__cublas$lt$matmul")


def matmul_dtypes(hlo_text):
    """{(lhs dtype, rhs dtype, result dtype): count} over the matmuls of the
    program: dot and convolution instructions, fused or not, and cuBLAS calls.
    The precision the matmuls really run in, whatever the source asked for.

    Operands are named, not typed, in a compiled module's text, so every
    operand's type is looked up by its name (unique within the module)."""
    module = parse(hlo_text)
    types = module.types
    found = collections.Counter()
    for _, op in module.instructions():
        is_matmul = op.opcode in ("dot", "convolution") or op.target in _MATMUL_CALLS
        if is_matmul and len(op.operands) >= 2 and op.dtype:
            lhs, rhs = (arrays(types.get(name, "")) for name in op.operands[:2])
            found[(lhs[0].dtype if lhs else "?", rhs[0].dtype if rhs else "?", op.dtype)] += 1
    return dict(found)


def matmul_dtypes_summary(found):
    """{(lhs, rhs, out): count} as JSON-ready values: {"lhs,rhs->out": count}."""
    return {f"{a},{b}->{c}": n for (a, b, c), n in found.items()}


def matmul_precision(hlo_text):
    """'highest' if any matmul asks for full float32 (jax.default_matmul_precision
    or precision=HIGHEST), else 'default': what the chip's peak depends on.
    XLA writes it as an attribute, or in a library call's backend config."""
    for _, op in parse(hlo_text).instructions():
        if op.attributes.get("operand_precision", "").startswith("{highest"):
            return "highest"
        if '"operand_precision":["HIGHEST"' in op.attributes.get("backend_config", ""):
            return "highest"
    return "default"


def cost_analysis(stage):
    """XLA's cost analysis of a lowered or compiled program (`jax.stages.Lowered`
    or `Compiled`) as one dict ("flops", "bytes accessed", ...), or None where
    the backend gives none (NVIDIA's deviceless compiler) or raises.

    `stage.cost_analysis()` returns a dict, or in some jax versions a list with
    one dict per program (the first is the step's), or None: this is the one
    place that unwraps it. What a `cost_analysis()` call already returned is
    unwrapped the same way."""
    cost = stage
    if hasattr(stage, "cost_analysis"):
        try:
            cost = stage.cost_analysis()
        except Exception:  # some backends raise instead of returning nothing
            return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return dict(cost) if cost else None


def xla_flops(compiled):
    """FLOPs per device from XLA's cost analysis of the compiled program, or None
    where the target's compiler gives no count (NVIDIA, deviceless)."""
    cost = cost_analysis(compiled)
    return float(cost["flops"]) if cost and "flops" in cost else None


def windowed_loops(hlo_text):
    """How many collective matmuls (windowed einsums) the compiler built: loops
    that multiply one shard while passing the next around the ring. XLA's cost
    analysis counts a loop's body once, not once per trip, so their FLOPs are
    mostly missing from its count (roofline/README.md)."""
    return sum(
        1
        for _, op in parse(hlo_text).instructions()
        if op.opcode == "while" and "windowed_dot_general" in "".join(op.calls.get("body", ()))
    )


class ProgramFacts(NamedTuple):
    """What the compiler did to one step, per device."""

    memory_bytes: int  # arguments + outputs + temporaries - donated (XLA's plan)
    xla_flops: float | None  # XLA's count, or None
    collectives: dict  # kind -> Collective
    kernels: dict  # custom call target -> count
    matmul_dtypes: dict  # (lhs, rhs, out) -> count
    matmul_precision: str  # "default" or "highest"
    windowed_loops: int = 0  # collective-matmul loops, whose FLOPs XLA counts once


def read_program(compiled, devices):
    """ProgramFacts of a compiled program partitioned over `devices`."""
    text = compiled.as_text()
    return ProgramFacts(
        memory_bytes=planned_bytes(compiled.memory_analysis()),
        xla_flops=xla_flops(compiled),
        collectives=collectives(text, devices),
        kernels=kernels(text),
        matmul_dtypes=matmul_dtypes(text),
        matmul_precision=matmul_precision(text),
        windowed_loops=windowed_loops(text),
    )

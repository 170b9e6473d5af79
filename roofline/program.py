"""What the compiler did: read a compiled program instead of trusting the source.

Takes a `jax.stages.Compiled` (or its HLO text) and returns named quantities:
memory per device, XLA's FLOP count, the collectives the partitioner inserted,
the custom kernels it chose, and the dtypes of the matmuls. Nothing here
needs the program's source, so it works the same for this machine and for a
chip compiled for deviceless (roofline/targets.py).
"""

import collections
import math
import re
from typing import NamedTuple

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

BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}

_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.+?) (" + "|".join(COLLECTIVES) + r")(-start|-done)?\((.*)$"
)


def array_bytes(type_text):
    """Bytes of every array in an HLO type: 'bf16[96,768]{1,0}' or a tuple of them."""
    total = 0
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype in BYTES:
            total += BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


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


def computations(hlo_text):
    """{computation name: its instruction lines} of an HLO module's text.

    A computation starts at an unindented header, `%name (params) -> type {`,
    and runs to the next one. (Its closing brace is no marker: an instruction's
    attributes may span lines that start with one.)"""
    found, name = {}, None
    for line in hlo_text.splitlines():
        header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+) \(.*\) -> .*\{\s*$", line)
        if header:
            name = header.group(1)
            found[name] = []
        elif name is not None:
            found[name].append(line)
    return found


_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")


def trip_counts(hlo_text):
    """{computation name: how many times it runs per step}, for the bodies of
    `while` loops (and loops inside them) and everything they call (fusions,
    async collectives); computations not listed run once, outside any loop.

    A loop's trip count is read from its condition, `counter < N` with N a
    constant, the form XLA gives the loops it builds itself (collective
    matmuls, scans, decode's chunk of steps); a loop whose count cannot be
    read (a fori_loop over a traced count) counts once: its collectives are
    per trip."""
    comps = computations(hlo_text)
    loops = []  # (computation holding the loop, body, condition)
    for holder, lines in comps.items():
        for line in lines:
            m = re.search(r" while\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)", line)
            if m:
                loops.append((holder, m.group(2), m.group(1)))
    called = {name: set(_CALLS.findall("\n".join(lines))) for name, lines in comps.items()}

    def trips(condition):
        text = "\n".join(comps.get(condition, []))
        limit = re.search(r"constant\((\d+)\)", text)
        return int(limit.group(1)) if limit and "direction=LT" in text else 1

    times = {}
    for _ in range(4):  # loops nested up to four deep
        for holder, body, condition in loops:
            times[body] = times.get(holder, 1) * trips(condition)
    for body in sorted(times, key=times.get):  # inner loops last: they run more often
        todo = list(called.get(body, ()))
        while todo:
            name = todo.pop()
            if name in comps and times.get(name, 0) < times[body]:
                times[name] = times[body]
                todo += called.get(name, ())
    return times


class Collective(NamedTuple):
    count: int  # collectives executed per step (a combined one moves many arrays at once)
    output_bytes: int  # bytes of their results, per device
    bytes: int  # bytes each device sends over its links (ring model), per step


def collectives(hlo_text, devices, in_loops=None):
    """{kind: Collective} for the collectives in a compiled (partitioned) HLO
    module, per step: one inside a loop counts once per trip (trip_counts).
    in_loops=True keeps only those inside a while loop, False those outside any.

    A TPU's async collective fusions spread one collective over several fusions
    (its start and the pieces that overlap compute), each naming the collective
    with the same channel_id: counted once."""
    times = trip_counts(hlo_text)
    done_types, found, seen = {}, [], set()
    for computation, lines in computations(hlo_text).items() or [(None, hlo_text.splitlines())]:
        if in_loops is not None and (computation in times) != in_loops:
            continue
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            name, type_text, kind, phase, rest = m.groups()
            if phase == "-done":
                start = re.match(r"\s*%?([\w.\-]+)", rest)
                done_types[start.group(1)] = type_text
                continue
            repeat = times.get(computation, 1)
            channel = re.search(r"channel_id=(\d+)", rest)
            if channel:
                if (kind, channel.group(1), repeat) in seen:
                    continue
                seen.add((kind, channel.group(1), repeat))
            found.append((name, kind, phase, type_text, group_size(rest, devices), repeat))
    totals = collections.defaultdict(lambda: [0, 0, 0])
    for name, kind, phase, type_text, n, repeat in found:
        # An async start's own type holds its operands too; its -done holds the result.
        out = array_bytes(done_types.get(name, type_text) if phase else type_text)
        t = totals[kind]
        t[0] += repeat
        t[1] += repeat * out
        t[2] += repeat * link_bytes(kind, out, n)
    return {kind: Collective(*t) for kind, t in sorted(totals.items())}


def kernels(hlo_text):
    """{custom call target: count}, leaving out sharding and layout markers."""
    targets = re.findall(r'custom_call_target="([^"]+)"', hlo_text)
    return dict(collections.Counter(t for t in targets if t not in NOT_KERNELS))


def kernel_lines(found):
    """One line per custom kernel: its name, what it is, how many calls."""
    return [
        f"{target} x{n}: {KERNELS.get(target, 'custom call')}"
        for target, n in sorted(found.items())
    ]


_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = \(?(\w+)\[[^=]*?\s([\w\-$]+)\((.*)$")
_MATMUL_CALLS = ("__cublas$gemm", "__cublas$lt$matmul")


def matmul_dtypes(hlo_text):
    """{(lhs dtype, rhs dtype, result dtype): count} over the matmuls of the
    program: dot and convolution instructions, fused or not, and cuBLAS calls.
    The precision the matmuls really run in, whatever the source asked for.

    Operands are named, not typed, in a compiled module's text, so every
    instruction's type is looked up by its name (unique within the module)."""
    types, matmuls = {}, []
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if not m:
            continue
        name, dtype, op, rest = m.groups()
        types[name] = dtype
        is_library = op == "custom-call" and any(f'"{t}"' in rest for t in _MATMUL_CALLS)
        if op in ("dot", "convolution") or is_library:
            operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])[:2]
            matmuls.append((operands, dtype))
    for header in re.findall(r"\(([^()]*)\) -> ", hlo_text):  # computation parameters
        for name, dtype in re.findall(r"([\w.\-]+): \(?(\w+)\[", header):
            types.setdefault(name, dtype)
    found = collections.Counter()
    for operands, out in matmuls:
        if len(operands) == 2:
            found[(types.get(operands[0], "?"), types.get(operands[1], "?"), out)] += 1
    return dict(found)


def matmul_precision(hlo_text):
    """'highest' if any matmul asks for full float32 (jax.default_matmul_precision
    or precision=HIGHEST), else 'default': what the chip's peak depends on."""
    if re.search(r"operand_precision=\{highest|\"operand_precision\":\[\"HIGHEST", hlo_text):
        return "highest"
    return "default"


def xla_flops(compiled):
    """FLOPs per device from XLA's cost analysis of the compiled program, or None
    where the target's compiler gives no count (NVIDIA, deviceless)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def windowed_loops(hlo_text):
    """How many collective matmuls (windowed einsums) the compiler built: loops
    that multiply one shard while passing the next around the ring. XLA's cost
    analysis counts a loop's body once, not once per trip, so their FLOPs are
    mostly missing from its count (roofline/README.md)."""
    return len(re.findall(r" while\(.*body=%?[\w.\-]*windowed_dot_general", hlo_text))


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

"""What each op of a compiled program does: its FLOPs, the bytes it moves
through HBM, the bytes it sends over the links. No chip's speed here: the
per-op prediction (roofline/compiled/op_roofline.py) divides these by a chip's roofs.

    for work in program_work(hlo_text, devices, tile=(8, 128, 128)):
        work.name, work.count, work.matmul_flops, work.hbm_bytes, work.link_bytes

An op is an instruction the program executes: one of ENTRY, or of a loop's
body run once a trip (roofline/compiled/loops.py). A fusion is one op: its FLOPs are
those of the instructions inside it, its bytes what it reads and writes
(roofline/README.md, "Per op"):

    FLOPs         its matmuls', padded to the chip's tiles, and the rest
                  (roofline/compiled/op_flops.py)
    HBM bytes     each operand once and the result, at their padded layout
                  (a TPU's T(8,128) tiles); arrays in on-chip memory (S(1):
                  a TPU's VMEM) are not HBM traffic; a fusion that only
                  slices an operand reads the slice; an in-place update
                  writes the update only
    link bytes    what one device sends for a collective, on a ring
                  (roofline.compiled.program.link_bytes)
"""

import dataclasses
import functools
import math
import re

from roofline.compiled.arrays import BYTES, arrays
from roofline.compiled.hlo import parse
from roofline.compiled.op_flops import NO_OP, FlopCounter
from roofline.compiled.program import collective_kind, group_size, link_bytes

# Markers the compiler writes as custom calls; no kernel runs for them.
MARKERS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "AllocateBuffer"}
MARKERS |= {"LayoutConstraint", "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked"}
MARKERS |= {"ConcatBitcast", "AsyncCollectiveDone"}
SLICES = {"slice", "dynamic-slice", "gather"}


@dataclasses.dataclass(frozen=True)
class OpWork:
    """What one op does each time it runs, and how often it runs per step."""

    name: str
    opcode: str  # "fusion", "dot", "all-gather-start", "custom-call", ...
    computation: str  # the computation it runs in: ENTRY's, or a loop body
    count: int  # executions per step
    matmul_flops: float  # on the matmul units, padded to their tiles
    other_flops: float  # elementwise arithmetic and reductions
    hbm_bytes: float  # read + written
    link_bytes: float  # sent over the links (collectives)
    asynchronous: bool  # started here, waited for by a later instruction
    unpadded_matmul_flops: float = 0.0  # the same matmuls without the tiles' padding
    matmul_shapes: tuple = ()  # (batch, M, N, K, dtype) of each of its matmuls

    @property
    def flops(self):
        return self.matmul_flops + self.other_flops


_LAYOUT = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\](\{[^}]*\})?")


def _stored(dtype, dims, layout):
    """(bytes as laid out, in HBM?) of one array: its first tile T(a,b) pads the
    most minor dimensions (minor_to_major order); S(n) with n > 0 is another
    memory space (a TPU's VMEM), not HBM."""
    shape = [int(d.lstrip("<=")) for d in dims.split(",") if d]
    width = BYTES.get(dtype, 0)
    layout = layout or ""
    space = re.search(r"S\((\d+)\)", layout)
    in_hbm = not space or space.group(1) == "0"
    tile = re.search(r":[^T]*T\(([\d,]+)\)", layout)
    order = re.match(r"\{([\d,]*)", layout)
    if tile and order and order.group(1):
        minor_to_major = [int(i) for i in order.group(1).split(",")]
        sizes = [int(t) for t in tile.group(1).split(",")]
        for t, dim in zip(reversed(sizes), minor_to_major):
            shape[dim] = -(-shape[dim] // t) * t
        if len(sizes) > len(shape):  # a scalar or vector padded to a whole tile
            return width * math.prod(sizes), in_hbm
    return width * math.prod(shape), in_hbm


def hbm_bytes(type_text):
    """Bytes in HBM of every array of an HLO type, at their padded layout."""
    total = 0
    for dtype, dims, layout in _LAYOUT.findall(type_text):
        size, in_hbm = _stored(dtype, dims, layout)
        total += size if in_hbm else 0
    return total


def _fusion_reads(module, op, types):
    """HBM bytes a fusion reads: each operand once, but of an operand the fused
    code only slices, the slices; of the buffer an in-place update writes into
    (a dynamic-update-slice at the root), nothing: it writes the update only."""
    body = module.computations.get(op.calls["calls"][0])
    if body is None:
        return sum(hbm_bytes(types.get(name, "")) for name in set(op.operands))
    users = {}
    for inner in body.instructions:
        for name in inner.operands:
            users.setdefault(name, []).append(inner)
    parameters = {int(i.literal): i for i in body.instructions if i.opcode == "parameter"}
    root = body.root
    in_place = (
        root.operands[0] if root is not None and root.opcode == "dynamic-update-slice" else None
    )
    total, seen = 0, set()
    for index, name in enumerate(op.operands):
        parameter = parameters.get(index)
        if name in seen and parameter is None:
            continue
        seen.add(name)
        full = hbm_bytes(types.get(name, ""))
        if parameter is None:
            total += full
            continue
        mine = users.get(parameter.name, [])
        if parameter.name == in_place:
            continue
        if mine and all(u.opcode in SLICES for u in mine):
            sliced = sum(BYTES.get(u.dtype, 0) * math.prod(u.shape or ()) for u in mine)
            total += min(full, sliced)
        else:
            total += full
    return total


def _written(module, op):
    """HBM bytes a fusion writes: its result, or an in-place update's update."""
    body = module.computations.get(op.calls["calls"][0]) if op.calls.get("calls") else None
    root = body.root if body else None
    if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
        update = arrays(module.types.get(root.operands[1], ""))
        return sum(a.bytes for a in update)
    return hbm_bytes(op.type_text)


def _async_start(module, op):
    """Whether an op starts work that a later instruction waits for."""
    if op.opcode.endswith("-start"):
        return True
    if op.opcode == "fusion" and op.calls.get("calls"):
        body = module.computations.get(op.calls["calls"][0])
        return any(i.target == "AsyncCollectiveStart" for i in body.instructions) if body else False
    return False


def _links(module, op, devices, seen, count):
    """Bytes one device sends for the collectives an op runs (fused ones included).
    A TPU spreads one collective over several fusions, each naming it with the
    same channel_id (roofline.compiled.program.collectives): counted at the first; the
    (kind, channel, executions per step) already counted are in `seen`. An op that
    is itself a collective counts: `jax.shard_map` gives all its collectives one channel."""
    candidates = [op]
    for called in op.calls.get("calls", ()):
        body = module.computations.get(called)
        candidates += list(body.instructions) if body else []
    total = 0
    for c in candidates:
        kind, phase = collective_kind(c.opcode)
        if kind is None or phase == "-done":
            continue
        channel = c.attributes.get("channel_id")
        if channel and c is not op:
            if (kind, channel, count) in seen:
                continue
            seen.add((kind, channel, count))
        found = arrays(c.type_text)
        if phase == "-start":  # (operands, results) or (operand, result, contexts)
            found = found[len(found) // 2 :] if kind != "collective-permute" else found[1:2]
        out = sum(a.bytes for a in found)
        total += link_bytes(kind, out, group_size(c.attribute_text, devices))
    return total


def op_work(module, computation, op, count, devices, counter, channels):
    """The OpWork of one executed instruction, or None if it does no work of its own.
    counter: the module's op_flops.FlopCounter (its FLOPs per computation, counted once);
    channels: the collective channels already counted (a set, added to)."""
    if op.opcode in NO_OP or op.opcode.endswith("-done") or op.target in MARKERS:
        return None
    types = module.types
    flops = counter.instruction(op)
    if op.opcode == "fusion" and op.calls.get("calls"):
        moved = _fusion_reads(module, op, types) + _written(module, op)
    elif op.opcode == "copy-start":  # (destination, source, context): one side may be on chip
        moved = hbm_bytes(op.type_text)
    elif op.opcode == "slice-start":  # ((operand), slice, context): it reads the slice
        found = _LAYOUT.findall(op.type_text)
        moved = _stored(*found[1])[0] if len(found) > 1 else 0
    elif op.opcode.endswith("-start"):  # (operands, results): each array once
        moved = hbm_bytes(op.type_text)
    else:
        reads = sum(hbm_bytes(types.get(name, "")) for name in set(op.operands))
        moved = reads + hbm_bytes(op.type_text)
    return OpWork(
        name=op.name,
        opcode=op.opcode,
        computation=computation.name,
        count=count,
        matmul_flops=flops.matmul,
        other_flops=flops.other,
        hbm_bytes=moved,
        link_bytes=_links(module, op, devices, channels, count),
        asynchronous=_async_start(module, op),
        unpadded_matmul_flops=flops.unpadded,
        matmul_shapes=flops.shapes,
    )


def executed(module):
    """(computation, how often it runs per step) of each computation whose
    instructions are executed as ops: ENTRY, loop bodies and conditions,
    branches, called computations; not fusion bodies or reducers."""
    entry = module.entry
    if entry is None:
        return []
    times = module.trip_counts
    found, todo = {}, [entry.name]
    while todo:
        name = todo.pop()
        if name in found or name not in module.computations:
            continue
        found[name] = times.get(name, 1)
        for op in module.computations[name].instructions:
            if op.opcode in ("while", "conditional", "call"):
                todo += list(op.called)
    return [(module.computations[name], n) for name, n in found.items()]


def matmul_shapes(hlo_text):
    """Every distinct (batch, M, N, K, dtype) of the matmuls a compiled program runs."""
    return sorted({s for w in program_work(hlo_text) for s in w.matmul_shapes})


@functools.lru_cache(maxsize=8)
def program_work(hlo_text, devices=1, tile=None):
    """(OpWork, ...) of every op a compiled program executes, in program order.
    Read once per program and arguments (cached): a profile reads its shapes,
    then predicts the step twice, the best case and the prediction."""
    module = parse(hlo_text)
    counter = FlopCounter(module, tile)
    work, channels = [], set()
    for computation, count in executed(module):
        for op in computation.instructions:
            found = op_work(module, computation, op, count, devices, counter, channels)
            if found is not None:
                work.append(found)
    return tuple(work)

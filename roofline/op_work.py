"""What each op of a compiled program does: its FLOPs, the bytes it moves
through HBM, the bytes it sends over the links. No chip's speed here: the
per-op prediction (roofline/op_roofline.py) divides these by a chip's roofs.

    for work in program_work(hlo_text, devices, tile=(8, 128, 128)):
        work.name, work.count, work.matmul_flops, work.hbm_bytes, work.link_bytes

An op is an instruction the program executes: one of ENTRY, or of a loop's
body run once a trip (hlo trip_counts). A fusion is one op: its FLOPs are
those of the instructions inside it, its bytes what it reads and writes
(roofline/README.md, "Per op"):

    matmul FLOPs  dot: 2·M·N·K; convolution: 2 per valid (output, window) pair,
                  as XLA's HloCostAnalysis counts them; an attention kernel
                  (cuDNN, splash): its matmuls from its operands' shapes.
                  `tile` pads M, N and K up to what the matmul units work on.
    other FLOPs   one per element of each arithmetic instruction; a reduction
                  one per element it reads
    HBM bytes     each operand once and the result, at their padded layout
                  (a TPU's T(8,128) tiles); arrays in on-chip memory (S(1):
                  a TPU's VMEM) are not HBM traffic; a fusion that only
                  slices an operand reads the slice; an in-place update
                  writes the update only
    link bytes    what one device sends for a collective, on a ring
                  (roofline.program.link_bytes)
"""

import dataclasses
import json
import math
import re

from roofline.hlo import BYTES, arrays, parse
from roofline.program import collective_kind, group_size, link_bytes

# Instructions that are no work of their own: names, views, containers, markers.
NO_OP = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while"}
NO_OP |= {"conditional", "call", "after-all", "partition-id", "replica-id", "iota"}
NO_OP |= {"opt-barrier", "optimization-barrier", "add-dependency", "domain"}
# Markers the compiler writes as custom calls; no kernel runs for them.
MARKERS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "AllocateBuffer"}
MARKERS |= {"LayoutConstraint", "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked"}
MARKERS |= {"ConcatBitcast", "AsyncCollectiveDone"}
# Instructions inside a fusion that move or view data and do no arithmetic.
NO_ARITHMETIC = NO_OP | {"broadcast", "reshape", "transpose", "copy", "slice", "concatenate"}
NO_ARITHMETIC |= {"pad", "dynamic-slice", "dynamic-update-slice", "gather", "scatter"}
NO_ARITHMETIC |= {"convert", "reverse", "custom-call", "fusion", "bitcast-convert"}
SLICES = {"slice", "dynamic-slice", "gather"}

# Attention kernels: (what they compute, matmuls of the [Sq, Sk] score size each runs).
# Flash kernels recompute the scores in the backward pass: cuDNN's backward runs
# Q·K^T again, dP = dO·V^T, then dV, dQ and dK (5); splash splits it in two
# kernels, dq (Q·K^T, dP, dQ: 3) and dkv (Q·K^T, dP, dV, dK: 4).
ATTENTION_KERNELS = {
    "__cudnn$fmhaSoftmax": 2,
    "__cudnn$fmhaSoftmaxBackward": 5,
    "splash_mha_fwd": 2,
    "splash_mha_dq": 3,
    "splash_mha_dkv": 4,
}


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


def _ints(attributes, key):
    value = attributes.get(key, "{}")
    return [int(x) for x in re.findall(r"\d+", value)]


def _padded(n, tile):
    return -(-n // tile) * tile if tile else n


def matmul_flops(batch, m, n, k, tile=None):
    """2·batch·M·N·K, with M, N and K padded up to the tile (m, n, k) if given."""
    tm, tn, tk = tile or (1, 1, 1)
    return 2 * batch * _padded(m, tm) * _padded(n, tn) * _padded(k, tk)


def dot_dims(lhs, rhs, attributes):
    """(batch, M, N, K) of a dot from its operands' shapes and dimension numbers."""
    lc, rc = _ints(attributes, "lhs_contracting_dims"), _ints(attributes, "rhs_contracting_dims")
    lb, rb = _ints(attributes, "lhs_batch_dims"), _ints(attributes, "rhs_batch_dims")
    batch = math.prod(lhs[i] for i in lb)
    k = math.prod(lhs[i] for i in lc)
    m = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)
    n = math.prod(d for i, d in enumerate(rhs) if i not in rc and i not in rb)
    return batch, m, n, k


def _window(attributes):
    """{field: [per spatial dim]} of a convolution's window attribute."""
    text = attributes.get("window", "{}").strip("{}")
    found = {}
    for part in text.split():
        key, _, value = part.partition("=")
        found[key] = value.split("x")
    return found


def conv_dims(lhs, rhs, out, attributes):
    """(batch, M, N, K) of a convolution: M the output positions, N its output
    features, K what each output sums over. K counts only the valid (not
    padded) window positions, as XLA's HloCostAnalysis does: a TPU writes a
    batched matmul as a convolution whose padded window picks one slice."""
    labels = attributes.get("dim_labels", "")
    found = re.match(r"(\w+)_(\w+)->(\w+)", labels)
    if not found:
        return 1, math.prod(out), 1, 1
    lhs_l, rhs_l, out_l = found.groups()
    window = _window(attributes)
    spatial = sorted(c for c in lhs_l if c.isdigit())
    pairs_per_output = 1
    for s in spatial:
        j = int(s)
        size_in, size_out = lhs[lhs_l.index(s)], out[out_l.index(s)]
        size_w = int(window.get("size", ["1"] * len(spatial))[j])
        lo = int(window["pad"][j].split("_")[0]) if "pad" in window else 0
        stride = int(window["stride"][j]) if "stride" in window else 1
        valid = sum(
            1 for o in range(size_out) for w in range(size_w) if 0 <= o * stride + w - lo < size_in
        )
        pairs_per_output *= valid / size_out
    groups = int(attributes.get("feature_group_count", "1"))
    batch_groups = int(attributes.get("batch_group_count", "1"))
    n = rhs[rhs_l.index("o")] // batch_groups
    k = rhs[rhs_l.index("i")] * pairs_per_output
    m = math.prod(out) // rhs[rhs_l.index("o")] * batch_groups * groups
    return 1, m, n // groups if groups > 1 else n, k


def _attention_flops(op, types, tile):
    """FLOPs of an attention kernel: its matmuls, each 2·B·H·Sq·Sk·D, from q
    (operand 0 of cuDNN's, the first [B, H, S, D] operand of splash's) and k.
    A causal kernel skips the masked half of the scores."""
    key = op.target if op.target in ATTENTION_KERNELS else None
    if key is None:
        key = next((k for k in ATTENTION_KERNELS if op.name.startswith(k)), None)
    if key is None:
        return None
    shapes = [arrays(types.get(name, "")) for name in op.operands]
    four = [a[0].shape for a in shapes if a and len(a[0].shape) == 4 and a[0].dtype != "s8"]
    if len(four) < 2:
        return None
    q, k = four[0], four[1]
    config = op.attributes.get("backend_config", "")
    if key.startswith("__cudnn"):  # q, k as [B, S, H, D]; the config says so
        dims = json.loads(config).get("cudnn_fmha_backend_config", {}) if config else {}
        causal = dims.get("mask_type") == "CAUSAL"
        b, sq, h, d = q
        sk = k[1]
    else:  # splash: [B, H, S, D], and our model's mask is causal
        causal = True
        b, h, sq, d = q
        sk = k[2]
    one = matmul_flops(b * h, sq, sk, d, tile)
    exact = 2 * b * h * sq * sk * d
    share = 0.5 if causal else 1.0
    return ATTENTION_KERNELS[key] * one * share, ATTENTION_KERNELS[key] * exact * share


class _Counter:
    """FLOPs of the instructions inside computations, each computation counted once."""

    def __init__(self, module, tile):
        self.module, self.tile, self.types = module, tile, module.types
        self.cache = {}

    def shape(self, name):
        found = arrays(self.types.get(name, ""))
        return found[0].shape if found else ()

    def instruction(self, op):
        """(matmul FLOPs, unpadded, other FLOPs) of one instruction, with what it calls."""
        if op.opcode in ("dot", "convolution") and len(op.operands) >= 2 and op.shape is not None:
            lhs, rhs = self.shape(op.operands[0]), self.shape(op.operands[1])
            if op.opcode == "dot":
                dims = dot_dims(lhs, rhs, op.attributes)
            else:
                dims = conv_dims(lhs, rhs, op.shape, op.attributes)
            return matmul_flops(*dims, self.tile), matmul_flops(*dims), 0.0
        if op.opcode == "custom-call":
            attention = _attention_flops(op, self.types, self.tile)
            if attention:
                return attention[0], attention[1], 0.0
            if op.target in ("__cublas$gemm", "__cublas$lt$matmul") and len(op.operands) >= 2:
                config = json.loads(op.attributes.get("backend_config", "{}") or "{}")
                numbers = config.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
                attributes = {  # as a dot's attributes: lhs_contracting_dims={1}
                    key.replace("dimensions", "dims"): "{" + ",".join(value) + "}"
                    for key, value in numbers.items()
                }
                lhs, rhs = self.shape(op.operands[0]), self.shape(op.operands[1])
                dims = dot_dims(lhs, rhs, attributes)
                return matmul_flops(*dims, self.tile), matmul_flops(*dims), 0.0
        inside = [0.0, 0.0, 0.0]
        for called in op.calls.get("calls", ()):
            for i, v in enumerate(self.computation(called)):
                inside[i] += v
        if (
            op.opcode in NO_ARITHMETIC
            or collective_kind(op.opcode)[0]
            or op.opcode.endswith(("-start", "-done"))
        ):
            return tuple(inside)
        if op.opcode in ("reduce", "reduce-window") and op.operands:
            elements = math.prod(self.shape(op.operands[0]))
        else:
            elements = sum(a.size for a in op.arrays)
        return inside[0], inside[1], inside[2] + elements

    def computation(self, name):
        if name not in self.cache:
            self.cache[name] = (0.0, 0.0, 0.0)  # a cycle counts nothing
            total = [0.0, 0.0, 0.0]
            found = self.module.computations.get(name)
            for op in found.instructions if found else ():
                for i, v in enumerate(self.instruction(op)):
                    total[i] += v
            self.cache[name] = tuple(total)
        return self.cache[name]


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
    same channel_id (roofline.program.collectives): counted at the first; the
    (kind, channel, executions per step) already counted are in `seen`."""
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
        if channel:
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
    counter: the module's _Counter (its FLOPs per computation, counted once);
    channels: the collective channels already counted (a set, added to)."""
    if op.opcode in NO_OP or op.opcode.endswith("-done") or op.target in MARKERS:
        return None
    types = module.types
    matmul, unpadded, other = counter.instruction(op)
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
        matmul_flops=matmul,
        other_flops=other,
        hbm_bytes=moved,
        link_bytes=_links(module, op, devices, channels, count),
        asynchronous=_async_start(module, op),
        unpadded_matmul_flops=unpadded,
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


def program_work(hlo_text, devices=1, tile=None):
    """[OpWork] of every op a compiled program executes, in program order."""
    module = parse(hlo_text)
    counter = _Counter(module, tile)
    work, channels = [], set()
    for computation, count in executed(module):
        for op in computation.instructions:
            found = op_work(module, computation, op, count, devices, counter, channels)
            if found is not None:
                work.append(found)
    return work

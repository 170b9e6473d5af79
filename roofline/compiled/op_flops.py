"""The FLOPs of HLO instructions: matmuls (dots, convolutions, the attention
kernels XLA cannot look into) and everything else (elementwise arithmetic,
reductions). roofline/compiled/op_work.py adds them up for each op of a compiled program.

    counter = FlopCounter(module, tile=(8, 128, 128))
    flops = counter.instruction(op)      # Flops: .matmul, .unpadded, .other, .shapes

A dot is 2·M·N·K; a convolution 2 per valid (output, window) pair, as XLA's
HloCostAnalysis counts them (a TPU writes every matmul as a convolution, a
batched one as a padded window that picks one slice per output); `tile`
pads M, N and K up to what the chip's matmul units work on.
"""

import dataclasses
import json
import math
import re

from roofline.compiled.arrays import arrays
from roofline.compiled.program import collective_kind

# Instructions that are no work of their own: names, views, containers, markers.
NO_OP = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while"}
NO_OP |= {"conditional", "call", "after-all", "partition-id", "replica-id", "iota"}
NO_OP |= {"opt-barrier", "optimization-barrier", "add-dependency", "domain"}
# Instructions inside a fusion that move or view data and do no arithmetic.
NO_ARITHMETIC = NO_OP | {"broadcast", "reshape", "transpose", "copy", "slice", "concatenate"}
NO_ARITHMETIC |= {"pad", "dynamic-slice", "dynamic-update-slice", "gather", "scatter"}
NO_ARITHMETIC |= {"convert", "reverse", "custom-call", "fusion", "bitcast-convert"}

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
    # Our Pallas kernel (sessions/kernels/flash.py): Q·K^T and P·V; its backward is plain
    # XLA ops, counted as they are. On a TPU the custom call takes the kernel's
    # name; on NVIDIA it is a __gpu$xla.gpu.triton call named in its metadata.
    "flash_forward": 2,
}


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
    if key is None and op.target == "__gpu$xla.gpu.triton":
        named = op.attributes.get("metadata", "")
        key = next((k for k in ATTENTION_KERNELS if f"/{k}" in named), None)
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
    else:  # splash and ours: [B, H, S, D], and our model's mask is causal
        causal = True
        b, h, sq, d = q
        sk = k[2]
    one = matmul_flops(b * h, sq, sk, d, tile)
    exact = 2 * b * h * sq * sk * d
    share = 0.5 if causal else 1.0
    return ATTENTION_KERNELS[key] * one * share, ATTENTION_KERNELS[key] * exact * share


@dataclasses.dataclass(frozen=True)
class Flops:
    """The FLOPs of an instruction (and what it calls)."""

    matmul: float = 0.0  # on the matmul units, padded to their tiles
    unpadded: float = 0.0  # the same matmuls without the padding
    other: float = 0.0  # elementwise arithmetic and reductions
    shapes: tuple = ()  # (batch, M, N, K, dtype) of each dot and convolution in it

    def __add__(self, more):
        return Flops(
            self.matmul + more.matmul,
            self.unpadded + more.unpadded,
            self.other + more.other,
            self.shapes + more.shapes,
        )


class FlopCounter:
    """FLOPs of the instructions inside computations, each computation counted once."""

    def __init__(self, module, tile):
        self.module, self.tile, self.types = module, tile, module.types
        self.cache = {}

    def shape(self, name):
        found = arrays(self.types.get(name, ""))
        return found[0].shape if found else ()

    def _matmul(self, dims, dtype):
        return Flops(matmul_flops(*dims, self.tile), matmul_flops(*dims), 0.0, ((*dims, dtype),))

    def instruction(self, op):
        """The Flops of one instruction, with what it calls."""
        if op.opcode in ("dot", "convolution") and len(op.operands) >= 2 and op.shape is not None:
            lhs, rhs = self.shape(op.operands[0]), self.shape(op.operands[1])
            if op.opcode == "dot":
                dims = dot_dims(lhs, rhs, op.attributes)
            else:
                dims = conv_dims(lhs, rhs, op.shape, op.attributes)
            operand = arrays(self.types.get(op.operands[0], ""))
            return self._matmul(dims, operand[0].dtype if operand else op.dtype)
        if op.opcode == "custom-call":
            attention = _attention_flops(op, self.types, self.tile)
            if attention:
                return Flops(attention[0], attention[1])
            if op.target in ("__cublas$gemm", "__cublas$lt$matmul") and len(op.operands) >= 2:
                config = json.loads(op.attributes.get("backend_config", "{}") or "{}")
                numbers = config.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
                attributes = {  # as a dot's attributes: lhs_contracting_dims={1}
                    key.replace("dimensions", "dims"): "{" + ",".join(value) + "}"
                    for key, value in numbers.items()
                }
                lhs, rhs = self.shape(op.operands[0]), self.shape(op.operands[1])
                return self._matmul(dot_dims(lhs, rhs, attributes), op.dtype)
        inside = Flops()
        for called in op.calls.get("calls", ()):
            inside = inside + self.computation(called)
        if (
            op.opcode in NO_ARITHMETIC
            or collective_kind(op.opcode)[0]
            or op.opcode.endswith(("-start", "-done"))
        ):
            return inside
        if op.opcode in ("reduce", "reduce-window") and op.operands:
            elements = math.prod(self.shape(op.operands[0]))
        else:
            elements = sum(a.size for a in op.arrays)
        return inside + Flops(other=elements)

    def computation(self, name):
        if name not in self.cache:
            self.cache[name] = Flops()  # a cycle counts nothing
            total = Flops()
            found = self.module.computations.get(name)
            for op in found.instructions if found else ():
                total = total + self.instruction(op)
            self.cache[name] = total
        return self.cache[name]

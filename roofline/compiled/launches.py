"""The kernels one decode token launches, read off a compiled program.

Every instruction of a computation the program runs (ENTRY, a loop's body
and condition, a command buffer, a branch) is one kernel launch, except the
ones that move no data on the device:

    zero kernels  parameter, constant, get-tuple-element, tuple, bitcast (a view of
                  the same buffer), after-all, add-dependency, opt-barrier, the -done
                  half of an async pair (its -start is the launch), and custom calls
                  that only mark sharding or layout (program.NOT_KERNELS)
    its body      while, call (a command buffer among them), conditional (its largest
                  branch), async-start (what it runs on another stream): the control
                  flow itself launches nothing; the computations it runs do

A fusion is one kernel, whatever it fused; a custom call (cuBLAS, cuDNN, a
Pallas kernel) is one; an unfused op the GPU runs (a copy, a dynamic-update-slice
in place, a dot) is one. A copy XLA proved a no-op is gone from the optimized
program already (copy elision), so the copies left move bytes.

XLA's GPU backend wraps runs of kernels in command buffers (CUDA graphs): a
`call` to a computation named `command_buffer...`. The graph is launched once,
but each kernel in it still runs: they are counted, and so are the buffers.

A decode loop is a `while` in ENTRY whose body makes one token: a token costs
the body's kernels, a loop inside the body its count of trips. A loop whose trip
count XLA knows (`known_trip_count` in its backend_config: a fori_loop with
constant bounds, as kv_cache.decode_steps is) runs its body that many times and
never its condition (XLA's WhileThunk::ExecuteOnStream, given the count by
ThunkEmitter::EmitWhile; openxla/xla xla/backends/gpu/runtime/while_thunk.cc):
its condition launches nothing. Any other loop runs its condition once a trip,
and once more to stop. A program without a loop is one token.
The kind of each kernel is said in words a student knows (KINDS).
"""

import collections
from typing import NamedTuple

from roofline.compiled.hlo import parse
from roofline.compiled.program import COLLECTIVES, KERNELS, NOT_KERNELS

# Instructions that launch nothing (see the docstring for why).
ZERO = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"}
ZERO |= {"add-dependency", "opt-barrier", "domain"}
CONTROL = {"while", "call", "conditional", "async-start", "async-update"}

# What each kind of kernel is, in words (the keys are what kernel_kind returns).
KINDS = {
    "matvec": "matrix-vector products as multiply-and-reduce fusions",
    "reduce": "reductions (a norm's sum of squares, an argmax)",
    "dus": "dynamic-update-slices (in-place writes: the KV cache, the token)",
    "convert": "convert fusions (elementwise, ending in a change of dtype)",
    "concatenate": "concatenate fusions",
    "loop": "loop fusions (elementwise)",
    "scatter": "scatter fusions",
    "matmul": "matmul fusions",
    "dot": "matmuls (an unfused dot)",
    "triton": "Triton fusions (XLA's own: a softmax, a norm)",
    "triton_gemm": "Triton matmul fusions",
    "cudnn": "cuDNN fusions",
    "custom_fusion": "custom fusions (a library kernel)",
    "cublas": "cuBLAS gemms",
    "pallas": "Pallas kernels",
    "collective": "collectives",
    "copy": "copies",
}
# A kCustom fusion's kind, as its backend_config names it.
_CUSTOM_FUSIONS = {
    "__triton": "triton",
    "__triton_gemm": "triton_gemm",
    "__triton_nested_gemm_fusion": "triton_gemm",
    "__cudnn$fusion": "cudnn",
    "__custom_fusion": "custom_fusion",
}
# Custom calls that are Pallas kernels: Mosaic GPU, Pallas' Triton backend, Mosaic TPU.
_PALLAS = {"mosaic_gpu", "mosaic_gpu_v2", "__gpu$xla.gpu.triton", "triton_kernel_call"}
_PALLAS |= {"tpu_custom_call"}


class Launches(NamedTuple):
    """Kernels a token launches, by kind; and around them."""

    per_token: int  # kernels one token launches: the loop's body (and condition, if run)
    kinds: dict  # kind (a key of KINDS, or an opcode) -> kernels a token
    command_buffers: int  # command buffers a token launches (each holds some of the kernels)
    outside: int  # kernels once a call, outside the decode loop (0 without a loop)
    loop: bool  # True where a decode loop was found


def kernel_kind(op, module):
    """What kind of kernel one launching instruction is: a key of KINDS, or its opcode."""
    if op.opcode == "custom-call":
        target = op.target or ""
        if target in _PALLAS:
            return "pallas"
        if target.startswith("__cublas"):
            return "cublas"
        if target.startswith("__cudnn"):
            return "cudnn"
        return KERNELS.get(target, target)
    if op.opcode in ("copy", "copy-start"):
        return "copy"
    if op.opcode.endswith("-start") or op.opcode.startswith(COLLECTIVES):
        return "collective"
    if op.opcode == "dynamic-update-slice":
        return "dus"
    if op.opcode != "fusion":
        return op.opcode
    config = op.attributes.get("backend_config", "")
    for name, kind in _CUSTOM_FUSIONS.items():
        if f'"kind":"{name}"' in config:
            return kind
    return _fused_kind(module.computations[op.calls["calls"][0]], op.attributes.get("kind"))


def _fused_kind(body, fusion_kind):
    """A kLoop, kInput or kOutput fusion's kind, by the ops it fused."""
    ops = {i.opcode for i in body.instructions}
    root = body.root
    roots = {i.opcode for i in body.instructions if root and i.name in root.operands}
    roots.add(root.opcode if root else "")
    if "dynamic-update-slice" in roots:
        return "dus"
    if "scatter" in ops:
        return "scatter"
    if ops & {"dot", "convolution"}:
        return "matmul"
    if fusion_kind == "kInput" and "concatenate" in ops:
        return "concatenate"
    if "reduce" in ops:
        # A matrix-vector product multiplies two different arrays; a norm squares one.
        products = (i for i in body.instructions if i.opcode == "multiply")
        return "matvec" if any(len(set(i.operands)) == 2 for i in products) else "reduce"
    if "concatenate" in ops:
        return "concatenate"
    return "convert" if root is not None and root.opcode == "convert" else "loop"


def _launches(op):
    """True if the instruction is a kernel launch of its own (not control flow)."""
    if op.opcode in ZERO or op.opcode in CONTROL or op.opcode.endswith("-done"):
        return False
    return not (op.opcode == "custom-call" and op.target in NOT_KERNELS)


def _count(module, name, found, buffers, times=1, skip=None):
    """Add computation `name`'s kernels (and those of what it calls) to `found`
    {kind: n}, `times` runs of it, leaving out the instruction `skip`; command
    buffers to `buffers` [n]."""
    computation = module.computations[name]
    for op in computation.instructions:
        if op is skip:
            continue
        if _launches(op):
            found[kernel_kind(op, module)] += times
        elif op.opcode in ("call", "async-start"):  # an async op's kernels run on another stream
            for called in op.called:
                buffers[0] += times if called.startswith("command_buffer") else 0
                _count(module, called, found, buffers, times)
        elif op.opcode == "while":
            trips = _trips(module, op, computation)
            _count(module, op.calls["body"][0], found, buffers, times * trips)
            if not known_trips(op):
                _count(module, op.calls["condition"][0], found, buffers, times * (trips + 1))
        elif op.opcode == "conditional":
            # One branch runs: the largest stands for it (an upper bound).
            counts = []
            for branch in op.called:
                counts.append(collections.Counter())
                _count(module, branch, counts[-1], buffers, times)
            found.update(max(counts, key=lambda c: sum(c.values()), default={}))


def known_trips(loop):
    """True where XLA knows the `while`'s trip count: it then never runs the condition."""
    return '"known_trip_count"' in loop.attributes.get("backend_config", "")


def _trips(module, loop, holder):
    """Trips of a `while` inside the token (roofline/compiled/loops.py reads them)."""
    runs = module.trip_counts
    return max(1, runs.get(loop.calls["body"][0], 1) // runs.get(holder.name, 1))


def token_loop(module):
    """The decode loop: the `while` in ENTRY with the most instructions in its body, or None."""
    loops = [op for op in module.entry.instructions if op.opcode == "while"]
    size = lambda op: len(module.computations[op.calls["body"][0]].instructions)  # noqa: E731
    return max(loops, key=size, default=None)


def kernel_launches(hlo_text_or_module):
    """Launches of the kernels one decode token launches, in a compiled program
    (its HLO text, or a parsed roofline.compiled.hlo.Module)."""
    module = hlo_text_or_module
    if isinstance(module, str):
        module = parse(module)
    loop = token_loop(module)
    found, buffers = collections.Counter(), [0]
    if loop is None:
        _count(module, module.entry.name, found, buffers)
        return Launches(sum(found.values()), dict(found), buffers[0], 0, False)
    _count(module, loop.calls["body"][0], found, buffers)
    if not known_trips(loop):  # a token's share: its trip's condition
        _count(module, loop.calls["condition"][0], found, buffers)
    around = collections.Counter()
    _count(module, module.entry.name, around, [0], skip=loop)
    return Launches(sum(found.values()), dict(found), buffers[0], sum(around.values()), True)


def kernels_per_token(compiled_or_hlo_text):
    """(kernels one decode token launches, {kind: n}) of any compiled decode
    program (a `jax.stages.Compiled`, or its HLO text), for a GPU or a CPU."""
    text = compiled_or_hlo_text
    if not isinstance(text, str):
        text = text.as_text()
    found = kernel_launches(text)
    return found.per_token, found.kinds


def launch_text(launches):
    """'a token N (k1 kind1, k2 kind2, ...)', the most frequent kind first."""
    kinds = sorted(launches.kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    said = ", ".join(f"{n} {KINDS.get(kind, kind)}" for kind, n in kinds)
    buffers = launches.command_buffers
    held = f"; in {buffers} command buffer{'s' * (buffers != 1)}" if buffers else ""
    return f"a token {launches.per_token} ({said}{held})"

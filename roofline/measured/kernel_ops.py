"""Which HLO op each GPU kernel of a trace belongs to, where the trace does not say.

XLA's GPU runtime runs a compiled program as a sequence of thunks, one per HLO
op of the scheduled ENTRY computation (the order `compiled.as_text()` prints
it in, `is_scheduled=true`). Each thunk launches kernels: a fusion its own
kernel, named after the fusion (`input_reduce_fusion.18` launches
`input_reduce_fusion_18`); a cuBLAS or cuDNN call the library's kernels
(`nvjet_sm90_...`, `cudnn_generated_..._sdpa_...`), often behind a memset; a
copy a memcpy. With every thunk launched on its own, the profiler's annotation
names each kernel's op (its `hlo_op` stat). With XLA's command buffers on (the
GPU default), consecutive thunks are recorded into one CUDA graph and every
kernel of it carries the graph's name instead: `hlo_op` is `command_buffer_1`.
The kernels still carry their own names, so they are matched back here:

- Fusions with the same body share one compiled kernel, named after the first
  of them: a kernel name gives the op's family (`input_reduce_fusion`), not
  always the op. Library kernels name no op at all.
- So one step's kernels, in the order they ran, are aligned with the
  schedule's ops: each kernel goes to an op no earlier than the previous
  kernel's, a kernel named after a fusion to a fusion of that family, a
  library's kernel to a call of that library (cuBLAS, cuDNN, NCCL, a copy),
  and every op should launch something. The alignment that scores best under
  those rules is found by dynamic programming over (kernel, op), as sequence
  aligners do. Memsets go with the kernel that follows them: cuBLAS and cuDNN
  clear their outputs first, and a command buffer may drop some of them.

Checked on a real H100 trace with command buffers off (tests/test_trace_truth.py):
with the `hlo_op` stats hidden, the alignment gives every kernel the op the
runtime named.
"""

import math
import re

from roofline.compiled.hlo import parse
from roofline.compiled.op_work import MARKERS

COMMAND_BUFFER = re.compile(r"^command_buffer")
# No thunk of its own: names, views and waits.
NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"}
NO_KERNEL |= {"partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
CONTROL = {"while", "conditional", "call"}  # their bodies' kernels run inside them
# Kernel families by name, first match wins: cuDNN's attention kernels also say "sm90".
FAMILIES = (
    ("memset", re.compile(r"^memset", re.IGNORECASE)),
    ("memcpy", re.compile(r"memcpy", re.IGNORECASE)),
    ("nccl", re.compile(r"nccl", re.IGNORECASE)),
    ("cudnn", re.compile(r"cudnn|sdpa|fmha", re.IGNORECASE)),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|cublas|splitk|ampere_|sm\d\d_", re.IGNORECASE)),
)
COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-)")
# Scores of the alignment: a match of family earns, an op left without a kernel costs.
EXACT, FAMILY, LOOSE, WRONG, EMPTY, TWICE = 4.0, 2.0, 0.5, -5.0, -1.0, -3.0


def family_of_op(op):
    """What an HLO op launches: 'kernel' (a fusion or copy XLA generated),
    a library's family, 'control' (a loop or call), or None (nothing)."""
    if op.opcode in NO_KERNEL or op.opcode.endswith("-done"):
        return None
    if op.opcode == "custom-call":
        target = (op.target or "").lower()
        if op.target in MARKERS:
            return None
        return "cudnn" if "cudnn" in target else "gemm" if "cublas" in target else "library"
    if COLLECTIVE.match(op.opcode):
        return "nccl"
    return "control" if op.opcode in CONTROL else "kernel"


def stem(name):
    """A name without its number: input_reduce_fusion.18 and _18 -> input_reduce_fusion."""
    return re.sub(r"[._]\d+$", "", name)


def _as_op_name(kernel):
    """A generated kernel's name as its op's: `loop_add_fusion_3` -> `loop_add_fusion.3`."""
    return re.sub(r"_(\d+)$", r".\1", kernel)


def named_op(kernel):
    """The op a kernel's name says it belongs to, or None for a library's kernel."""
    if any(pattern.search(kernel) for _, pattern in FAMILIES):
        return None
    return _as_op_name(kernel)


def kernel_family(kernel, op_names):
    """('kernel', the op it is named after) for a kernel XLA generated, else
    (the library family, None): by name alone."""
    for name in (_as_op_name(kernel), kernel):
        if name in op_names:
            return "kernel", name
    family = next((f for f, pattern in FAMILIES if pattern.search(kernel)), "library")
    return family, None


def _score(kernel, op):
    """How well one kernel (family, named op, runtime's op) fits one schedule op."""
    family, named, runtime = kernel
    name, op_family = op
    if runtime is not None:  # the runtime named it: that op and no other
        return EXACT if runtime == name else -math.inf
    if op_family == "control":
        return LOOSE
    if family == "kernel":
        if op_family != "kernel" or stem(name) != stem(named):
            return -math.inf
        return EXACT if name == named else FAMILY
    if op_family == family or (family == "memcpy" and name.startswith("copy")):
        return FAMILY
    if op_family == "library" or (op_family == "kernel" and family == "library"):
        return LOOSE
    return WRONG if op_family in ("gemm", "cudnn", "nccl") else LOOSE


def align(kernels, ops):
    """[index into ops] for each kernel: the best-scoring monotone alignment.

    kernels: [(family, op it is named after or None, op the runtime named or None)];
    ops: [(name, family)], the schedule's ops that launch something, in order."""
    n, m = len(kernels), len(ops)
    if not n or not m:
        return [None] * n
    empty = [0.0 if f == "control" else EMPTY for _, f in ops]
    before = [0.0]  # before[j]: cost of leaving ops[0:j] empty
    for e in empty:
        before.append(before[-1] + e)
    score = [[_score(k, o) for o in ops] for k in kernels]
    best = [before[j] + score[0][j] for j in range(m)]
    back = [[-1] * m]
    for i in range(1, n):
        twice = TWICE if kernels[i][0] == kernels[i - 1][0] == "kernel" else 0.0
        row, came, run, arg = [], [], -math.inf, -1  # run: best of best[k] - before[k + 1], k < j
        for j in range(m):
            stay = best[j] + twice
            move = run + before[j]  # from op k < j, the ops between left empty
            row.append(max(stay, move) + score[i][j])
            came.append(j if stay >= move else arg)
            if best[j] - before[j + 1] > run:
                run, arg = best[j] - before[j + 1], j
        best = row
        back.append(came)
    j = max(range(m), key=lambda j: best[j] + before[m] - before[j + 1])
    if best[j] == -math.inf:
        return [None] * n
    path = [j]
    for i in range(n - 1, 0, -1):
        j = back[i][j]
        path.append(j)
    return path[::-1]


def schedule(hlo_text):
    """[(name, family)] of the ops of the program's ENTRY that launch work, in
    the order the program runs them."""
    entry = parse(hlo_text).entry
    ops = entry.instructions if entry else ()
    return [(op.name, f) for op in ops if (f := family_of_op(op)) is not None]


def attribute(step_kernels, hlo_text):
    """{kernel index: HLO op name} for one step's kernels on one device.

    step_kernels: [(kernel name, the op the runtime named: an HLO op, a
    command buffer, or None)], in the order they started. Kernels the runtime
    named after an op of the program keep it; the rest are aligned with the
    program's schedule (see the module's docstring); memsets take the op of
    the next kernel."""
    module = parse(hlo_text)
    op_names = {op.name for _, op in module.instructions()}
    ops = schedule(hlo_text)
    scheduled = {name for name, _ in ops}
    kernels, where = [], []
    for index, (kernel, runtime) in enumerate(step_kernels):
        family, named = kernel_family(kernel, op_names)
        if runtime is not None and runtime not in scheduled:
            runtime = None  # a command buffer, or an op inside a loop
        if family != "memset" or runtime is not None:
            kernels.append((family, named, runtime))
            where.append(index)
    found = {where[i]: ops[j][0] for i, j in enumerate(align(kernels, ops)) if j is not None}
    for index, (_, runtime) in enumerate(step_kernels):
        if runtime in op_names:  # the runtime's word stands, in a loop's body too
            found[index] = runtime
    following = None
    for index in range(len(step_kernels) - 1, -1, -1):  # memsets: the op after them
        if index in found:
            following = found[index]
        elif following is not None:
            found[index] = following
    return found

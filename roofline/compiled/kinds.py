"""What kind of work an XLA op did: a matmul, elementwise arithmetic, a copy,
a collective. The time-by-kind breakdown of a trace is built from this.

The kind is not in an op's name: XLA names fusions after a couple of the ops
inside them, and on a CPU a matmul may run inside a `ynn_fusion` next to plain
elementwise ones. So, best first:

    classify_hlo(hlo_text)       the compiled program's HLO: a fusion is what is inside it
    kind_from_category(category) the TPU runtime's own category of the op (`hlo_category`)
    kind_from_name(op_name)      a guess from the name alone

`hlo_from_trace` finds the HLO in the trace itself, where xprof's converter
can extract it.
"""

import contextlib
import glob
import os
import re
import sys

from roofline.compiled.hlo import parse

KINDS = ("matmul", "elementwise", "copy/transpose", "collective", "other", "idle")
KIND_NOTES = {
    "matmul": "dot/convolution, and fusions or library calls built around one",
    "elementwise": "fused elementwise arithmetic and reductions",
    "copy/transpose": "copies, transposes, fusions that write a new layout",
    "collective": "all-reduce, all-gather, reduce-scatter, all-to-all, permutes",
    "other": "gather/scatter, control flow, other custom calls",
    "idle": "no op running within the step: the device waited on the host",
}

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
# Library calls that are matmuls: cuBLAS/cuBLASLt GEMMs, cuDNN's fused attention;
# Pallas kernels on a TPU (target tpu_custom_call) say what they are by name
# (JAX's splash attention: splash_mha_fwd, splash_mha_dq, splash_mha_dkv).
MATMUL_CALL = re.compile(r"gemm|matmul|cublas|fmha|flash|splash", re.IGNORECASE)


def opcode_kind(opcode, target="", name=""):
    """The kind of one unfused HLO instruction (custom calls: by target, or
    for a TPU's Pallas kernels, by name)."""
    kernel = target == "tpu_custom_call" and MATMUL_CALL.search(name)
    if opcode in MATMUL_OPS or (opcode == "custom-call" and (MATMUL_CALL.search(target) or kernel)):
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
    module = parse(hlo_text)
    inner = {}  # computation -> kinds of the instructions in it, nested fusions included

    def kinds_inside(computation, seen=()):
        if computation not in inner:
            kinds = set()
            found = module.computations.get(computation)
            for op in found.instructions if found else ():
                kinds.add(opcode_kind(op.opcode, op.target or "", op.name))
                for called in op.calls.get("calls", ()):
                    if called not in seen:
                        kinds |= kinds_inside(called, (*seen, computation))
            inner[computation] = kinds
        return inner[computation]

    kinds = {}
    for _, op in module.instructions():
        fused = op.calls.get("calls", ())
        if op.opcode == "fusion" and fused:
            inside = kinds_inside(fused[0])
            kind = next(
                (k for k in ("matmul", "collective", "copy/transpose", "other") if k in inside),
                "elementwise",
            )
        else:
            kind = opcode_kind(op.opcode, op.target or "", op.name)
        kinds[op.name] = kind
    return kinds


def kind_from_category(category):
    """The kind of an op from the category the TPU runtime gives it (its
    `hlo_category` stat), e.g. "convolution fusion", "loop fusion", "data
    formatting", "all-reduce", "copy-start" (categories as xprof lists them in
    xprof/convert/smart_suggestion/signal_provider.h). A TPU runs every matmul
    on its MXU as a convolution; "megacore fusion" is a collective there."""
    category = category.lower()
    if "convolution" in category or re.search(r"\bdot\b|matmul", category):
        return "matmul"
    if category.startswith(COLLECTIVE_PREFIXES) or category.startswith("megacore"):
        return "collective"
    if category == "data formatting" or category.startswith(("copy", "transpose")):
        return "copy/transpose"
    if category.split(" ")[0] in OTHER_OPS or "custom" in category:
        return "other"
    return "elementwise"


def kind_from_name(op_name):
    """A guess from an op's name alone, for traces without their HLO. A GPU
    kernel from a library names its library: cuBLAS's (nvjet_*, cutlass,
    *xmma*) and cuDNN's (cudnn*, *sdpa*) are matmuls, NCCL's collectives."""
    name = op_name.lower()
    if re.search(r"\bdot|conv|gemm|cublas|matmul|nvjet|cutlass|xmma|cudnn|sdpa|fmha", name):
        return "matmul"
    if "nccl" in name or any(p in name for p in COLLECTIVE_PREFIXES):
        return "collective"
    if re.search(r"copy|transpose|memcpy|memset", name):
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
    always the program id; when several programs share the name, the one
    holding the most of the traced op names wins (the newest, on a tie)."""
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

"""The scatters of a compiled program, and the dtype each one sums in.

A gather's gradient is a scatter-add: the lookup `table[tokens]` sends each
position's gradient back into its token's row. Mixed precision must keep that
sum in float32. In bf16 it loses every update below half the running sum's
last place (8 significant bits), and on a GPU it runs as bf16 atomic adds: on
the first H100 run the token embedding's, `input_scatter_fusion`, bf16[256,
512], took 4.6 ms at step 1 and 58-146 ms a step after 600 steps, against 0.3
ms for the same sum in float32 (docs/h100-run, 2026-11-24). The source
does not say which dtype a sum runs in; the compiled program does.
"""

from typing import NamedTuple

from roofline.compiled.arrays import BYTES
from roofline.compiled.hlo import parse


class Scatter(NamedTuple):
    """One scatter of a compiled program."""

    kernel: str  # the top-level instruction it runs in: its fusion, or itself
    name: str  # the scatter's own name (inside its fusion)
    dtype: str  # the dtype it holds its running sums in (sums_in)
    shape: tuple  # its result's shape


def sums_in(module, scatter):
    """The dtype a scatter holds its running sums in: the narrowest float among
    its result and the values of its combiner (to_apply). Mostly its result's
    dtype; but XLA's CPU compiler in JAX 0.10 widens a bf16 scatter to an f32
    result and rounds each add back to bf16 inside the combiner."""
    held = [scatter.dtype]
    for name in scatter.calls.get("to_apply", ()):
        held += [op.dtype for op in module.computations[name].instructions]
    floats = [d for d in held if d and d.startswith(("f", "bf"))]
    return min(floats, key=BYTES.get, default=scatter.dtype)


def scatters(hlo_text):
    """[Scatter] of a compiled program's HLO text, fused or not, each with the
    dtype it sums in and the kernel it runs in (the name a GPU trace gives it)."""
    module = parse(hlo_text)
    caller = {
        body: op.name
        for _, op in module.instructions()
        if op.opcode == "fusion"
        for body in op.called
    }
    holder = {op.name: computation.name for computation, op in module.instructions()}
    found = []
    for computation, op in module.instructions():
        if op.opcode == "scatter":
            kernel, where = op.name, computation.name
            while where in caller:  # a fusion inside a fusion: up to the outermost
                kernel = caller[where]
                where = holder[kernel]
            found.append(Scatter(kernel, op.name, sums_in(module, op), op.shape))
    return found

"""Float copies a compiled program makes of its int8 arrays: a dequantized weight or cache.

int8 weights halve decode's bytes only if each matmul reads the int8 values
themselves. Converted inside the fusion that holds the dot (an NVIDIA GPU's
gemm fusion, a TPU's convolution fusion), the float values live in registers
and on-chip memory and never reach HBM. Converted by an op of their own, they
are written to HBM as a float copy and read back from it: 1 + 2 + 2 bytes a
value in bf16, more than the weight in bf16 would have cost.

    widened_copies(hlo_text, min_elements)   # [Widened, ...]: none is the goal

The criterion, read off the compiled program: an op it executes (an
instruction of ENTRY or of a loop body: its result is a buffer in memory; an
instruction inside a fusion's body is not) that reads an int8 array of at
least min_elements and writes a floating-point array of at least min_elements.
With min_elements the smallest int8 weight or cache array, no activation of a
decode step (a few rows of E, F, V or T numbers) reaches it, while a
dequantized copy of any weight or cache array does, whatever its layout,
reshape or fusion. Ops that only pass arrays on (a loop's state, a tuple, a
bitcast) write no buffer and are not counted.
"""

from typing import NamedTuple

from roofline.compiled.arrays import arrays
from roofline.compiled.hlo import parse
from roofline.compiled.op_work import executed

INT8 = {"s8", "u8"}
FLOATS = {"f16", "bf16", "f32", "f64"}
PASSING_ON = {"parameter", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional"}


class Widened(NamedTuple):
    """One op that writes a float copy of an int8 array."""

    name: str
    opcode: str  # "fusion", "convert", ...
    read: str  # the int8 operand's type, e.g. "s8[2048,8192]{1,0}"
    written: str  # the op's result type
    runs: int  # how often it runs per execution: once a call, or once a decode step


def widened_copies(hlo_text, min_elements):
    """Every op of the compiled program that widens an int8 array of at least
    min_elements numbers into a float array of at least as many (see above)."""
    module = parse(hlo_text)
    types = module.types
    found = []
    for computation, runs in executed(module):
        for op in computation.instructions:
            if op.opcode in PASSING_ON:
                continue
            if not any(a.dtype in FLOATS and a.size >= min_elements for a in op.arrays):
                continue
            for name in op.operands:
                big = [a for a in arrays(types.get(name, "")) if a.dtype in INT8]
                if any(a.size >= min_elements for a in big):
                    found.append(Widened(op.name, op.opcode, types[name], op.type_text, runs))
                    break
    return found

"""The arrays of an HLO type and their bytes: `bf16[96,768]{1,0}` is one array
of dtype bf16 and shape (96, 768), laid out {1,0}; a tuple type is several.
roofline/compiled/hlo.py reads the types off each instruction; the per-op work
(roofline/compiled/op_work.py) and the program's totals (program.py) count
their bytes here.
"""

import dataclasses
import math
import re

# Bytes per element of each HLO dtype.
BYTES = {
    **dict.fromkeys(("pred", "s8", "u8", "f8e4m3fn", "f8e5m2"), 1),
    **dict.fromkeys(("bf16", "f16", "s16", "u16"), 2),
    **dict.fromkeys(("f32", "s32", "u32"), 4),
    **dict.fromkeys(("f64", "s64", "u64"), 8),
}

_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\]")


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of an HLO type: its dtype ('bf16') and shape ((8, 32))."""

    dtype: str
    shape: tuple

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def bytes(self):
        """Bytes of its elements; 0 for a dtype without a fixed width (token, opaque)."""
        return BYTES.get(self.dtype, 0) * self.size


def arrays(type_text):
    """The arrays of an HLO type, in order: 'bf16[96,768]{1,0}' or a tuple of them.
    A dynamic dimension, '<=8', counts at its bound."""
    return tuple(
        Array(dtype, tuple(int(d.lstrip("<=")) for d in dims.split(",") if d))
        for dtype, dims in _ARRAY.findall(type_text)
    )


def array_bytes(type_text):
    """Bytes of every array in an HLO type: 'bf16[96,768]{1,0}' or a tuple of them."""
    return sum(a.bytes for a in arrays(type_text))

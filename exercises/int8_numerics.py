"""Numerics: a sum in int8 with an absmax scale, against the float32 sum.

int8 holds 256 values. Absmax scaling maps the largest |x| to 127:
scale = max|x| / 127, q = round(x / scale), x ≈ q * scale. Rounding moves
each element by at most scale / 2, so a sum of N quantised elements is off
by at most N * scale / 2. The sum itself must be accumulated in a wider
type (int32): 127 * 300 already overflows int8 and int16 alike.
"""

import jax.numpy as jnp


def quantize_absmax(x):
    """x: float32 [N] -> (q: int8 [N], scale: float32 scalar), x ≈ q * scale.

    scale = max|x| / 127 (1.0 when x is all zeros, to avoid 0 / 0);
    q = round(x / scale), so the largest |x| becomes ±127.
    """
    raise NotImplementedError


def int8_sum(x):
    """The sum of x computed from its int8 quantisation: a float32 scalar.

    Quantise with quantize_absmax, add the int8 values up in int32, multiply
    by the scale once at the end.
    Hint: jnp.sum(q, dtype=jnp.int32).
    """
    raise NotImplementedError


def int8_sum_error_bound(x):
    """The most int8_sum(x) can differ from the exact sum: N * scale / 2.

    Each element moves by at most half a quantisation step when rounded.
    """
    raise NotImplementedError

"""Checking a computation against its float32 reference on any chip.

A chip does not multiply float32 matrices in float32 unless asked: an NVIDIA
GPU's default is TF32 (10 of float32's 23 mantissa bits: a unit roundoff of
2^-11 against 2^-24), a TPU's one pass of bfloat16 (7 bits, 2^-8); a CPU's is
float32 itself. So a check that holds to 1e-5 on a CPU fails on a GPU with no
bug at all (session 4's online softmax did: 3.4e-3 on an H100,
../shared/h100-run/s4_kernels.log). Here the reference is computed at
precision HIGHEST, float32 on every chip, and the tolerance is float32's, or,
where the chip's default matmuls round more, a multiple of what that rounding
alone moves the reference itself: derived from the chip's real precision on
the very numbers checked, and printed.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


def biggest(a, b):
    """The largest difference between two arrays, or two pytrees of them."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(jnp.float32(x) - jnp.float32(y)))) for x, y in pairs)


# What float32 matmuls run in unless asked otherwise.
DEFAULT_MATMULS = {"cpu": "float32", "gpu": "tf32", "tpu": "bf16"}
SLACK = 4  # our code rounds in other places than the reference: errors of a size, not equal


class Reference(NamedTuple):
    exact: object  # the reference, computed in float32 (precision HIGHEST)
    tolerance: float  # how far a check against it may be
    line: str  # which precision, and why this tolerance


def exact_and_tolerance(reference, floor):
    """Reference: reference() at precision HIGHEST, and the tolerance a check
    against it takes: float32's `floor`, as on a CPU, or where this chip's
    default matmuls round more than float32, SLACK times what that rounding
    alone changes in the reference itself, whichever is larger."""
    with jax.default_matmul_precision("highest"):
        exact = reference()
    rounded = biggest(reference(), exact)  # the same, at the chip's default precision
    tolerance = max(floor, SLACK * rounded)
    matmuls = DEFAULT_MATMULS.get(jax.default_backend(), "its default precision")
    if rounded == 0:
        why = f"float32 matmuls here run in {matmuls}, as the reference: tolerance {floor:.0e}"
    else:
        why = (
            f"float32 matmuls here run in {matmuls}, which moves the reference by "
            f"{rounded:.1e}: tolerance {tolerance:.1e}"
        )
    return Reference(exact, tolerance, f"reference at precision HIGHEST; {why}")

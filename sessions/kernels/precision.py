"""Checking a computation against its float32 reference on any chip.

A chip does not multiply float32 matrices in float32 unless asked. Under JAX's
default precision an NVIDIA GPU from Ampere on rounds each input of a float32
matmul to TF32 and a TPU to bfloat16, then sums the products in float32; a CPU
multiplies in float32 (JAX docs, "Matmul precision", docs.jax.dev; precision
HIGHEST asks for float32 everywhere). What a format keeps is its significand,
the implicit leading one included: float32 24 bits (IEEE 754 binary32, 23
stored), TF32 11 (10 stored: NVIDIA's A100 whitepaper), bfloat16 8 (7 stored).
Rounded to nearest, an input moves by at most its unit roundoff u = 2^-bits of
itself: 6.0e-8, 4.9e-4, 3.9e-3.

So a check that holds to 1e-5 on a CPU can fail on a GPU with no bug at all:
session 4's did on an H100 (docs/h100-run/s4_kernels.log), and TF32 alone
explains each figure. The H100 compared our code at TF32 with a reference at
TF32; the same comparison on a CPU with every matmul's inputs rounded to TF32
(tests/hardware_fakes.py, rounded_matmuls; the same random inputs, as JAX's
generator is the same on every chip) gives the kernel's forward 7.08e-4, dq
9.54e-4 and dk 1.06e-3 (the H100: 7.08e-4, 9.54e-4, 1.07e-3) and the online
softmax 3.1e-3 (3.4e-3); only dv differs, 1.3e-3 where the H100 gave 1.7e-4.
Against a float32 reference the same rounding moves them further: 0.9e-3 to
1.6e-3 for the kernel, 6.1e-2 for the online softmax, whose scores reach 75,
where one TF32 rounding is 0.04.

Here the reference is always compiled at precision HIGHEST, and the code under
test gets float32's tolerance where it rounds as the reference does, and one
derived from how much more it rounds where it does (roundoff,
attention_tolerance). Were the tensor cores to truncate rather than round
(triton-lang/triton#4574), u would double; emulated, the kernel's checks still
hold within it.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from roofline.compiled.hlo import parse


class MatmulPrecision(NamedTuple):
    name: str  # what a float32 matmul's inputs are rounded to
    bits: int  # significand bits, the implicit one included

    @property
    def unit_roundoff(self):
        return 2.0**-self.bits


FLOAT32 = MatmulPrecision("float32", 24)
TF32 = MatmulPrecision("TF32", 11)
BF16 = MatmulPrecision("bf16", 8)


def default_matmul_precision(device=None):
    """What a float32 matmul at JAX's default precision rounds its inputs to on
    `device` (jax.devices()[0] when None): float32 on a CPU or under
    jax.default_matmul_precision("highest"); bfloat16 on a TPU (one pass);
    TF32 on an NVIDIA GPU from Ampere (compute capability 8.0), where the
    tensor cores take it, float32 before. Pallas's Triton lowering does the
    same for a dot inside our kernel: DEFAULT precision is TF32
    (jax/_src/pallas/triton/lowering.py, _TF32_PRECISIONS)."""
    device = device or jax.devices()[0]
    if device.platform == "cpu" or jax.config.jax_default_matmul_precision in (
        "highest",
        "float32",
    ):
        return FLOAT32
    if device.platform == "tpu":
        return BF16
    major = getattr(device, "compute_capability", "8.0").split(".")[0]
    return FLOAT32 if major.isdigit() and int(major) < 8 else TF32


def roundoff(precision, terms, device=None):
    """u: how far, relative to its size, each product and each score of ours may
    be from the reference's, whose matmuls run in float32. Rounding the inputs:
    precision's unit roundoff, none in float32. And float32's own rounding of
    each sum of `terms` products, about sqrt(terms)·2^-24 of it (errors of
    random sign add like a random walk), where the two sides may sum in
    different orders: on a GPU or a TPU, whose libraries pick a kernel per
    shape; not on a CPU, where the same dot code sums alike for both (check 1
    agrees to 4e-6 there, where float32's error against float64 is 5e-5)."""
    device = device or jax.devices()[0]
    inputs = 0.0 if precision.bits >= FLOAT32.bits else precision.unit_roundoff
    order = 0.0 if device.platform == "cpu" else terms**0.5 * FLOAT32.unit_roundoff
    return inputs + order


def attention_tolerance(u, max_score, scale, floor):
    """How far attention, or one of its gradients, may be from its float32
    reference where its matmuls round by u more (`roundoff`). `max_score`: the
    largest |q . k| / sqrt(D) of the inputs; `scale`: the largest |value|
    checked; `floor`: float32's tolerance, the one a CPU holds to.

    A first-order estimate, not a worst case. Rounding moves each product q_d k_d
    by about u of it (two roundings of up to u each, of random sign), so a score
    by about u·|s|, up to u·max_score. The softmax turns a score's error into
    the same relative error of its weight, and the weighted sum moves by that
    times the range of what it weighs, up to 2·scale. Multiplying the weights
    by the values rounds both: 2u·scale more. So floor + 2u·(1 + max_score)·scale."""
    return floor + 2 * u * (1 + max_score) * scale


def precision_line(precision, terms, device=None):
    """How a float32 matmul runs here, and its roundoff u in parts, for a check."""
    device = device or jax.devices()[0]
    u = roundoff(precision, terms, device)
    parts = [f"2^-{precision.bits}"] if precision.bits < FLOAT32.bits else []
    parts += [f"sqrt({terms})·2^-24"] if device.platform != "cpu" else []
    adds = f"u = {' + '.join(parts)} = {u:.1e}" if u else "u = 0, no coarser than the reference"
    return f"float32 inputs, {precision.name} matmuls on {device.platform}: {adds}"


def lowered_exactly(f, *args):
    """f(*args) traced and lowered at precision HIGHEST: every matmul in float32."""
    with jax.default_matmul_precision("highest"):
        return jax.jit(f).lower(*args)


def exact(f, *args):
    """The float32 reference: f(*args) compiled at precision HIGHEST, and run."""
    return lowered_exactly(f, *args).compile()(*args)


def dot_precisions(hlo_text):
    """The operand precision of every dot of a program's HLO text, in order:
    "{highest,highest}", or "default" where the compiler was told none."""
    ops = (op for _, op in parse(hlo_text).instructions() if op.opcode == "dot")
    return [op.attributes.get("operand_precision", "default") for op in ops]


def biggest(a, b):
    """The largest difference between two arrays, or two pytrees of them."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(jnp.float32(x) - jnp.float32(y)))) for x, y in pairs)

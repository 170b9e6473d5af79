"""Mosaic GPU across JAX versions: its kernels and its interpreter, spelled as this JAX spells them.

A Mosaic GPU kernel (`jax.experimental.pallas.mosaic_gpu`) compiles for Hopper and
Blackwell GPUs. On a machine without one it runs in Mosaic GPU's own interpreter,
slowly, the same arithmetic: `plgpu.InterpretGPUParams` in JAX 0.12, a private class
in 0.10. (The generic `interpret=True` of Pallas fails on TMA copies and wgmma.)
Whether to interpret is always the caller's word, never guessed from the default
backend: a deviceless compile for an H100 runs on a CPU.
"""

import inspect

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

OLD_INTERPRETER = not hasattr(plgpu, "InterpretGPUParams")  # JAX 0.10's, with fewer primitives


def interpret_params():
    """Mosaic GPU's interpreter, as this JAX names it."""
    if not OLD_INTERPRETER:  # JAX 0.12
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # JAX 0.10

    return InterpretGPUParams()


def kernel(body, *, interpret: bool, **kwargs):
    """plgpu.kernel(body, **kwargs), run in the interpreter when `interpret`."""
    return plgpu.kernel(body, interpret=interpret_params() if interpret else None, **kwargs)


class Ops:
    """What a kernel body spells differently compiled and interpreted: layouts are the
    compiler's concern, and JAX 0.10's interpreter has no layout_cast, no plgpu.load and
    no transposed wgmma operand (there a tile is transposed through `spare`, 64 x 64)."""

    WG = plgpu.Layout.WGMMA  # [64, n], as wgmma accumulates; its [64] per row, [n] per column:
    ROW, COL = WG.reduce(1), WG.reduce(0)

    def __init__(self, interpret, spare):
        self.interpret, self.spare = interpret, spare

    def cast(self, value, layout):
        return value if self.interpret else plgpu.layout_cast(value, layout)

    def zeros(self, shape, layout):
        return self.cast(jnp.zeros(shape, jnp.float32), layout)

    def load(self, ref, layout):
        if self.interpret:
            return ref[...]
        index = ((),) if "idx" in inspect.signature(plgpu.load).parameters else ()  # JAX 0.10
        return plgpu.load(ref, *index, layout=layout, optimized=False)

    def iota(self, dim):
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, (64, 64), dim)
        return plgpu.broadcasted_iota(jnp.int32, (64, 64), dim, layout=self.WG)

    def transposed(self, tile):
        if self.interpret and OLD_INTERPRETER:
            self.spare[...] = tile[...].T
            return self.spare
        return tile.T

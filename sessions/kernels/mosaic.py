"""Mosaic GPU across JAX versions: its kernels and its interpreter, spelled as this JAX spells them.

A Mosaic GPU kernel (`jax.experimental.pallas.mosaic_gpu`) compiles for Hopper and
Blackwell GPUs. On a machine without one it runs in Mosaic GPU's own interpreter,
slowly, the same arithmetic: `plgpu.InterpretGPUParams` in JAX 0.12, a private class
in 0.10. (The generic `interpret=True` of Pallas fails on TMA copies and wgmma.)
Whether to interpret is always the caller's word, never guessed from the default
backend: a deviceless compile for an H100 runs on a CPU.
"""

import inspect
import itertools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
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

    def iota(self, dim, shape=(64, 64)):
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.WG)

    def transposed(self, tile):
        if self.interpret and OLD_INTERPRETER:
            self.spare[...] = tile[...].T
            return self.spare
        return tile.T


def when_below(a, b):
    """pl.when(a < b) for int32 scalars a, b, as a decorator: a branch on an int (lax.switch),
    not on a bool. Mosaic GPU lowers the bool's conversion that pl.when and lax.cond make by
    asking ptxas for its version, each time: 16 ms a branch on a Zen 3 (JAX 0.10.2), 2.3 s
    of the 1.2B shape's attention kernel's compile before this (docs/results.md). So too
    jnp's // and % on ints (they convert bools): the kernels divide their non-negative
    indices with lax.div and lax.rem, the same there."""

    def run(body):
        lax.switch(jnp.clip(b - a, 0, 1), [lambda: None, body])

    return run


def run_index(t, firsts):
    """Which of the runs starting at `firsts` (ascending, the first 0) holds t: by int
    arithmetic, no bool (when_below says why)."""
    return sum(jnp.clip(t - first + 1, 0, 1) for first in firsts[1:])


class Ring:
    """Weight tiles streamed HBM -> SMEM through S slots, S copies in flight: tile t + S
    is copied into t's slot as soon as the tensor cores have read tile t. The tiles come
    in runs, [(count, box)]: box(u) the GMEM boxes of the run's tile u, stacked in its
    slot (each slot's barrier counts them). t and u are a loop's index, traced: every loop
    over tiles is a loop in the kernel, not unrolled here, so the kernel's code is the
    same size however many tiles E makes (tests/test_kernel_sizes.py)."""

    def __init__(self, runs, slots, barriers):
        self.runs, self.slots, self.barriers = runs, slots, barriers
        self.S, self.n = slots.shape[0], sum(count for count, _ in runs)
        self.firsts = [0, *itertools.accumulate(count for count, _ in runs[:-1])]  # run starts

    def fetch(self, t):
        slot, bar = self.slots.at[lax.rem(t, self.S)], self.barriers.at[lax.rem(t, self.S)]

        def copy(boxes):
            rows = 0
            for src in boxes:
                plgpu.copy_gmem_to_smem(src, slot.at[pl.ds(rows, src.shape[0])], bar)
                rows += src.shape[0]

        if len(self.runs) == 1:
            return copy(self.runs[0][1](t))
        runs = zip(self.firsts, self.runs)
        branches = [lambda f=f, box=box: copy(box(t - f)) for f, (_, box) in runs]
        lax.switch(run_index(t, self.firsts), branches)  # the run t is in

    def start(self):
        pl.loop(0, min(self.S, self.n))(self.fetch)

    def step(self, t, acc, b_operand):
        """acc += tile t @ b_operand once tile t has landed; then refill its slot."""
        plgpu.barrier_wait(self.barriers.at[lax.rem(t, self.S)])
        plgpu.wgmma(acc, self.slots.at[lax.rem(t, self.S)], b_operand)
        plgpu.wgmma_wait(0)  # the slot is read: it may be refilled
        when_below(t + self.S, self.n)(lambda: self.fetch(t + self.S))

    def product(self, first, n, acc, b_of):
        """acc += tiles first .. first + n - 1, tile first + i times b_of(i): a loop."""
        pl.loop(0, n)(lambda i: self.step(first + i, acc, b_of(i)))

"""Pallas: a tiled matmul kernel with relu fused into it.

A Pallas kernel is a function over blocks ("refs") of its operands; the
grid says how many program instances run, and each BlockSpec maps a
program's index (i, j, k) to the block of an operand it sees. Here program
(i, j, k) multiplies A's block (i, k) by B's block (k, j) and adds it into
output block (i, j), which stays put while k runs through the inner
dimension; at the last k, relu is applied to the finished block before it
is written back: the fused activation costs no extra pass over memory.

interpret=True runs the kernel in Python-level emulation: slow, but on any
backend, a CPU included, which is how the tests check it. On a GPU or TPU,
interpret=False compiles it (Triton or Mosaic).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def matmul_relu(a, b, block_m=32, block_n=32, block_k=32, interpret=True):
    """relu(a @ b) as one tiled Pallas kernel: a [M, K], b [K, N] -> float32 [M, N].

    M, N, K must be multiples of block_m, block_n, block_k. Grid
    (M // block_m, N // block_n, K // block_k); program (i, j, k) sees
    a's block (i, k), b's block (k, j) and the output block (i, j).
    At k == 0 the output block starts at zero; every k adds
    a_block @ b_block; at the last k the block becomes relu of itself.
    Hint: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((M, N),
    jnp.float32), grid=..., in_specs=[pl.BlockSpec((block_m, block_k),
    lambda i, j, k: (i, k)), ...], out_specs=..., interpret=interpret)(a, b);
    inside the kernel, pl.program_id(2), pl.num_programs(2), and @pl.when(cond)
    on a small function to run it only when cond holds.
    """
    raise NotImplementedError

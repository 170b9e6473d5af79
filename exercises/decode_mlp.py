"""Mosaic GPU: fuse the norm into a matrix-vector product, as decode's kernels do.

A decode step multiplies a few tokens x [B, E] by each weight; before the MLP's
first matrix the residual goes through RMSNorm. Written in XLA that is two
kernels, and the normalised x makes a round trip through memory between them.
Fused, one kernel reads x once, normalises it where it sits and multiplies:
sessions/kernels/decode_mlp.py does this, the whole MLP half of a layer in one kernel.

Mosaic GPU (jax.experimental.pallas.mosaic_gpu, "plgpu") is Pallas' backend for
NVIDIA's Hopper GPUs. A kernel is a function of refs: its inputs and outputs in
global memory (GMEM, the GPU's HBM) and scratch buffers in shared memory (SMEM,
on the chip, beside the cores). The Tensor Memory Accelerator (TMA) copies whole
tiles between the two, asynchronously: plgpu.copy_gmem_to_smem(src, dst,
barrier) starts a copy and plgpu.barrier_wait(barrier) waits for it;
plgpu.copy_smem_to_gmem(src, dst) writes back, after plgpu.commit_smem() has
made the kernel's own SMEM writes visible to the TMA, and
plgpu.wait_smem_to_gmem(0) waits for the write. Reading a ref (x_smem[...])
loads it into registers, where jnp's element-wise ops and sums run.

On a CPU, Mosaic GPU's own interpreter runs the kernel: plgpu.kernel(...,
interpret=<its params>) (plgpu.InterpretGPUParams() in JAX 0.12; the tests pass
it in, for whichever JAX runs them). interpret=None compiles it for a GPU.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu


def norm_matvec(x, scale, w, interpret, eps=1e-6):
    """rms_norm(x, scale) @ w^T in one Mosaic GPU kernel, one thread block:
    x [B, E] bfloat16, scale [E] bfloat16, w [F, E] bfloat16 (decode's layout,
    [out, in]) -> h float32 [B, F], the einsum "BE,FE->BF" of the normalised x.

    The norm is the model's (rms_norm in sessions/model/transformer.py): in float32,
    x * rsqrt(mean over E of x^2 + eps) * scale, rounded to bfloat16; the product
    sums over E in float32. All of it inside the kernel: x, scale and w copied
    into SMEM by TMA, the norm and the product in registers, h written back.
    Hint: plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((B, F), jnp.float32),
    scratch_types=[plgpu.SMEM(x.shape, x.dtype), ..., plgpu.SMEM((B, F),
    jnp.float32), plgpu.Barrier(num_arrivals=3)], interpret=interpret)(x, scale,
    w), where body(x_gmem, scale_gmem, w_gmem, h_gmem, x_smem, ..., barrier) takes
    the inputs, the output, then the scratch buffers; three copies arrive on one
    barrier. The product as multiply-and-reduce: (xn[:, None, :] * w[None]).sum(-1).
    """
    raise NotImplementedError

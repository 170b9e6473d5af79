"""Flash attention's forward as a Mosaic GPU kernel: the same algorithm, Hopper's machinery.

sessions/kernels/flash.py's kernel is written once for every chip and lowered through
Triton on an NVIDIA GPU. This is its forward for the backend JAX keeps, Mosaic
GPU (`jax.experimental.pallas.mosaic_gpu`, plgpu), which compiles for Hopper
(sm_90a) and later only (flash.py's note says what fails before). The algorithm
is flash.online_softmax's; the machine is spelled out:

    one program   a (batch, head, 64-query tile), run by one warpgroup (128
                  threads that issue each operation together)
    q             copied once by TMA (Hopper's copy engine) into shared memory
    k^T, v        block j+1's copies land in one shared-memory slot while block
                  j is multiplied from the other (double buffering); each copy
                  signals a barrier the warpgroup waits on before reading
    s = q k^T     plgpu.wgmma, the tensor cores' asynchronous matmul, from
                  shared memory into float32 registers (plgpu.ACC)
    p v           p cast to bf16 for the second wgmma
    causal skip   the loop's bound: blocks past the tile's last query are never
                  copied

bf16 only, forward only: the backward stays flash.flash_backward, plain JAX,
from the lse this kernel writes. On a CPU it runs in Mosaic GPU's interpreter,
which simulates shared memory, TMA, barriers and wgmma (JAX 0.10.2 and 0.12).
JAX's FlashAttention-3 (jax/experimental/pallas/ops/gpu/attention_mgpu.py) is
this at full speed: two compute warpgroups and one that only copies.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.errors import UsageError

BLOCK_Q = 64  # one warpgroup's wgmma tile: 64 rows (4 warps x 16)
HEAD_DIMS = (64, 128)  # multiples of 64: a 128-byte swizzled row of bf16
BLOCK_KS = (64, 128)
SLOTS = 2  # key/value buffers in shared memory: one in use, one landing


def check_shapes(D, dtype, block_q, block_k):
    """UsageError, one line, for what the kernel does not take."""
    name = "the Mosaic GPU flash kernel"
    if jnp.dtype(dtype) != jnp.bfloat16:
        raise UsageError(f"{name} takes bfloat16 only, not {jnp.dtype(dtype).name}")
    if D not in HEAD_DIMS:
        raise UsageError(f"{name} takes head dims 64 and 128, not {D}")
    if block_q != BLOCK_Q:
        raise UsageError(f"{name} takes query blocks of {BLOCK_Q} (one warpgroup), not {block_q}")
    if block_k not in BLOCK_KS:
        raise UsageError(f"{name} takes key blocks of 64 and 128, not {block_k}")


def mosaic_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *scratch, block_k, interpreted):
    """One (batch, head, query tile). The refs are the whole arrays in global
    memory; scratch is shared memory and the barriers its copies signal."""
    q_smem, k_smem, v_smem, p_smem, lse_smem, q_landed, k_landed, v_landed = scratch
    D = q_ref.shape[-1]
    WGMMA = plgpu.Layout.WGMMA  # how wgmma's accumulator spreads over the 128 threads

    def laid_out(x, layout):  # JAX 0.10's interpreter cannot evaluate layout_cast
        return x if interpreted else plgpu.layout_cast(x, layout)

    b, h, i = (jax.lax.axis_index(n) for n in ("b", "h", "i"))
    rows = pl.ds(i * BLOCK_Q, BLOCK_Q)
    # The causal skip: blocks from n_blocks on lie above the diagonal.
    n_blocks = jax.lax.div((i + 1) * BLOCK_Q - 1, block_k) + 1

    def fetch(j, slot):  # start block j's copies into `slot`; they signal its barriers
        keys = pl.ds(j * block_k, block_k)
        plgpu.copy_gmem_to_smem(k_ref.at[b, h, :, keys], k_smem.at[slot], k_landed.at[slot])
        plgpu.copy_gmem_to_smem(v_ref.at[b, h, keys], v_smem.at[slot], v_landed.at[slot])

    plgpu.copy_gmem_to_smem(q_ref.at[b, h, rows], q_smem, q_landed)
    fetch(0, 0)
    plgpu.barrier_wait(q_landed)

    def visit(j, carry):
        m, total, acc = carry
        slot = jax.lax.rem(j, SLOTS)

        # The other slot was last read by block j-1's wgmmas, which have finished.
        @pl.when(j + 1 < n_blocks)
        def _():
            fetch(j + 1, 1 - slot)

        plgpu.barrier_wait(k_landed.at[slot])

        def scores(s_acc):
            plgpu.wgmma(s_acc, q_smem, k_smem.at[slot])
            return s_acc[...]  # reading the accumulator waits for the wgmma

        s = pl.run_scoped(scores, plgpu.ACC((BLOCK_Q, block_k), jnp.float32))
        q_pos = laid_out(jax.lax.broadcasted_iota(jnp.int32, s.shape, 0), WGMMA)
        k_pos = laid_out(jax.lax.broadcasted_iota(jnp.int32, s.shape, 1), WGMMA)
        s = jnp.where(k_pos + j * block_k <= q_pos + i * BLOCK_Q, s * D**-0.5, -jnp.inf)
        # Row sums of the accumulator's layout: each row spread over 4 threads.
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - jax.lax.broadcast_in_dim(m_new, s.shape, [0]))
        rescale = jnp.exp(m - m_new)  # 0 on the first block (m = -inf); key 0 is in every row
        total = total * rescale + p.sum(axis=1)
        # p in bf16 through shared memory: JAX 0.12's interpreter takes wgmma's A only
        # from there ("Expected shape (6,) but got (64, 64)" from registers), though
        # the chip can multiply it from registers, as JAX's FlashAttention-3 does.
        p_smem[...] = p.astype(jnp.bfloat16)
        plgpu.commit_smem()  # make the threads' stores visible to the tensor cores
        plgpu.barrier_wait(v_landed.at[slot])

        def values(pv_acc):
            plgpu.wgmma(pv_acc, p_smem, v_smem.at[slot])
            return pv_acc[...]

        pv = pl.run_scoped(values, plgpu.ACC((BLOCK_Q, D), jnp.float32))
        acc = acc * jax.lax.broadcast_in_dim(rescale, acc.shape, [0]) + pv
        return m_new, total, acc

    # The loop's carries in the accumulator's register layout: a row's numbers
    # stay in the threads that hold its scores.
    m = laid_out(jnp.full((BLOCK_Q,), -jnp.inf, jnp.float32), WGMMA.reduce(1))
    total = laid_out(jnp.zeros((BLOCK_Q,), jnp.float32), WGMMA.reduce(1))
    acc = laid_out(jnp.zeros((BLOCK_Q, D), jnp.float32), WGMMA)
    m, total, acc = jax.lax.fori_loop(0, n_blocks, visit, (m, total, acc))

    # out and lse leave through shared memory (q's tile, no longer needed) by TMA.
    q_smem[...] = (acc / jax.lax.broadcast_in_dim(total, acc.shape, [0])).astype(jnp.bfloat16)
    lse_smem[...] = m + jnp.log(total)  # what flash.flash_backward rebuilds p from
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, o_ref.at[b, h, rows])
    plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


def interpreter():
    """Mosaic GPU's interpreter: runs a kernel on a CPU, simulating shared memory,
    TMA, barriers and wgmma. Public in JAX 0.12, private in 0.10."""
    try:
        return plgpu.InterpretGPUParams()
    except AttributeError:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        return InterpretGPUParams()


def mosaic_forward(q, k, v, block_k=128, interpret=None):
    """The kernel over a grid of (B, H, S / 64). q, k, v bf16 [B, H, S, D], S a
    multiple of block_k -> (out [B, H, S, D], lse float32 [B, H, S, 1]).
    interpret: None to compile for the GPU, or the interpreter's params."""
    B, H, S, D = q.shape
    check_shapes(D, q.dtype, BLOCK_Q, block_k)
    assert S % block_k == 0, (S, block_k)  # flash.flash_attention pads S
    # k stored [B, H, D, S] (as the decode cache keeps it): each block's k^T is then
    # a plain TMA box that wgmma reads as is. (A transposed view of a [block_k, D]
    # tile, as JAX's kernels use, compiles too, but JAX 0.10's interpreter fails on
    # it: "'TransposeTransform' object has no attribute 'indices'".)
    k_t = jnp.swapaxes(k, 2, 3)
    # wgmma reads shared memory in 8 x 64 tiles, each 128-byte row swizzled
    # so that the 8 rows of a tile sit in different banks.
    layout = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def smem(*shape):
        return plgpu.SMEM(shape, jnp.bfloat16, transforms=layout)

    out, lse = plgpu.kernel(
        functools.partial(mosaic_kernel, block_k=block_k, interpreted=interpret is not None),
        out_type=(
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((B, H, S), jnp.float32),
        ),
        scratch_types=(
            smem(BLOCK_Q, D),
            smem(SLOTS, D, block_k),
            smem(SLOTS, block_k, D),
            smem(BLOCK_Q, block_k),
            plgpu.SMEM((BLOCK_Q,), jnp.float32),
            plgpu.Barrier(),
            plgpu.Barrier(num_barriers=SLOTS),
            plgpu.Barrier(num_barriers=SLOTS),
        ),
        grid=(B, H, S // BLOCK_Q),
        grid_names=("b", "h", "i"),
        interpret=interpret,
    )(q, k_t, v)
    return out, lse[..., None]

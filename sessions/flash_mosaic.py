"""Flash attention's forward as a Mosaic GPU kernel: the same algorithm, Hopper's machinery.

sessions/flash.py's kernel is written once for every chip and lowered through
Triton on an NVIDIA GPU. This is its forward written for the backend JAX keeps,
Mosaic GPU (`jax.experimental.pallas.mosaic_gpu`, plgpu), which compiles for
Hopper (sm_90a) and later only. The algorithm is flash.online_softmax's; what
changes is that the machine is spelled out:

    one program   a (batch, head, 64-query tile), run by one warpgroup (128
                  threads issuing each operation together)
    q             copied once by TMA (Hopper's copy engine) into shared memory
    k, v blocks   copied by TMA into two shared-memory slots each: block j+1
                  lands while block j is multiplied (double buffering); each
                  copy signals a barrier the warpgroup waits on before reading
    s = q k^T     plgpu.wgmma, the tensor cores' asynchronous matmul, B (k^T)
                  read straight from shared memory, the float32 result in
                  registers (plgpu.ACC)
    p v           p cast to bf16 in registers for the second wgmma
    causal skip   the loop's bound: key blocks past the tile's last query are
                  never copied

bf16 only, forward only: the backward stays flash.flash_backward, plain JAX,
from the lse this kernel writes. Shapes as flash.flash_forward: q, k, v
[B, H, S, D] -> (out [B, H, S, D], lse float32 [B, H, S, 1]).
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


def check_shapes(S, D, dtype, block_k):
    """UsageError, one line, for what the kernel does not take."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        raise UsageError(f"the Mosaic GPU flash kernel takes bfloat16 only, not {dtype}")
    if D not in HEAD_DIMS:
        raise UsageError(f"the Mosaic GPU flash kernel takes head dims 64 and 128, not {D}")
    if block_k not in BLOCK_KS:
        raise UsageError(f"the Mosaic GPU flash kernel takes key blocks 64 and 128, not {block_k}")
    if S % block_k:
        raise UsageError(f"the Mosaic GPU flash kernel needs S a multiple of {block_k}, not {S}")


def transposed(ref):
    """ref's two axes swapped, without a copy: wgmma reads it as k^T. (JAX 0.12
    spells it ref.transpose; 0.10 had only plgpu.transpose_ref, deprecated in 0.12.)"""
    if hasattr(ref, "transpose"):
        return ref.transpose((1, 0))
    return plgpu.transpose_ref(ref, (1, 0))


def forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *scratch, block_k):
    """One (batch, head, query tile). The refs are the whole arrays in global
    memory; scratch is shared memory and the barriers its copies signal."""
    q_smem, k_smem, v_smem, lse_smem, q_landed, k_landed, v_landed = scratch
    D = q_ref.shape[-1]
    b, h, i = (jax.lax.axis_index(n) for n in ("b", "h", "i"))
    rows = pl.ds(i * BLOCK_Q, BLOCK_Q)
    # The causal skip: blocks from n_blocks on lie above the diagonal.
    n_blocks = jax.lax.div((i + 1) * BLOCK_Q - 1, block_k) + 1

    def fetch(j, slot):  # start block j's copies into `slot`; they signal its barriers
        keys = (b, h, pl.ds(j * block_k, block_k))
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[slot], k_landed.at[slot])
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[slot], v_landed.at[slot])

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
            plgpu.wgmma(s_acc, q_smem, transposed(k_smem.at[slot]))
            return s_acc[...]  # reading the accumulator waits for the wgmma

        s = pl.run_scoped(scores, plgpu.ACC((BLOCK_Q, block_k), jnp.float32))
        q_pos = plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA)
        k_pos = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
        s = jnp.where(k_pos + j * block_k <= q_pos + i * BLOCK_Q, s * D**-0.5, -jnp.inf)
        # Row sums of the accumulator's layout: each row spread over 4 threads.
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - jax.lax.broadcast_in_dim(m_new, s.shape, [0]))
        rescale = jnp.exp(m - m_new)  # 0 on the first block (m = -inf); key 0 is in every row
        total = total * rescale + p.sum(axis=1)
        acc = acc * jax.lax.broadcast_in_dim(rescale, acc.shape, [0])

        plgpu.barrier_wait(v_landed.at[slot])

        def add_pv(acc_ref):
            plgpu.wgmma(acc_ref, p.astype(jnp.bfloat16), v_smem.at[slot])

        acc = pl.run_state(add_pv)(plgpu.ACC.init(acc))
        return m_new, total, acc

    m = plgpu.layout_cast(jnp.full((BLOCK_Q,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    total = plgpu.layout_cast(jnp.zeros((BLOCK_Q,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
    acc = plgpu.layout_cast(jnp.zeros((BLOCK_Q, D), jnp.float32), plgpu.Layout.WGMMA)
    m, total, acc = jax.lax.fori_loop(0, n_blocks, visit, (m, total, acc))

    # out and lse leave through shared memory (q's tile, no longer needed) by TMA.
    q_smem[...] = (acc / jax.lax.broadcast_in_dim(total, acc.shape, [0])).astype(jnp.bfloat16)
    lse_smem[...] = m + jnp.log(total)  # what flash.flash_backward rebuilds p from
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, o_ref.at[b, h, rows])
    plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


def mosaic_forward(q, k, v, block_k=128, interpret=None):
    """The kernel over a grid of (B, H, S / 64). q, k, v bf16 [B, H, S, D], S a
    multiple of block_k -> (out [B, H, S, D], lse float32 [B, H, S, 1]).
    interpret: None to compile for the GPU, or the interpreter's params."""
    B, H, S, D = q.shape
    check_shapes(S, D, q.dtype, block_k)
    # wgmma reads shared memory in 8 x 64 tiles, each 128-byte row swizzled
    # so that the 8 rows of a tile sit in different banks.
    layout = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def smem(*shape):
        return plgpu.SMEM(shape, jnp.bfloat16, transforms=layout)

    out, lse = plgpu.kernel(
        functools.partial(forward_kernel, block_k=block_k),
        out_type=(
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((B, H, S), jnp.float32),
        ),
        scratch_types=(
            smem(BLOCK_Q, D),
            smem(SLOTS, block_k, D),
            smem(SLOTS, block_k, D),
            plgpu.SMEM((BLOCK_Q,), jnp.float32),
            plgpu.Barrier(),
            plgpu.Barrier(num_barriers=SLOTS),
            plgpu.Barrier(num_barriers=SLOTS),
        ),
        grid=(B, H, S // BLOCK_Q),
        grid_names=("b", "h", "i"),
        interpret=interpret,
    )(q, k, v)
    return out, lse[..., None]

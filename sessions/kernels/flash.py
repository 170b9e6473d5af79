"""Flash attention from first principles: online softmax, then our own Pallas kernel.

Causal attention (sessions/model/attention.py) writes the scores [B, H, S, T] to memory,
S·T floats per head, to take a softmax over T. Flash attention never does: it walks
the keys one block at a time and keeps, for each query row, three running numbers

    m      the largest score seen so far            (so exp() never overflows)
    total  sum of exp(score - m) so far            (the softmax's denominator, l)
    acc    sum of exp(score - m) * v so far, [D]     (the numerator)

When a new block raises the maximum from m to m', everything kept so far is
rescaled by exp(m - m'); at the end out = acc / l. `online_softmax` is that idea in
plain JAX; `flash_attention` is it in a Pallas kernel, one program per
(batch, head, query block), with its own backward.

Shapes: q, k, v [B, S, H, D] (self-attention: T = S), out [B, S, H, D].

On NVIDIA GPUs the kernel is lowered through Triton, asked for by name, and its
float32 dots run as TF32 there (Triton's DEFAULT precision; sessions/kernels/precision.py).
JAX 0.11.0 (16 July 2026) deprecated Pallas's Triton backend: it "will be removed
in a future version of JAX"; to keep Pallas on a GPU, "migrate to the Mosaic GPU
backend" (docs/pallas/CHANGELOG.md in jax-ml/jax). JAX 0.12.0.1, CI's newest leg,
still lowers it, with a DeprecationWarning ("jax-pallas-triton") at each lowering
(jax/_src/pallas/triton/pallas_call_registration.py), and it compiles for h100:1
with JAX 0.10.2's compilers (tests/test_flash.py). No release is named for the
removal. JAX may remove a deprecated API three months after the release that
deprecated it at the earliest, so from mid-October 2026, and promises less for
jax.experimental (docs/api_compatibility.md); JAX's own Triton kernels in
pallas/ops/gpu are deprecated too, for tokamax (the changelog after 0.11). The
backward is plain JAX and does not depend on it.

Mosaic GPU, the backend JAX keeps (`jax.experimental.pallas.mosaic_gpu`), is
for Hopper (sm_90) and later only. Compiled without a GPU by JAX 0.10.2's CUDA
plugin for XLA's A100 target and for it with compute capability 8.9 (an L4) or
7.5 (a T4): a Mosaic GPU kernel with one TMA copy fails ("error:
'nvvm.cp.async.bulk.wait_group' op is not supported on sm_80", then "INTERNAL:
Pass pipeline failed"), one that only loads and stores registers aborts the
process ("LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.elect.sync"); both
compile for h100:1. This file's Triton path compiles for sm_80 and sm_89; for
sm_75 Triton refuses ("Triton support is only enabled for Ampere GPUs (compute
capability 8.0) and up"). So a port cannot replace the Triton path: an A100 or
an L4 (Colab's) would lose the kernel; a T4 has neither. Triton stays the
default on NVIDIA while JAX lowers it. impl="mosaic" runs the forward of
sessions/kernels/flash_mosaic.py instead, on sm_90 and later ("mosaic-interpreted": in
Mosaic GPU's interpreter on a CPU): the same algorithm, the same backward. When
JAX removes Triton, Ampere and Ada GPUs need another path (XLA's attention).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from sessions.errors import UsageError
from sessions.kernels import flash_mosaic

HEAD_DIMS = (64, 128)  # what the kernel takes: one TPU lane row (128) or half of one
MAX_TILE = 128  # queries x keys per tile: 128 fills a TPU's MXU and suits an H100's SM
MIN_TILE = 16  # Triton's smallest matmul side
IMPLS = ("pallas", "mosaic", "mosaic-interpreted")  # ours on every chip; the Hopper forward
MASKED = -1e30  # a large negative score, not -inf: exp() of it is 0, never NaN


def online_softmax(q, k, v, block_k):
    """Softmax attention of one block of queries over all keys, one key block at a
    time (no causal mask: the idea alone). q: [S, D], k, v: [T, D] -> [S, D]."""
    S, D = q.shape
    m = jnp.full((S,), -jnp.inf)  # running max of each row's scores
    total = jnp.zeros((S,))  # running sum of exp(score - m)
    acc = jnp.zeros((S, D))  # running sum of exp(score - m) * v
    for start in range(0, k.shape[0], block_k):
        s = q @ k[start : start + block_k].T * D**-0.5  # [S, block_k]
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - m_new[:, None])
        rescale = jnp.exp(m - m_new)  # what exp(score - m) was worth, now m has grown
        total = total * rescale + p.sum(axis=1)
        acc = acc * rescale[:, None] + p @ v[start : start + block_k]
        m = m_new
    return acc / total[:, None]


def default_tiles(S):
    """(block_q, block_k): 128 x 128, or the sequence rounded up to a power of two
    when it is shorter (a tiny run on a CPU then takes one tile, not a padded 128)."""
    tile = min(MAX_TILE, max(MIN_TILE, 1 << (S - 1).bit_length()))
    return tile, tile


def check_flash_shapes(D, block_q, block_k):
    """UsageError, one line, for a head dim or tiles the kernel does not take."""
    if D not in HEAD_DIMS:
        raise UsageError(
            f"flash attention takes head dims {' and '.join(map(str, HEAD_DIMS))}, not {D}"
        )
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        # Powers of two: Triton loads and stores only those; from 16: its smallest matmul.
        if b < MIN_TILE or b & (b - 1):
            raise UsageError(f"flash attention {name} must be a power of two from 16, not {b}")


def forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, block_k):
    """One (batch, head, query block): q_ref [block_q, D], k_ref, v_ref [T, D] (the
    head's keys, read one block at a time), o_ref [block_q, D], lse_ref [block_q, 1]."""
    block_q, D = q_ref.shape
    i = pl.program_id(2)
    q = q_ref[...]
    rows = i * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def visit(j, carry):
        m, total, acc = carry
        k = k_ref[pl.ds(pl.multiple_of(j * block_k, block_k), block_k), :]
        v = v_ref[pl.ds(pl.multiple_of(j * block_k, block_k), block_k), :]
        # Scores in float32 even for bf16 q, k (as einsum_attention).
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = jnp.where(cols + j * block_k <= rows, s * D**-0.5, MASKED)  # [block_q, block_k]
        m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        rescale = jnp.exp(m - m_new)
        total = total * rescale + p.sum(axis=1, keepdims=True)
        pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, total, acc * rescale + pv

    # The causal skip: key blocks past this query block's last position are never read.
    # (lax.div: the positions are non-negative, so no floor division's sign fix-up,
    # which Mosaic would need the chip's generation to lower)
    n_blocks = jax.lax.div((i + 1) * block_q - 1, block_k) + 1
    m = jnp.full((block_q, 1), MASKED, jnp.float32)
    total = jnp.zeros((block_q, 1), jnp.float32)
    acc = jnp.zeros((block_q, D), jnp.float32)
    m, total, acc = jax.lax.fori_loop(0, n_blocks, visit, (m, total, acc))
    o_ref[...] = (acc / total).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(total)  # all the backward needs to rebuild the probabilities


def flash_forward(q, k, v, block_q, block_k, interpret=False, compiler_params=None):
    """The kernel over a grid of (B, H, query blocks). q, k, v: [B, H, S, D], S a
    multiple of both tiles -> (out [B, H, S, D], lse float32 [B, H, S, 1])."""
    B, H, S, D = q.shape
    query_block = pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0))
    # A head's keys and values whole: a GPU program (Triton) loads from memory only
    # the blocks the loop visits. A TPU copies them into its VMEM first, once per
    # head (their block index does not change along the query blocks, so the
    # pipeline fetches nothing new), which bounds S: 4096 x 128 bf16 is 1 MiB each.
    whole_head = pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, h, 0, 0))
    lse_block = pl.BlockSpec((None, None, block_q, 1), lambda b, h, i: (b, h, i, 0))
    return pl.pallas_call(
        functools.partial(forward_kernel, block_k=block_k),
        grid=(B, H, S // block_q),
        in_specs=[query_block, whole_head, whole_head],
        out_specs=[query_block, lse_block],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((B, H, S, 1), jnp.float32),
        ],
        interpret=interpret,
        name="flash_forward",  # roofline/compiled/op_flops.py finds the kernel by this name
        compiler_params=compiler_params,
    )(q, k, v)


def on_any_platform(q, k, v, block_q, block_k, impl="pallas"):
    """The kernel lowered for the platform the step is compiled for, which need not
    be this machine's: Mosaic on a TPU; Triton on an NVIDIA GPU (asked for by name:
    JAX's default there is Mosaic GPU, which wants layouts spelled out for the
    warpgroup's registers); on a CPU, which has no Pallas compiler, interpreted.
    impl "mosaic" and "mosaic-interpreted": flash_mosaic's kernel, chosen by name
    (not by platform_dependent, as the interpreter's callbacks would then reach
    the GPU's program too)."""
    if impl != "pallas":
        interpret = flash_mosaic.interpreter() if impl == "mosaic-interpreted" else None
        return flash_mosaic.mosaic_forward(q, k, v, block_k, interpret)
    kernel = functools.partial(flash_forward, block_q=block_q, block_k=block_k)
    triton = pltriton.CompilerParams(num_warps=4, num_stages=2)  # JAX's GPU kernels' defaults
    return jax.lax.platform_dependent(
        q,
        k,
        v,
        cpu=functools.partial(kernel, interpret=True),
        cuda=functools.partial(kernel, compiler_params=triton),
        default=kernel,
    )


def flash_backward(q, k, v, o, lse, do, block_q, block_k):
    """dq, dk, dv from the saved lse, in plain JAX, one (query block, key block) tile
    at a time. All [B, H, S, D]; lse [B, H, S, 1].

    Plain JAX rather than a second kernel: it compiles unchanged for every chip and
    reads as the math. It still never holds more than one tile of probabilities,
    [B, H, block_q, block_k], never [B, H, S, T]: each is rebuilt from q, k and
    lse as p = exp(s - lse). Like the forward it skips the tiles above the diagonal
    (the inner loop starts at the key block's first query block)."""
    D = q.shape[-1]
    S = q.shape[2]
    scale = D**-0.5
    # delta = rowsum(dO * O) = sum_t p * dp: the softmax's backward, per query row.
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)

    def tile(x, start, size):
        return jax.lax.dynamic_slice_in_dim(x, start, size, axis=2)

    def key_block(dq, j):
        kj, vj = tile(k, j * block_k, block_k), tile(v, j * block_k, block_k)

        def query_block(i, carry):
            dq, dk, dv = carry
            qi, doi = tile(q, i * block_q, block_q), tile(do, i * block_q, block_q)
            s = jnp.einsum("BHSD,BHTD->BHST", qi, kj, preferred_element_type=jnp.float32)
            rows = i * block_q + jnp.arange(block_q)[:, None]
            cols = j * block_k + jnp.arange(block_k)[None, :]
            p = jnp.where(cols <= rows, jnp.exp(s * scale - tile(lse, i * block_q, block_q)), 0.0)
            dv = dv + jnp.einsum(
                "BHST,BHSD->BHTD", p.astype(do.dtype), doi, preferred_element_type=jnp.float32
            )
            dp = jnp.einsum("BHSD,BHTD->BHST", doi, vj, preferred_element_type=jnp.float32)
            ds = p * (dp - tile(delta, i * block_q, block_q)) * scale
            dk = dk + jnp.einsum(
                "BHST,BHSD->BHTD", ds.astype(q.dtype), qi, preferred_element_type=jnp.float32
            )
            dqi = jnp.einsum(
                "BHST,BHTD->BHSD", ds.astype(k.dtype), kj, preferred_element_type=jnp.float32
            )
            dq = jax.lax.dynamic_update_slice_in_dim(
                dq, tile(dq, i * block_q, block_q) + dqi, i * block_q, axis=2
            )
            return dq, dk, dv

        zeros = jnp.zeros(kj.shape, jnp.float32)
        first = (j * block_k) // block_q  # query blocks above it see none of these keys
        dq, dk, dv = jax.lax.fori_loop(first, S // block_q, query_block, (dq, zeros, zeros))
        return dq, (dk, dv)

    dq = jnp.zeros(q.shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(key_block, dq, jnp.arange(S // block_k))
    # scan stacks each key block's dk, dv: [n_blocks, B, H, block_k, D] -> [B, H, S, D]
    dk, dv = (jnp.moveaxis(x, 0, 2).reshape(k.shape) for x in (dk, dv))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def flash_heads_first(q, k, v, block_q, block_k, impl):
    """Causal attention of q, k, v [B, H, S, D] (S a multiple of both tiles)."""
    return on_any_platform(q, k, v, block_q, block_k, impl)[0]


def flash_heads_first_fwd(q, k, v, block_q, block_k, impl):
    o, lse = on_any_platform(q, k, v, block_q, block_k, impl)
    return o, (q, k, v, o, lse)  # O(S·D) per head kept for the backward, not O(S·T)


def flash_heads_first_bwd(block_q, block_k, impl, saved, do):
    return flash_backward(*saved, do, block_q, block_k)


flash_heads_first.defvjp(flash_heads_first_fwd, flash_heads_first_bwd)


def flash_attention(q, k, v, *, block_q=None, block_k=None, impl="pallas"):
    """Causal attention, q, k, v [B, S, H, D] -> [B, S, H, D], in our Pallas kernel.

    impl: "pallas", this file's kernel on every platform; "mosaic", the Mosaic
    GPU forward for sm_90 and later; "mosaic-interpreted", that in Mosaic GPU's
    interpreter on a CPU. Tiles default to `default_tiles(S)` (Mosaic GPU: 64 x
    128, or 64 x 64 for S up to 64). Any S: the sequence is padded with zeros up
    to a multiple of both tiles. The causal mask alone keeps the padding out of
    every real row, as padded keys come after every real query."""
    S, D = q.shape[1], q.shape[3]
    if impl not in IMPLS:
        raise UsageError(f"flash attention's impl is one of {', '.join(IMPLS)}, not {impl}")
    if impl != "pallas":
        block_q, block_k = block_q or flash_mosaic.BLOCK_Q, block_k or (64 if S <= 64 else 128)
        flash_mosaic.check_shapes(D, q.dtype, block_q, block_k)
    else:
        default_q, default_k = default_tiles(S)
        block_q, block_k = block_q or default_q, block_k or default_k
        check_flash_shapes(D, block_q, block_k)
    padded = -(-S // math.lcm(block_q, block_k)) * math.lcm(block_q, block_k)

    def heads_first(x):  # [B, S, H, D] -> [B, H, padded S, D]: the kernel's tiles are [S, D]
        return jnp.pad(jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, padded - S), (0, 0)))

    out = flash_heads_first(*map(heads_first, (q, k, v)), block_q, block_k, impl)
    return jnp.swapaxes(out[:, :, :S], 1, 2)

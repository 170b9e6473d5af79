"""How every decode kernel starts: x plus the pending partial sums, then the norm.

The contract between the kernels (sessions/inference/kernel_step.py): a kernel
gets x [B, E] and P partials [P, B, E] float32 that the kernel before it left,
adds them in float32 in order, rounds once to bf16 (x_now) and norms it. The
tokens sit in wgmma's N, 8 wide (decode_mlp.py says why): x_now is [8, E] in
SMEM, its transpose a product's B operand. Every CTA does this itself (B·E
numbers, from L2) and CTA 0 writes x_now out.

The partials stream through a ring of their own (`depth` slots, each a chunk
[8, C] float32 of one partial): `depth` copies in flight, a slot refilled as soon as
every thread has read it, not one copy waited for at a time. Each chunk of x is
summed over all P partials before the next (x_now's chunk i = x's + each partial's
chunk i, in order), so a loop over the chunks holds one chunk in registers, and the
code is one loop body whatever E and P are, not E/C x P unrolled copies of it.

Flash decoding's partials (decode_attention.py) are weighted. The attention
kernel splits the cache's T into S slices, and the CTA of query head h and slice
s leaves partial p = h·S + s: its slice's softmax output, unnormalised, through
its head's columns of wo, with the slice's running max m_p and sum l_p (stats
[P, 2, 8] float32, a row per token). The log-sum-exp merge weighs each:

    M_h = max over h's slices of m_p,  L_h = sum over them of exp(m_p - M_h) l_p
    w_p = exp(m_p - M_h) / L_h,        x_now = x + w_0 partial_0 + w_1 partial_1 + ...

An empty slice (no cache slot < pos in it) has m = -1e30 and l = 0: weight 0.
Partials without stats (the MLP's) weigh 1. `settle` is the same sum in XLA.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import mosaic

ROWS = 8  # the tokens padded to wgmma's smallest N
EPS = 1e-6  # transformer.rms_norm's
EMPTY = -1e30  # an empty slice's running max: finite, so exp(EMPTY - M) is 0, never NaN
WT = plgpu.Layout.WGMMA_TRANSPOSED  # [C, 8] in registers, read from an [8, C] buffer's transpose


def pos_and_live(step, run):
    """(pos, live) inside a kernel, from the refs of its clock (kernel_step.clock): step
    [1] holds i, run [2] (start, n): pos = start + i, live = i < n."""
    i = step[0]
    return run[0] + i, i < run[1]


def swizzled(dtype):
    """The SMEM layout wgmma reads: 8-row tiles of 128 bytes, swizzled (no bank conflicts)."""
    elems = 128 // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(128))


def load_t(ref, layout=WT):
    """ref's contents in registers, in `layout` (JAX 0.10's plgpu.load takes an index)."""
    if "idx" in inspect.signature(plgpu.load).parameters:
        return plgpu.load(ref, (), layout=layout, optimized=False)
    return plgpu.load(ref, layout=layout, optimized=False)


def chunk(E):
    """Columns one TMA copy of a row block moves: 128, or 64 where E is no multiple of 128.
    Not more at larger E: each loop's body works on one chunk, so a kernel's code is the
    same size at any E (tests/test_kernel_sizes.py)."""
    return 128 if E % 128 == 0 else 64


def copy_rows_in(src, dst, barrier):
    """src [B, E] in GMEM -> the first B rows of dst [E/C, 8, C] in SMEM, one copy
    per C columns (each C x 8 block contiguous, as TMA needs); barrier counts E/C."""
    C, rows = dst.shape[-1], (pl.ds(0, src.shape[0]),) if src.ndim == 2 else ()

    @pl.loop(0, dst.shape[0])
    def _(i):
        plgpu.copy_gmem_to_smem(src.at[..., pl.ds(i * C, C)], dst.at[(i, *rows)], barrier)


def copy_rows_out(src, dst):
    """The first B rows of src [E/C, 8, C] in SMEM -> dst [B, E] in GMEM."""
    C = src.shape[-1]

    @pl.loop(0, src.shape[0])
    def _(i):
        plgpu.copy_smem_to_gmem(src.at[i, pl.ds(0, dst.shape[0])], dst.at[:, pl.ds(i * C, C)])


def scratch(E, P, depth, dtype, weighted):
    """The SMEM start() takes besides the normed tokens: x (then x_now), the pending ring
    (a chunk [8, C] float32 a slot), the norm's scale, the stats (then the merge's
    weights), and barriers. 18·E + 32·C·depth bytes, + 64·P."""
    C = chunk(E)
    return [
        plgpu.SMEM((E // C, ROWS, C), dtype),
        plgpu.SMEM((depth, ROWS, C), jnp.float32),
        plgpu.SMEM((E // C, C), dtype),
        plgpu.SMEM((max(P, 1) if weighted else 1, 2, ROWS), jnp.float32),
        plgpu.Barrier(num_arrivals=E // C, num_barriers=2),
        plgpu.Barrier(num_arrivals=1, num_barriers=depth),
        plgpu.Barrier(num_arrivals=1),
    ]


def smem_bytes(E, P, depth, weighted):
    """start()'s SMEM (scratch above, and the normed tokens [8, E]), in bytes."""
    return 34 * E + 32 * chunk(E) * depth + (64 * max(P, 1) if weighted else 64) + 64


def start(x_in, pending_in, stats_in, scale_in, x_out, n_s, bufs, writer, slices):
    """In a CTA: x_now = x + the weighted partials (rounded to x's dtype once; the CTA whose
    int `writer` is 0 writes it to x_out), and the normed tokens into n_s ([8, E], wgmma's
    B). Loops, not unrolled: over E's chunks, and inside each over the P partials' chunk."""
    x_s, p_s, scale_s, stats_s, bars, p_bars, s_bar = bufs
    (B, E), P, depth = x_in.shape, pending_in.shape[0], p_s.shape[0]
    C = x_s.shape[-1]
    n_c = E // C
    copy_rows_in(x_in, x_s, bars.at[0])
    copy_rows_in(scale_in, scale_s, bars.at[1])
    if stats_in is not None:
        plgpu.copy_gmem_to_smem(stats_in.at[:, :, :], stats_s, s_bar)

    # The partials stream as P·E/C chunks, n = i·P + p: chunk i of partial p, into slot n % depth.
    def fetch(n):
        i, p, slot = lax.div(n, P), lax.rem(n, P), lax.rem(n, depth)
        src = pending_in.at[p, :, pl.ds(i * C, C)]
        plgpu.copy_gmem_to_smem(src, p_s.at[slot, pl.ds(0, B)], p_bars.at[slot])

    if P:
        pl.loop(0, min(depth, P * n_c))(fetch)

    if stats_in is not None:  # the merge's weights, a head's slices at a time, over m in SMEM

        @pl.loop(0, P // slices)
        def _(h):
            mine = [h * slices + s for s in range(slices)]
            m = [load_t(stats_s.at[p, 0], WT.reduce(0)) for p in mine]
            biggest = functools.reduce(jnp.maximum, m)
            scale = [jnp.exp(mp - biggest) for mp in m]
            total = sum(s * load_t(stats_s.at[p, 1], WT.reduce(0)) for s, p in zip(scale, mine))
            for s, p in zip(scale, mine):
                stats_s.at[p, 0][...] = s / total

        plgpu.commit_smem()

    def across(v, dim):  # v broadcast to [C, 8] along the other dim
        return plgpu.layout_cast(jax.lax.broadcast_in_dim(v, (C, ROWS), (dim,)), WT)

    plgpu.barrier_wait(bars.at[0])

    # Rows B..7 hold whatever SMEM held: a product's column reads one token alone.
    def sum_chunk(i, ms):  # chunk i of x_now: x + the partials, in float32 in order
        def add(p, x):
            n = i * P + p
            plgpu.barrier_wait(p_bars.at[lax.rem(n, depth)])
            part = load_t(p_s.at[lax.rem(n, depth)].T)
            if stats_in is not None:
                part = across(load_t(stats_s.at[p, 0], WT.reduce(0)), 1) * part

            @mosaic.when_below(n + depth, P * n_c)
            def _():  # refill the slot once every thread has read it
                plgpu.commit_smem()  # a warpgroup barrier (and a fence) before the TMA
                fetch(n + depth)

            return x + part

        x = load_t(x_s.at[i].T).astype(jnp.float32)
        x = jax.lax.fori_loop(0, P, add, x) if P else x
        x_now = x.astype(x_in.dtype)
        x_s.at[i].T[...] = x_now
        return ms + jnp.sum(jnp.square(x_now.astype(jnp.float32)), axis=0)  # [8]

    zero = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), WT.reduce(0))
    ms = jax.lax.fori_loop(0, n_c, sum_chunk, zero) / E
    plgpu.commit_smem()

    @mosaic.when_below(writer, 1)
    def _():
        copy_rows_out(x_s, x_out)

    # rms_norm as transformer.rms_norm computes it: float32, x * rsqrt(mean(x²) + eps) * scale.
    plgpu.barrier_wait(bars.at[1])
    r = across(jax.lax.rsqrt(ms + EPS), 1)

    @pl.loop(0, n_c)
    def _(i):
        scale = across(load_t(scale_s.at[i], WT.reduce(1)).astype(jnp.float32), 0)
        x32 = load_t(x_s.at[i].T).astype(jnp.float32)
        n_s.at[:, pl.ds(i * C, C)].T[...] = (x32 * r * scale).astype(n_s.dtype)

    plgpu.commit_smem()
    plgpu.wait_smem_to_gmem(0)  # x_now is out before x_s is reused


def merge_weights(stats, slices):
    """stats [P, 2, 8] float32 -> w [P, 8], the log-sum-exp merge's weights (above)."""
    m, total = (stats[:, i].reshape(-1, slices, ROWS) for i in (0, 1))
    scale = jnp.exp(m - m.max(axis=1, keepdims=True))
    return (scale / (scale * total).sum(axis=1, keepdims=True)).reshape(-1, ROWS)


def settle(x, pending, stats=None, slices=1):
    """x [B, E] with its partials [P, B, E] added as start() adds them, in XLA."""
    total = x.astype(jnp.float32)
    w = None if stats is None else merge_weights(stats, slices)[:, : x.shape[0], None]
    for p, partial in enumerate(pending):  # one at a time, in order
        total = total + (partial if w is None else w[p] * partial)
    return total.astype(x.dtype)

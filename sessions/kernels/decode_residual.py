"""How every decode kernel starts: x plus the pending partial sums, then the norm.

The contract between the kernels (sessions/inference/kernel_step.py): a kernel
gets x [B, E] and P partials [P, B, E] float32 that the kernel before it left,
adds them in float32 in order, rounds once to bf16 (x_now) and norms it. The
tokens sit in wgmma's N, 8 wide (decode_mlp.py says why): x_now is [8, E] in
SMEM, its transpose a product's B operand. Every CTA does this itself (B·E
numbers, from L2) and CTA 0 writes x_now out.

The partials stream through a ring of their own (`depth` slots, each [8, E]
float32 in E/C copies of C columns): `depth` of them in flight, a slot refilled as
soon as every thread has read it, not one copy waited for at a time.

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

import inspect

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

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
    """How many of E one TMA copy moves: at most 256 along a dimension."""
    return next(c for c in (256, 128, 64) if E % c == 0)


def copy_rows_in(src, dst, barrier):
    """src [B, E] in GMEM -> the first B rows of dst [E/C, 8, C] in SMEM, one copy
    per C columns (each C x 8 block contiguous, as TMA needs); barrier counts E/C."""
    for i in range(dst.shape[0]):
        rows = (pl.ds(0, src.shape[0]),) if src.ndim == 2 else ()
        C = dst.shape[-1]
        plgpu.copy_gmem_to_smem(src.at[..., pl.ds(i * C, C)], dst.at[(i, *rows)], barrier)


def copy_rows_out(src, dst):
    """The first B rows of src [E/C, 8, C] in SMEM -> dst [B, E] in GMEM."""
    n, C = src.shape[0], src.shape[-1]
    for i in range(n):
        plgpu.copy_smem_to_gmem(src.at[i, pl.ds(0, dst.shape[0])], dst.at[:, pl.ds(i * C, C)])


def scratch(E, P, depth, dtype, weighted):
    """The SMEM start() takes besides the normed tokens: x (then x_now), the pending ring,
    the norm's scale, the stats, and barriers. 18·E + 32·E·depth bytes, + 64·P."""
    C = chunk(E)
    return [
        plgpu.SMEM((E // C, ROWS, C), dtype),
        plgpu.SMEM((depth, E // C, ROWS, C), jnp.float32),
        plgpu.SMEM((E // C, C), dtype),
        plgpu.SMEM((max(P, 1) if weighted else 1, 2, ROWS), jnp.float32),
        plgpu.Barrier(num_arrivals=E // C, num_barriers=2),
        plgpu.Barrier(num_arrivals=E // C, num_barriers=depth),
        plgpu.Barrier(num_arrivals=1),
    ]


def smem_bytes(E, P, depth, weighted):
    """start()'s SMEM (scratch above, and the normed tokens [8, E]), in bytes."""
    return 34 * E + 32 * E * depth + (64 * max(P, 1) if weighted else 64) + 64


def start(x_in, pending_in, stats_in, scale_in, x_out, n_s, bufs, first, slices):
    """In a CTA: x_now = x + the weighted partials (rounded to x's dtype once; CTA `first`
    writes it to x_out), and the normed tokens into n_s ([8, E], wgmma's B)."""
    x_s, p_s, scale_s, stats_s, bars, p_bars, s_bar = bufs
    E, P, depth = x_in.shape[1], pending_in.shape[0], p_s.shape[0]
    copy_rows_in(x_in, x_s, bars.at[0])
    copy_rows_in(scale_in, scale_s, bars.at[1])
    if stats_in is not None:
        plgpu.copy_gmem_to_smem(stats_in.at[:, :, :], stats_s, s_bar)

    def fetch(p):
        copy_rows_in(pending_in.at[p], p_s.at[p % depth], p_bars.at[p % depth])

    for p in range(min(depth, P)):
        fetch(p)
    C = x_s.shape[-1]

    def merge_weights_of(h):
        """Head h's slices' weights, each [C, 8] (a column a token): computed as its first
        partial comes, not all at once, to hold few registers."""
        mine = range(h * slices, (h + 1) * slices)
        m = [load_t(stats_s.at[p, 0], WT.reduce(0)) for p in mine]
        biggest = m[0]
        for other in m[1:]:
            biggest = jnp.maximum(biggest, other)
        scale = [jnp.exp(mp - biggest) for mp in m]
        total = sum(s * load_t(stats_s.at[p, 1], WT.reduce(0)) for s, p in zip(scale, mine))
        bcast = jax.lax.broadcast_in_dim
        return [plgpu.layout_cast(bcast(s / total, (C, ROWS), (1,)), WT) for s in scale]

    if stats_in is not None:
        plgpu.barrier_wait(s_bar)
    plgpu.barrier_wait(bars.at[0])
    # Rows B..7 hold whatever SMEM held: a product's column reads one token alone.
    n_c = x_s.shape[0]
    x_t = [load_t(x_s.at[i].T).astype(jnp.float32) for i in range(n_c)]  # [C, 8] each
    for p in range(P):  # in order, in float32
        if stats_in is not None and p % slices == 0:
            weights = merge_weights_of(p // slices)
        plgpu.barrier_wait(p_bars.at[p % depth])
        part = [load_t(p_s.at[p % depth, i].T) for i in range(n_c)]
        if stats_in is not None:
            weight = weights[p % slices]
            part = [weight * v for v in part]
        x_t = [a + b for a, b in zip(x_t, part)]
        if p + depth < P:  # refill the slot once every thread has read it
            plgpu.commit_smem()  # a warpgroup barrier (and a fence) before the TMA
            fetch(p + depth)
    x_now = [x.astype(x_in.dtype) for x in x_t]
    for i in range(n_c):
        x_s.at[i].T[...] = x_now[i]
    plgpu.commit_smem()

    @pl.when(first)
    def _():
        copy_rows_out(x_s, x_out)

    # rms_norm as transformer.rms_norm computes it: float32, x * rsqrt(mean(x²) + eps) * scale.
    ms = sum(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=0) for x in x_now) / E  # [8]
    del x_t, x_now  # read again from SMEM below, a chunk at a time: fewer registers
    plgpu.barrier_wait(bars.at[1])

    def across(v, dim):  # v broadcast to [C, 8] along the other dim
        return plgpu.layout_cast(jax.lax.broadcast_in_dim(v, (C, ROWS), (dim,)), WT)

    r = across(jax.lax.rsqrt(ms + EPS), 1)
    for i in range(n_c):
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

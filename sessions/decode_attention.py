"""The attention half of a decode layer as one Mosaic GPU kernel: norm, q/k/v, cache, softmax, wo.

XLA runs a decode layer's attention half as about a dozen kernels (the norm, three
projections, the rotation, the cache writes, the softmax, the output projection),
each a launch of 2-3 us while its bytes take a fraction of that. This kernel does it
all in one launch, per the decode-kernel contract ("pending" partial sums):

    x_now   = x + sum_P pending                       the residual, rounded to bf16
    xn      = rms_norm(x_now) * attn_norm             every CTA computes it itself
    q, k, v = xn @ wq^T, wk^T, wv^T                   RoPE turns q, k at position pos
    out     = softmax(q k^T / sqrt(D)) v              over the cache's slots t < pos,
                                                      and the new token itself
    cache[.., pos] = k, v                             in place; where `live` is false, not
    pending_out[kh] = out_kh @ wo[:, heads of kh]^T   one partial sum per KV head

The grid: one CTA per KV head kh (grid K), one warpgroup each. CTA kh owns query heads
kh*G .. kh*G+G-1 (G = H/K, grouped-query attention), its slice of the cache and its
columns of wo, so no CTA waits for another: the output projection's contraction over
H*D is split into K partial sums, which the next kernel adds (x_now). CTA 0 also
writes x_now.

The products run on the tensor cores (wgmma), bf16 in and float32 accumulated, with
the tokens as the 64 rows of the M dimension (B <= 8 of them filled, the rest zero):
    q [64, D]        = xn [64, E]  @ wq_rows^T        A in SMEM, B = a weight tile, transposed
    scores [64, 64]  = q  [64, D]  @ cache_k[b] tile  cache k is [D, T]: B as stored
    out    [64, D]  += p  [64, 64] @ cache_v[b] tile  p from registers
Row b of the scores of batch b's cache is token b's; the other rows are wasted work,
which a decode step has plenty of room for: it is bound by bytes and launches, not FLOPs.
Each tile reaches SMEM by TMA (cp.async.bulk), 64 x 64 bf16, one 128-byte swizzled
line a row, one at a time (a single buffer: the streaming pipeline is still to come).

Softmax: online (FlashAttention's running max m and sum l), started from the new
token's own score (q . k_new, summed in registers), then one 64-slot block of the cache
at a time, slots t >= pos masked to -inf; a zero-length loop when pos = 0.

The cache write: k and v of token b go to slot pos of row b, as scalar stores (a
column of cache k is strided by T, narrower than a TMA box may be).

In place: the cache arrays come in as JAX refs (`jax.new_ref`), which Pallas aliases
to the kernel's outputs (output_to_operand_aliasing in the compiled HLO), so no copy
of the cache is made; that needs pl.kernel with a plgpu.Mesh rather than plgpu.kernel,
whose batching wrapper takes no refs in JAX 0.10.

Rounding against XLA's path: the same bf16 inputs, float32 sums in another order, so
q, k, v may differ from XLA's by a bf16 step where a sum lands near a rounding edge;
the softmax is summed online, not in one pass. tests/test_decode_attention.py derives
the tolerance.
"""

import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions import mosaic, rotary

TILE = 64  # rows of a wgmma (M), and columns of a K chunk: 64 bf16 = one 128-byte swizzle line
SWIZZLED = (plgpu.TilingTransform((8, TILE)), plgpu.SwizzleTransform(128))
ROWS = 64  # tokens padded to the wgmma's M


def _load(ref, layout, interpret):
    """A ref's whole contents into registers, in `layout` (JAX 0.10 also takes an index,
    and its interpreter takes no plgpu.load: layouts are the compiler's concern)."""
    if interpret:
        return ref[...]
    if "idx" in inspect.signature(plgpu.load).parameters:  # JAX 0.10
        return plgpu.load(ref, (), layout=layout, optimized=False)
    return plgpu.load(ref, layout=layout, optimized=False)


def _layouts():
    wgmma = plgpu.Layout.WGMMA
    return wgmma, wgmma.reduce(1), wgmma.reduce(0)  # [64, n], per row [64], per column [n]


def _kernel(dims, interpret, refs, scratch):
    """One CTA: the attention half for KV head kh over all B tokens."""
    B, P, E, H, K, D, T, rope = dims
    G, GD, nE = H // K, H // K * D, E // TILE
    x_ref, pend_ref, norm_ref, wq, wk, wv, wo, rope_ref, pos_ref, kc, vc, x_out, pend_out = refs
    xn, wtile, bstage, fstage, normv, ropev, qs, ks, vs, kplain, vplain, ktile, vtile, ptile, ttile, bar = (
        scratch
    )
    WG, ROW, COL = _layouts()
    kh = lax.axis_index("kv")
    pos, live = pos_ref[0], pos_ref[1]
    f32, bf16 = jnp.float32, jnp.bfloat16

    def tma(src, dst):
        plgpu.copy_gmem_to_smem(src, dst, bar)
        plgpu.barrier_wait(bar)

    def transposed(tile):  # wgmma's B as tile^T; JAX 0.10's interpreter takes no transpose_ref
        if interpret and not hasattr(plgpu, "InterpretGPUParams"):
            ttile[...] = tile[...].T
            return ttile
        return plgpu.transpose_ref(tile, (1, 0))

    def cast(value, layout):  # JAX 0.10's interpreter has no layout_cast: layouts are compiled
        return value if interpret else plgpu.layout_cast(value, layout)

    def zeros(shape, layout):
        return cast(jnp.zeros(shape, f32), layout)

    def iota(dim):
        if interpret:
            return lax.broadcasted_iota(jnp.int32, (ROWS, TILE), dim)
        return plgpu.broadcasted_iota(jnp.int32, (ROWS, TILE), dim, layout=WG)

    def matmul(steps, operands, n=TILE):
        """The sum over c < steps of a @ b, (a, b) = operands(c): float32 [64, n],
        accumulated by the tensor cores in registers (a wgmma accumulator, born zero)."""

        def run(acc):
            @pl.loop(0, steps)
            def _(c):
                plgpu.wgmma(acc, *operands(c))
                plgpu.wgmma_wait(0)  # done reading SMEM before the next TMA overwrites it

            return acc[...]

        return pl.run_scoped(run, plgpu.ACC((ROWS, n), f32))

    # 1. x_now = x + pending, 64 columns at a time (rows >= B stay zero), and its sum of squares.
    bstage[...] = zeros((ROWS, TILE), WG).astype(bf16)
    fstage[...] = zeros((ROWS, TILE), WG)
    if rope:
        tma(rope_ref, ropev)

    def residual(c, ss):
        cols = pl.ds(c * TILE, TILE)
        plgpu.commit_smem()
        tma(x_ref.at[:, cols], bstage.at[:B])
        x = _load(bstage, WG, interpret).astype(f32)
        for p in range(P):
            tma(pend_ref.at[p, :, cols], fstage.at[:B])
            x = x + _load(fstage, WG, interpret)
        x = x.astype(bf16)
        xn.at[:, cols][...] = x

        @pl.when(kh == 0)
        def _():
            bstage[...] = x
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(bstage.at[:B], x_out.at[:, cols])
            plgpu.wait_smem_to_gmem(0)

        x = x.astype(f32)
        return ss + (x * x).sum(axis=1)

    ss = lax.fori_loop(0, nE, residual, zeros((ROWS,), ROW))
    inv = lax.rsqrt(ss / E + 1e-6)  # model.rms_norm's eps

    @pl.loop(0, nE)
    def _(c):
        cols = pl.ds(c * TILE, TILE)
        tma(norm_ref.at[cols], normv)
        scale = _load(normv, COL, interpret).astype(f32)
        x = xn.at[:, cols][...].astype(f32)
        x = x * lax.broadcast_in_dim(inv, x.shape, [0]) * lax.broadcast_in_dim(scale, x.shape, [1])
        xn.at[:, cols][...] = x.astype(bf16)

    plgpu.commit_smem()

    # 2. q, k, v: 64 output features at a time, E streamed through one weight tile.
    def project(w, row0, turned=False):
        """[64 tokens, 64] = xn @ w[row0:row0+64]^T; `turned`: the rows of each head's
        halves swapped (dim i + D/2 in place of i), what rotate_half multiplies by sin."""

        def chunk(c):
            cols = pl.ds(c * TILE, TILE)
            if turned:
                head0 = row0 - row0 % D
                for half in range(2):
                    src = head0 + (row0 % D + half * TILE // 2 + D // 2) % D
                    dst = wtile.at[pl.ds(half * TILE // 2, TILE // 2)]
                    plgpu.copy_gmem_to_smem(w.at[pl.ds(src, TILE // 2), cols], dst, bar)
                    plgpu.barrier_wait(bar)
            else:
                tma(w.at[pl.ds(row0, TILE), cols], wtile)
            return xn.at[:, cols], transposed(wtile)

        return matmul(nE, chunk).astype(bf16)

    def rotated(w, row0, j):  # block j of a head: rotary.rotate's arithmetic, in float32
        y = project(w, row0).astype(f32)
        if not rope:
            return y
        swapped = project(w, row0, turned=True).astype(f32)
        cos = _load(ropev.at[0, pl.ds(j * TILE, TILE)], COL, interpret)
        sin = _load(ropev.at[1, pl.ds(j * TILE, TILE)], COL, interpret)
        cos, sin = (lax.broadcast_in_dim(t, y.shape, [1]) for t in (cos, sin))
        return y * cos + swapped * sin  # sin is negated on the first half (rope_tables)

    for j in range(D // TILE):
        cols = pl.ds(j * TILE, TILE)
        k = rotated(wk, kh * D + j * TILE, j).astype(bf16)
        v = project(wv, kh * D + j * TILE)
        ks.at[:, cols][...], kplain.at[:, cols][...] = k, k
        vs.at[:, cols][...], vplain.at[:, cols][...] = v, v
        for g in range(G):
            row0 = (kh * G + g) * D + j * TILE
            qs.at[:, pl.ds(g * D + j * TILE, TILE)][...] = rotated(wq, row0, j).astype(bf16)
    plgpu.commit_smem()

    # 3. Attention, per query head g and cache row b: online softmax over the new token
    # and then the cache's filled blocks; row b of each result is token b's.
    scale = D**-0.5
    rows, cols64 = iota(0), iota(1)
    for g in range(G):
        s_new = zeros((ROWS,), ROW)
        for j in range(D // TILE):
            q = qs.at[:, pl.ds(g * D + j * TILE, TILE)][...].astype(f32)
            s_new = s_new + (q * ks.at[:, pl.ds(j * TILE, TILE)][...].astype(f32)).sum(axis=1)
        s_new = s_new * scale
        out = [zeros((ROWS, TILE), WG) for _ in range(D // TILE)]
        for b in range(B):

            def block(t, carry, b=b):
                o, m, l = carry
                tma(kc.at[b, kh, :, pl.ds(t * TILE, TILE)], ktile)
                tma(vc.at[b, kh, pl.ds(t * TILE, TILE), :], vtile)
                s = matmul(1, lambda _: (qs.at[:, pl.ds(g * D, D)], ktile)) * scale
                s = jnp.where(cols64 + t * TILE < pos, s, -jnp.inf)
                m_new = jnp.maximum(m, s.max(axis=1))
                alpha = jnp.exp(m - m_new)
                p = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
                l = l * alpha + p.sum(axis=1)
                o = o * lax.broadcast_in_dim(alpha, o.shape, [0])
                ptile[...] = p.astype(bf16)  # wgmma's A from SMEM: the interpreter takes no other
                plgpu.commit_smem()
                return o + matmul(1, lambda _: (ptile, vtile), D), m_new, l

            o0 = vs[...].astype(f32)  # weight exp(s_new - m) = 1 with m = s_new
            o, _, l = lax.fori_loop(
                0, (pos + TILE - 1) // TILE, block, (o0, s_new, cast(jnp.ones((ROWS,), f32), ROW))
            )
            o = o / lax.broadcast_in_dim(l, o.shape, [0])
            for j in range(D // TILE):
                oj = o[:, j * TILE : (j + 1) * TILE] if D > TILE else o
                out[j] = jnp.where(rows == b, oj, out[j])
        for j in range(D // TILE):
            qs.at[:, pl.ds(g * D + j * TILE, TILE)][...] = out[j].astype(bf16)
    plgpu.commit_smem()

    # 4. This KV head's partial sum of the output projection, 64 columns of E at a time.
    @pl.loop(0, nE)
    def _(e):
        def chunk(c):
            tma(wo.at[pl.ds(e * TILE, TILE), pl.ds(kh * GD + c * TILE, TILE)], wtile)
            return qs.at[:, pl.ds(c * TILE, TILE)], transposed(wtile)

        fstage[...] = matmul(GD // TILE, chunk)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(fstage.at[:B], pend_out.at[kh, :, pl.ds(e * TILE, TILE)])
        plgpu.wait_smem_to_gmem(0)

    # 5. The new k, v into slot pos of each row's cache, after every read of it above.
    @pl.when(live != 0)
    def _():
        for b in range(B):

            @pl.loop(0, D)
            def _(d, b=b):
                kc[b, kh, d, pos] = kplain[b, d]
                vc[b, kh, pos, d] = vplain[b, d]


def rope_tables(pos, D, base):
    """float32 [2, D]: cos and sin of each dim's angle at `pos`, as rotary.rotate computes
    them; sin negated on the first half, where rotate_half subtracts."""
    theta = pos.astype(jnp.float32) * rotary.frequencies(D, base)  # [D/2]
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.concatenate([cos, cos]), jnp.concatenate([-sin, sin])])


def attention_layer(layer, cache, x, pending, pos, live, cfg, *, interpret):
    """x [B, E] bf16, pending [P, B, E] float32, cache {"k": [B, K, D, T], "v": [B, K, T, D]}
    -> (x_now [B, E], pending_out [K, B, E] float32, the cache with slot pos written
    unless `live` is false). One kernel launch; the cache is updated in place."""
    B, E = x.shape
    H, D, _ = layer["wq"].shape
    K, T = cache["k"].shape[1], cache["k"].shape[-1]
    dims = (B, pending.shape[0], E, H, K, D, T, bool(cfg.rope))
    G, bf16 = H // K, jnp.bfloat16
    old_interpreter = interpret and not hasattr(plgpu, "InterpretGPUParams")  # ttile: JAX 0.10's
    scratch = [
        plgpu.SMEM((ROWS, E), bf16, transforms=SWIZZLED),  # xn: x_now, then normed
        plgpu.SMEM((TILE, TILE), bf16, transforms=SWIZZLED),  # wtile
        plgpu.SMEM((ROWS, TILE), bf16),  # bstage
        plgpu.SMEM((ROWS, TILE), jnp.float32),  # fstage
        plgpu.SMEM((TILE,), bf16),  # normv
        plgpu.SMEM((2, D), jnp.float32),  # ropev
        plgpu.SMEM((ROWS, G * D), bf16, transforms=SWIZZLED),  # qs
        plgpu.SMEM((ROWS, D), bf16, transforms=SWIZZLED),  # ks
        plgpu.SMEM((ROWS, D), bf16, transforms=SWIZZLED),  # vs
        plgpu.SMEM((ROWS, D), bf16),  # kplain
        plgpu.SMEM((ROWS, D), bf16),  # vplain
        plgpu.SMEM((D, TILE), bf16, transforms=SWIZZLED),  # ktile
        plgpu.SMEM((TILE, D), bf16, transforms=SWIZZLED),  # vtile
        plgpu.SMEM((ROWS, TILE), bf16, transforms=SWIZZLED),  # ptile
        plgpu.SMEM((TILE, TILE) if old_interpreter else (8, TILE), bf16, transforms=SWIZZLED),
        plgpu.Barrier(num_arrivals=1),
    ]

    def body(*refs):
        pl.run_scoped(lambda *s: _kernel(dims, interpret, refs, s), *scratch)

    flags = jnp.stack([jnp.asarray(pos, jnp.int32), jnp.asarray(live, jnp.int32)])
    rope = rope_tables(jnp.asarray(pos), D, cfg.rope_base) if cfg.rope else jnp.zeros((2, D))
    k_ref = jax.new_ref(cache["k"], memory_space=plgpu.GMEM)
    v_ref = jax.new_ref(cache["v"], memory_space=plgpu.GMEM)
    call = pl.kernel(
        body,
        out_type=(
            jax.ShapeDtypeStruct((B, E), x.dtype),
            jax.ShapeDtypeStruct((K, B, E), jnp.float32),
        ),
        mesh=plgpu.Mesh(grid=(K,), grid_names=("kv",)),
        interpret=mosaic.interpret_params() if interpret else False,
        name="decode_attention",
    )
    weights = [layer[w].reshape(-1, E) for w in ("wq", "wk", "wv")]
    wo = layer["wo"].reshape(E, H * D)
    x_now, pending_out = call(
        x, pending, layer["attn_norm"], *weights, wo, rope, flags, k_ref, v_ref
    )
    return x_now, pending_out, {"k": k_ref[...], "v": v_ref[...]}


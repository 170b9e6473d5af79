"""The attention half of a decode layer as one Mosaic GPU kernel: norm, q/k/v, cache, softmax, wo.

XLA's GPT-2 decode step compiled for h100:1 launches 164 kernels a token, 13 a layer
(roofline/launch_bound.py); an H100 ran it at 0.39 ms a token, measured (docs/h100-run),
about 2.4 us a launch. This is
the attention half in one launch, per the decode-kernel contract's "pending" partial sums:

    x_now   = x + pending[0] + pending[1] + ...       float32, rounded to bf16 once
    xn      = rms_norm(x_now) * attn_norm             every CTA computes it itself
    q, k, v = xn @ wq^T, wk^T, wv^T                   RoPE turns q and k at position pos
    out     = softmax(q k^T / sqrt(D)) v              over cache slots t < pos and the new token
    cache[.., pos] = k, v                             in place, unless `live` is false
    pending_out[kh] = out_kh @ wo[:, kh's heads]^T    one partial sum per KV head

One CTA (one warpgroup) per KV head kh: it owns query heads kh*G .. kh*G+G-1 (G = H/K),
its slice of the cache and its columns of wo, so no CTA waits for another; the next
kernel adds the K partial sums. CTA 0 writes x_now.

The products run on the tensor cores (wgmma: bf16 in, float32 accumulated) with the
tokens as the 64 rows of M, B <= 8 of them real: q [64, D] = xn [64, E] @ (wq rows)^T;
scores [64, 64] = q @ (a tile of batch row b's cache k, [D, 64] as stored); out [64, D]
+= p @ (its cache v tile). Only row b of batch row b's scores counts: waste a decode
step has room for, bound by bytes and launches, not FLOPs. (Tokens in N, 8 wide, would
waste less and keep x_now [8, E]; but the attention's products want q and p with tokens
in rows, and a transpose between the two has no cheap Mosaic GPU spelling.) Each 64 x 64
bf16 tile (a 128-byte swizzled line a row) reaches SMEM by TMA. A weight's tiles stream
through two slots, the next one's copy in flight while the tensor cores take this one;
the cache's tiles still come one at a time.

The softmax is online (FlashAttention's running max and sum), started from the new
token's own score q . k_new, then a 64-slot block of the cache at a time, slots >= pos
masked: none at pos 0. RoPE is rotary.rotate's arithmetic, with the cos and sin the
caller computes in XLA (kernel_step.rope_tables), on q and on q with each head's halves
swapped: other 64-wide blocks of the same head, or, at D = 64, a second product with
weight rows TMA'd in swapped halves.

The cache is written in place: its arrays enter as JAX refs (jax.new_ref), aliased to
the kernel's outputs, and only slot pos is stored to (scalar stores: a column of cache k
is strided by T, narrower than a TMA box), by pl.kernel on a plgpu.Mesh (plgpu.kernel
takes no refs in JAX 0.10). x_now stays whole in SMEM, bounding E (attention_refusal).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import mosaic

TILE = 64  # rows of a wgmma (M) and columns of a K chunk: 64 bf16, one 128-byte swizzle line
SWIZZLED = (plgpu.TilingTransform((8, TILE)), plgpu.SwizzleTransform(128))
SMEM_BYTES = 227 * 1024  # an H100's shared memory a CTA may have (CUDA guide, sm_90)


def attention_refusal(cfg, batch):
    """Why this kernel cannot run cfg's attention at `batch` rows (one line), or None. Its
    SMEM: x_now [64, E], q [64, G*D], k, v twice [64, D], six 64 x 64 tiles, 4 KB spare."""
    E, D, T, G = cfg.embed, cfg.head_dim, cfg.seq, cfg.heads // cfg.n_kv_heads
    if batch > 8:
        return f"batches of at most 8 rows, not {batch}"
    if E % TILE or D % TILE or T % TILE:
        return f"embed, head dim and seq multiples of {TILE}, not {E}, {D}, {T}"
    if 2 * TILE * (E + G * D + 4 * D + 6 * TILE) + 8 * D + 4096 > SMEM_BYTES:
        return f"embed {E} with {G} x {D} query dims a KV head: more than a CTA's shared memory"
    return None


def _kernel(dims, interpret, refs, scratch):
    """One CTA: the attention half for KV head kh over all B tokens."""
    B, P, E, H, K, D, rope = dims
    G, GD, nE = H // K, H // K * D, E // TILE
    x_ref, pend_ref, norm_ref, wq, wk, wv, wo, rope_ref, pos_ref, kc, vc, x_out, pend_out = refs
    xn, qs, kplain, vplain, ropev, normv, bstage, fstage, *tiles = scratch
    wtiles, ktile, vtile, ptile, spare, bar, wbars, hbars = tiles
    on = mosaic.Ops(interpret, spare)
    WG, ROW, COL, zeros = on.WG, on.ROW, on.COL, on.zeros
    kh = lax.axis_index("kv")
    pos, live = pos_ref[0], pos_ref[1]
    f32, bf16 = jnp.float32, jnp.bfloat16

    def tma(src, dst):  # HBM -> SMEM, waited for
        plgpu.copy_gmem_to_smem(src, dst, bar)
        plgpu.barrier_wait(bar)

    def store(src, dst):  # SMEM -> HBM, after the registers' stores to src
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(src, dst)
        plgpu.wait_smem_to_gmem(0)

    def mma(a, b, n=TILE):  # a @ b, float32 [64, n], on the tensor cores
        def run(acc):
            plgpu.wgmma(acc, a, b)
            return acc[...]

        return pl.run_scoped(run, plgpu.ACC((TILE, n), f32))

    def matmul(steps, fetch, a_of, bars=wbars):
        """The sum over chunks c < steps of a_of(c) @ w_c^T, w_c the weight tile that
        fetch(c, dst, barrier) copies in: two tile slots, so that chunk c + 1's TMA is in
        flight while the tensor cores multiply chunk c. float32 [64, 64]."""
        fetch(0, wtiles.at[0], bars.at[0])

        def run(acc):
            @pl.loop(0, steps)
            def _(c):
                slot = lax.rem(c, 2)

                @pl.when(c + 1 < steps)
                def _():
                    fetch(c + 1, wtiles.at[1 - slot], bars.at[1 - slot])

                plgpu.barrier_wait(bars.at[slot])
                plgpu.wgmma(acc, a_of(c), on.transposed(wtiles.at[slot]))
                plgpu.wgmma_wait(0)  # done reading the slot before the next TMA overwrites it

            return acc[...]

        return pl.run_scoped(run, plgpu.ACC((TILE, TILE), f32))

    # 1. x_now = x + pending, 64 columns at a time (rows >= B stay zero), and its sum of squares.
    bstage[...] = zeros((TILE, TILE), WG).astype(bf16)
    fstage[...] = zeros((TILE, TILE), WG)
    if rope:
        tma(rope_ref, ropev)

    def residual(c, ss):
        cols = pl.ds(c * TILE, TILE)
        plgpu.commit_smem()
        tma(x_ref.at[:, cols], bstage.at[:B])
        x = on.load(bstage, WG).astype(f32)
        for p in range(P):
            tma(pend_ref.at[p, :, cols], fstage.at[:B])
            x = x + on.load(fstage, WG)
        x = x.astype(bf16)
        xn.at[:, cols][...] = x

        @pl.when(kh == 0)
        def _():
            bstage[...] = x
            store(bstage.at[:B], x_out.at[:, cols])

        x = x.astype(f32)
        return ss + (x * x).sum(axis=1)

    ss = lax.fori_loop(0, nE, residual, zeros((TILE,), ROW))
    inv = lax.rsqrt(ss / E + 1e-6)  # transformer.rms_norm's eps

    @pl.loop(0, nE)
    def _(c):
        cols = pl.ds(c * TILE, TILE)
        tma(norm_ref.at[cols], normv)
        scale = on.load(normv, COL).astype(f32)
        x = xn.at[:, cols][...].astype(f32)
        x = x * lax.broadcast_in_dim(inv, x.shape, [0]) * lax.broadcast_in_dim(scale, x.shape, [1])
        xn.at[:, cols][...] = x.astype(bf16)

    plgpu.commit_smem()

    # 2. q, k, v: 64 output features at a time, E streamed through one weight tile.
    def project(w, row0, turned=False):
        """[64 tokens, 64] = xn @ w[row0:row0+64]^T; `turned`: the rows of each head's
        halves swapped (dim i + D/2 in place of i), what rotate_half multiplies by sin."""

        def fetch(c, dst, barrier):
            cols = pl.ds(c * TILE, TILE)
            if not turned:
                return plgpu.copy_gmem_to_smem(w.at[pl.ds(row0, TILE), cols], dst, barrier)
            for half in range(2):  # two copies of 32 rows: head dims (i + D/2) mod D
                src = row0 - row0 % D + (row0 % D + half * TILE // 2 + D // 2) % D
                half_dst = dst.at[pl.ds(half * TILE // 2, TILE // 2)]
                plgpu.copy_gmem_to_smem(w.at[pl.ds(src, TILE // 2), cols], half_dst, barrier)

        a_of = lambda c: xn.at[:, pl.ds(c * TILE, TILE)]  # noqa: E731
        return matmul(nE, fetch, a_of, hbars if turned else wbars).astype(bf16)

    def head(w, row0):  # a head's D/64 blocks of xn @ w^T, turned as rotary.rotate turns them
        ys, n = [project(w, row0 + j * TILE).astype(f32) for j in range(D // TILE)], D // TILE
        turned = ys[n // 2 :] + ys[: n // 2]  # dims i + D/2: another block, or (D = 64) ...
        if n == 1 and rope:  # ... within this one: its weight rows copied in swapped halves
            turned = [project(w, row0, True).astype(f32)]
        out = []
        for j, (y, swapped) in enumerate(zip(ys, turned) if rope else ()):
            cos, sin = (on.load(ropev.at[i, pl.ds(j * TILE, TILE)], COL) for i in (0, 1))
            cos, sin = (lax.broadcast_in_dim(t, y.shape, [1]) for t in (cos, sin))
            out.append(y * cos + swapped * sin)  # sin negated on the first half (rope_tables)
        return out if rope else ys

    for j, k in enumerate(head(wk, kh * D)):
        kplain.at[:, pl.ds(j * TILE, TILE)][...] = k.astype(bf16)
        vplain.at[:, pl.ds(j * TILE, TILE)][...] = project(wv, kh * D + j * TILE)
    for g in range(G):
        for j, q in enumerate(head(wq, (kh * G + g) * D)):
            qs.at[:, pl.ds(g * D + j * TILE, TILE)][...] = q.astype(bf16)
    plgpu.commit_smem()

    # 3. Attention, per query head g and cache row b: online softmax over the new token
    # and then the cache's filled blocks; row b of each result is token b's.
    scale = D**-0.5
    rows, cols64 = on.iota(0), on.iota(1)
    for g in range(G):
        s_new = zeros((TILE,), ROW)
        for j in range(D // TILE):
            q = qs.at[:, pl.ds(g * D + j * TILE, TILE)][...].astype(f32)
            s_new += (q * on.load(kplain.at[:, pl.ds(j * TILE, TILE)], WG).astype(f32)).sum(1)
        s_new = s_new * scale
        out = [zeros((TILE, TILE), WG) for _ in range(D // TILE)]
        for b in range(B):

            def block(t, carry, b=b, g=g):
                o, m, total = carry
                tma(kc.at[b, kh, :, pl.ds(t * TILE, TILE)], ktile)
                tma(vc.at[b, kh, pl.ds(t * TILE, TILE), :], vtile)
                s = mma(qs.at[:, pl.ds(g * D, D)], ktile) * scale
                s = jnp.where(cols64 + t * TILE < pos, s, -jnp.inf)
                m_new = jnp.maximum(m, s.max(axis=1))
                alpha = jnp.exp(m - m_new)
                p = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
                total = total * alpha + p.sum(axis=1)
                o = o * lax.broadcast_in_dim(alpha, o.shape, [0])
                ptile[...] = p.astype(bf16)  # A from SMEM: the interpreter takes no other
                plgpu.commit_smem()
                return o + mma(ptile, vtile, D), m_new, total

            ones = on.cast(jnp.ones((TILE,), f32), ROW)
            start = (on.load(vplain, WG).astype(f32), s_new, ones)  # the new token, weight 1
            o, _, total = lax.fori_loop(0, (pos + TILE - 1) // TILE, block, start)
            o = o / lax.broadcast_in_dim(total, o.shape, [0])
            for j in range(D // TILE):
                oj = o[:, j * TILE : (j + 1) * TILE] if D > TILE else o
                out[j] = jnp.where(rows == b, oj, out[j])
        for j in range(D // TILE):
            qs.at[:, pl.ds(g * D + j * TILE, TILE)][...] = out[j].astype(bf16)
    plgpu.commit_smem()

    # 4. This KV head's partial sum of the output projection, 64 columns of E at a time.
    @pl.loop(0, nE)
    def _(e):
        def fetch(c, dst, barrier):
            src = wo.at[pl.ds(e * TILE, TILE), pl.ds(kh * GD + c * TILE, TILE)]
            plgpu.copy_gmem_to_smem(src, dst, barrier)

        fstage[...] = matmul(GD // TILE, fetch, lambda c: qs.at[:, pl.ds(c * TILE, TILE)])
        store(fstage.at[:B], pend_out.at[kh, :, pl.ds(e * TILE, TILE)])

    # 5. The new k, v into slot pos of each row's cache, after every read of it above.
    @pl.when(live != 0)
    def _():
        for b in range(B):

            @pl.loop(0, D)
            def _(d, b=b):
                kc[b, kh, d, pos] = kplain[b, d]
                vc[b, kh, pos, d] = vplain[b, d]


def attention_layer(layer, cache, x, pending, pos, live, cfg, *, rope=None, interpret):
    """x [B, E] bf16, pending [P, B, E] float32, cache {"k": [B, K, D, T], "v": [B, K, T, D]}
    -> (x_now [B, E], pending_out [K, B, E] float32, the cache with slot pos written
    unless `live` is false). One kernel launch; the cache is updated in place. rope:
    float32 [2, D], the cos and sin at pos (kernel_step.rope_tables), for a RoPE model."""
    (B, E), (H, D, _), K = x.shape, layer["wq"].shape, cache["k"].shape[1]
    G, bf16 = H // K, jnp.bfloat16
    dims = (B, pending.shape[0], E, H, K, D, bool(cfg.rope))

    def smem(*shape, dtype=bf16, tiled=True):
        return plgpu.SMEM(shape, dtype, transforms=SWIZZLED if tiled else ())

    f32, spare = jnp.float32, TILE if interpret and mosaic.OLD_INTERPRETER else 8
    # xn (x_now, then normed), qs (q, then the output); k, v untiled (for scalar reads); cos,
    # sin; 64 of attn_norm; x in, x_now out; pending in, partial sums out; two weight tiles,
    # cache k, cache v, probabilities; spare; barriers: TMAs waited for at once, weight tiles'.
    scratch = [smem(TILE, E), smem(TILE, G * D)]
    scratch += [smem(TILE, D, tiled=False), smem(TILE, D, tiled=False)]
    scratch += [smem(2, D, dtype=f32, tiled=False), smem(TILE, tiled=False)]
    scratch += [smem(TILE, TILE, tiled=False), smem(TILE, TILE, dtype=f32, tiled=False)]
    scratch += [smem(2, TILE, TILE), smem(D, TILE), smem(TILE, D), smem(TILE, TILE)]
    scratch += [smem(spare, TILE), plgpu.Barrier(num_arrivals=1)]
    scratch += [plgpu.Barrier(num_arrivals=n, num_barriers=2) for n in (1, 2)]

    def body(*refs):
        pl.run_scoped(lambda *s: _kernel(dims, interpret, refs, s), *scratch)

    flags = jnp.stack([jnp.asarray(pos, jnp.int32), jnp.asarray(live, jnp.int32)])
    if cfg.rope and rope is None:
        raise ValueError(
            "a RoPE model's kernel takes rope, float32 [2, D] (kernel_step.rope_tables)"
        )
    rope = rope if cfg.rope else flags  # unread without RoPE
    k_ref = jax.new_ref(cache["k"], memory_space=plgpu.GMEM)
    v_ref = jax.new_ref(cache["v"], memory_space=plgpu.GMEM)
    outs = (jax.ShapeDtypeStruct((B, E), x.dtype), jax.ShapeDtypeStruct((K, B, E), jnp.float32))
    mesh = plgpu.Mesh(grid=(K,), grid_names=("kv",))
    run = mosaic.interpret_params() if interpret else False
    call = pl.kernel(body, out_type=outs, mesh=mesh, interpret=run, name="decode_attention")
    weights = [layer[w].reshape(-1, E) for w in ("wq", "wk", "wv")]  # [rows, E]: bitcasts
    wo = layer["wo"].reshape(E, H * D)
    x_now, partials = call(x, pending, layer["attn_norm"], *weights, wo, rope, flags, k_ref, v_ref)
    return x_now, partials, {"k": k_ref[...], "v": v_ref[...]}

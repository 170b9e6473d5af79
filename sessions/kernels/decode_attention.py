"""The attention half of a decode layer as one Mosaic GPU kernel, its cache split (flash decoding).

    x_now   = x + the MLP's pending partials                    decode_residual.start
    xn      = rms_norm(x_now) * attn_norm                       every CTA computes it itself
    q, k, v = wq xn^T, wk xn^T, wv xn^T                         RoPE turns q and k at pos
    o_s     = softmax over slice s of the cache, unnormalised   with its running max m, sum l
    pending_out[h·S + s] = wo[:, head h] o_s^T                  one partial a head and slice
    cache[.., pos] = k, v                                       in place, unless `live` is false

The grid is (KV head kh, slice s of T): S slices (decode_grid.slices; GPT-2: 12 KV
heads x 4 = 48 CTAs, where one CTA a KV head gave 12 and left HBM mostly idle). A
CTA owns query heads kh·G .. kh·G+G-1 (G = H/K), its slice's cache slots and its
heads' columns of wo. The merge of the slices' softmaxes needs every slice's max and
sum, which no CTA sees without a grid-wide barrier, and Mosaic GPU offers none (a
kernel's CTAs never wait for each other). So each CTA writes its partial
unnormalised with m and l (stats), and the MLP kernel that follows merges them as
it adds them to x (log-sum-exp weights, decode_residual): no launch added. The
price: H·S partials [B, E] float32 for the next kernel to read (GPT-2: 48, as many
as the MLP leaves this one), and every slice's CTA computes its KV head's q, k, v
(the weights read from HBM once, then from L2).

The tokens sit in wgmma's N, 8 wide, as in decode_mlp.py: q^T [64 dims, 8] = wq
tile [64, 64 of E] @ xn^T, the weight as stored the A operand, so x_now is [8, E] in
SMEM (E up to 2048: the 1.2B shape). q, k and v reach rows of tokens, as the
attention's products want them, by a store of the [64, 8] result through an [8, 64]
buffer's transpose: scores [64, 64] = q [64, D] @ (row b's cache k tile, [D, 64] as
stored); o [64, D] += p @ (its v tile); only row b of row b's scores counts. The
output projection is the MLP's second product: out^T [64 of E, 8] = wo tile @ o^T.

Streams (sized in decode_grid.py): the weight tiles through a ring of W slots in
one sequence (q, k, v, then wo), the cache's through a ring of C slots, both started
before the residual so their copies overlap it; the pending partials through their
own ring. The softmax is online (FlashAttention's running max and sum), slice 0
starting from the new token's own score. RoPE is rotary.rotate's arithmetic, cos
and sin from kernel_step.rope_tables; at D = 64 a second product with weight rows in
swapped halves gives rotate_half's operand. The cache is written in place (jax.new_ref,
aliased to the outputs; pl.kernel on a plgpu.Mesh): slot pos alone, by scalar stores,
by the CTA whose slice holds it, after its own reads.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import decode_residual as residual
from sessions.kernels import mosaic
from sessions.kernels.decode_grid import TILE, attention_rings, slices
from sessions.kernels.decode_residual import EMPTY, ROWS, WT, swizzled


def attention_refusal(cfg, batch):
    """Why this kernel cannot run cfg's attention at `batch` rows (one line), or None."""
    E, D, T = cfg.embed, cfg.head_dim, cfg.seq
    if batch > ROWS:
        return f"batches of at most {ROWS} rows, not {batch}"
    if E % TILE or D % TILE or T % TILE:
        return f"embed, head dim and seq multiples of {TILE}, not {E}, {D}, {T}"
    if attention_rings(cfg, cfg.ff // TILE) is None:
        G = cfg.heads // cfg.n_kv_heads
        return f"embed {E} with {G} x {D} query dims a KV head: more than a CTA's shared memory"
    return None


def _weight_runs(wq, wk, wv, wo, kh, dims):
    """The weight tiles a CTA multiplies, in order (q, k, v, then wo), as runs (mosaic.Ring),
    each tile two 32-row boxes."""
    _, E, H, K, D, _, _, rope = dims
    G, nE, nD = H // K, E // TILE, D // TILE

    def rows(w, base, off, turned=False):
        """A run of E/64 tiles, w's rows base + off .. + 64 (base a multiple of D), the c-th 64 of
        E; turned: each head's halves swapped (dim i + D/2 for i), what rotate_half multiplies."""
        tops = [(off + h * 32 + (D // 2 if turned else 0)) % D for h in (0, 1)]
        return nE, lambda c: [w.at[pl.ds(base + t, 32), pl.ds(c * TILE, TILE)] for t in tops]

    turn = rope and nD == 1  # at D = 64 rotate_half's rows: a second product
    heads = [(wq, (kh * G + g) * D, True) for g in range(G)] + [(wk, kh * D, True)]
    runs = []
    for w, base, turns in [*heads, (wv, kh * D, False)]:
        runs += [rows(w, base, j * TILE) for j in range(nD)]
        if turn and turns:
            runs.append(rows(w, base, 0, True))

    def wo_tile(u):  # wo's [64 of E, 64 of query head kh·G + g's dims], u = (g·nE + e)·nD + d
        g, e, d = lax.div(u, nE * nD), lax.rem(lax.div(u, nD), nE), lax.rem(u, nD)
        col = (kh * G + g) * D + d * TILE
        return [wo.at[pl.ds(e * TILE + h * 32, 32), pl.ds(col, TILE)] for h in (0, 1)]

    return [*runs, (G * nE * nD, wo_tile)]


def _kernel(dims, interpret, scratch, refs, whole):
    """One CTA: the attention half for KV head kh over slice s of the cache, all B tokens."""
    B, E, H, K, D, T, NS, rope = dims
    G, nE, nD, per = H // K, E // TILE, D // TILE, T // TILE // NS
    x_ref, pend_ref, norm_ref, wq, wk, wv, wo, rope_ref, step, run, kc, vc, *outs = refs
    x_out, pend_out, stats_out = outs
    xn, ropev, wslots, wbars, kslots, vslots, cbars, rbar = whole
    on = mosaic.Ops(interpret, None)
    WG, ROW, zeros, f32, bf16 = on.WG, on.ROW, on.zeros, jnp.float32, jnp.bfloat16
    kh, s = lax.axis_index("kv"), lax.axis_index("slice")
    pos, live = residual.pos_and_live(step, run)
    ring = mosaic.Ring(_weight_runs(wq, wk, wv, wo, kh, dims), wslots, wbars)
    ring.start()  # the first W weight tiles and C cache tiles: in flight during the residual
    Sc, first_tile = kslots.shape[0], s * per
    filled = jnp.clip((pos + TILE - 1) // TILE - first_tile, 0, per)  # the slice's tiles < pos

    def cache_fetch(b, j):  # tile j of this slice, row b's k and v, into slot j % C
        t, slot = first_tile + j, lax.rem(j, Sc)
        k_box, v_box = kc.at[b, kh, :, pl.ds(t * TILE, TILE)], vc.at[b, kh, pl.ds(t * TILE, TILE)]
        plgpu.copy_gmem_to_smem(k_box, kslots.at[slot], cbars.at[slot])
        plgpu.copy_gmem_to_smem(v_box, vslots.at[slot], cbars.at[slot])

    def cache_start(b):  # the ring's first C tiles, those below pos
        pl.loop(0, Sc)(lambda j: mosaic.when_below(j, filled)(lambda: cache_fetch(b, j)))

    cache_start(0)
    if rope:
        plgpu.copy_gmem_to_smem(rope_ref, ropev, rbar)

    def attend(qs, kn, vn, ptile, ostage, fstage):
        t = [0]  # the next weight tile

        def product(n, b_of, first=None):  # [64, 8] float32: n weight tiles @ b_of(i), from
            if first is None:  # `first`, else from the next
                first, t[0] = t[0], t[0] + n

            def run(acc):
                ring.product(first, n, acc, b_of)
                return acc[...]

            return pl.run_scoped(run, plgpu.ACC((TILE, ROWS), f32))

        # 2. q, k, v as y^T [64 dims, 8 tokens] = w tile @ xn^T, rounded as XLA's dense,
        # turned by RoPE, then stored transposed: rows of tokens, as the attention reads them.
        def head(dst, col0, turns):
            of_xn = lambda c: xn.at[:, pl.ds(c * TILE, TILE)].T  # noqa: E731
            ys = [product(nE, of_xn).astype(bf16).astype(f32) for _ in range(nD)]
            turned = ys[nD // 2 :] + ys[: nD // 2]  # dims i + D/2: another block, or ...
            if rope and turns and nD == 1:  # ... (D = 64) rows copied in swapped halves
                turned = [product(nE, of_xn).astype(bf16).astype(f32)]
            for j, y in enumerate(ys):
                if rope and turns:
                    cos, sin = (on.load(ropev.at[i, pl.ds(j * TILE, TILE)], ROW) for i in (0, 1))
                    cos, sin = (lax.broadcast_in_dim(v, y.shape, [0]) for v in (cos, sin))
                    y = y * cos + turned[j] * sin  # sin negated on the first half
                rows = dst.at[pl.ds(0, ROWS), pl.ds(col0 + j * TILE, TILE)]
                rows.T[...] = on.cast(y.astype(bf16), WT)

        for g in range(G):
            head(qs, g * D, True)
        head(kn, 0, True)
        head(vn, 0, False)
        plgpu.commit_smem()

        # 3. Attention over this slice, per query head g and row b (rows >= B: whatever SMEM
        # held, never mixed into row b). Slice 0 starts from the new token, the rest empty.
        scale, rows64, cols64, is0 = D**-0.5, on.iota(0), on.iota(1), s == 0
        rows_d = on.iota(0, (TILE, D))
        knew, vnew = (on.load(ref, WG).astype(f32) for ref in (kn, vn))

        def mma(a, b, n=TILE):  # a @ b, float32 [64, n], on the tensor cores
            def run(acc):
                plgpu.wgmma(acc, a, b)
                return acc[...]

            return pl.run_scoped(run, plgpu.ACC((TILE, n), f32))

        for g in range(G):
            q = qs.at[:, pl.ds(g * D, D)]
            s_new = (q[...].astype(f32) * knew).sum(axis=1) * scale
            out, stats = zeros((TILE, D), WG), zeros((TILE, TILE), WG)
            for b in range(B):
                if b or g:  # row 0 of head 0: started before the residual
                    cache_start(b)

                def block(j, carry, b=b, q=q):
                    o, m, total = carry
                    slot = lax.rem(j, Sc)
                    plgpu.barrier_wait(cbars.at[slot])
                    sc = mma(q, kslots.at[slot]) * scale
                    sc = jnp.where(cols64 + (first_tile + j) * TILE < pos, sc, -jnp.inf)
                    m_new = jnp.maximum(m, sc.max(axis=1))
                    alpha = jnp.exp(m - m_new)
                    p = jnp.exp(sc - lax.broadcast_in_dim(m_new, sc.shape, [0]))
                    total = total * alpha + p.sum(axis=1)
                    o = o * lax.broadcast_in_dim(alpha, o.shape, [0])
                    ptile[...] = p.astype(bf16)  # A from SMEM: the interpreter takes no other
                    plgpu.commit_smem()
                    o = o + mma(ptile, vslots.at[slot], D)
                    mosaic.when_below(j + Sc, filled)(lambda: cache_fetch(b, j + Sc))
                    return o, m_new, total

                ones, one0 = on.cast(jnp.ones((TILE,), f32), ROW), is0.astype(f32)
                # Not a select on the scalar is0: JAX 0.11's warpgroup select wants one shape.
                start = (vnew * one0, s_new * one0 + EMPTY * (1 - one0), ones * one0)
                o, m, total = lax.fori_loop(0, filled, block, start)
                out = jnp.where(rows_d == b, o, out)
                mine = rows64 == b
                stats = jnp.where(
                    mine & (cols64 == 0), lax.broadcast_in_dim(m, stats.shape, [0]), stats
                )
                stats = jnp.where(
                    mine & (cols64 == 1), lax.broadcast_in_dim(total, stats.shape, [0]), stats
                )
            qs.at[:, pl.ds(g * D, D)][...] = out.astype(bf16)  # unnormalised: the MLP's to scale
            fstage[...] = stats
            plgpu.commit_smem()
            p_out = (kh * G + g) * NS + s
            for b in range(ROWS):  # m and l, a row a token: 16 scalar stores
                stats_out[p_out, 0, b] = fstage[b, 0]
                stats_out[p_out, 1, b] = fstage[b, 1]
            plgpu.commit_smem()  # every thread has read fstage before the next head writes it

        # 4. Each head's partial of the output projection: out^T [64 of E, 8] = wo tile @ o^T.
        for g in range(G):
            p_out = (kh * G + g) * NS + s

            @pl.loop(0, nE)
            def _(e, g=g, p_out=p_out):
                of_o = lambda d: qs.at[pl.ds(0, ROWS), pl.ds(g * D + d * TILE, TILE)].T  # noqa: E731
                y = product(nD, of_o, t[0] + (g * nE + e) * nD)
                slot = ostage.at[lax.rem(g * nE + e, 2)]
                plgpu.wait_smem_to_gmem(1)  # the copy out of this slot, 2 blocks ago, is done
                slot.T[...] = on.cast(y, WT)
                plgpu.commit_smem()
                dst = pend_out.at[p_out, :, pl.ds(e * TILE, TILE)]
                plgpu.copy_smem_to_gmem(slot.at[pl.ds(0, B)], dst)

        plgpu.wait_smem_to_gmem(0)

        # 5. The new k, v into slot pos, by the CTA whose slice holds it, after its reads.
        @pl.when(jnp.logical_and(live, pos // (T // NS) == s))
        def _():
            for b in range(B):

                @pl.loop(0, D)
                def _(d, b=b):
                    kc[b, kh, d, pos] = kn[b, d]
                    vc[b, kh, pos, d] = vn[b, d]

    # 1. x_now and its norm into xn [8, E], the products' B operand (decode_residual).
    def begin(*bufs):
        residual.start(x_ref, pend_ref, None, norm_ref, x_out, xn, bufs, kh + s, 1)  # CTA 0, 0

    pl.run_scoped(begin, *scratch[0])
    if rope:
        plgpu.barrier_wait(rbar)
    pl.run_scoped(attend, *scratch[1])


def attention_layer(layer, cache, x, pending, clock, cfg, *, rope=None, interpret):
    """x [B, E] bf16, pending [P, B, E] float32, cache {"k": [B, K, D, T], "v": [B, K, T, D]}
    -> (x_now [B, E], partials [H·S, B, E] float32 and their stats [H·S, 2, 8] float32
    (decode_residual), the cache with slot pos written unless the step is not live). One
    kernel launch; the cache is updated in place. clock: where the step is
    (kernel_step.clock). rope: float32 [2, D], the cos and sin at pos
    (kernel_step.rope_tables), for a RoPE model."""
    (B, E), (H, D, _), K, P = x.shape, layer["wq"].shape, cache["k"].shape[1], pending.shape[0]
    T, NS, bf16, f32 = cache["k"].shape[3], slices(cfg), jnp.bfloat16, jnp.float32
    G, (depth, W, C) = H // K, attention_rings(cfg, P)
    dims = (B, E, H, K, D, T, NS, bool(cfg.rope))

    def smem(*shape, dtype=bf16, tiled=True):
        return plgpu.SMEM(shape, dtype, transforms=swizzled(dtype) if tiled else ())

    # The whole kernel's: xn, cos and sin, the weights' ring, the cache's (k and v tiles).
    whole = [smem(ROWS, E), smem(2, D, dtype=f32, tiled=False)]
    whole += [smem(W, TILE, TILE), plgpu.Barrier(num_arrivals=2, num_barriers=W)]
    whole += [smem(C, D, TILE), smem(C, TILE, D), plgpu.Barrier(num_arrivals=2, num_barriers=C)]
    whole += [plgpu.Barrier(num_arrivals=1)]
    first = residual.scratch(E, P, depth, bf16, False)  # then reused by the attention's:
    # q (then the output), new k and v (untiled, for scalar reads), p, out stage, stats stage.
    then = [smem(TILE, G * D), smem(TILE, D, tiled=False), smem(TILE, D, tiled=False)]
    then += [smem(TILE, TILE), smem(2, ROWS, TILE, dtype=f32, tiled=False)]
    then += [smem(TILE, TILE, dtype=f32, tiled=False)]

    def body(*refs):
        pl.run_scoped(lambda *w: _kernel(dims, interpret, (first, then), refs, w), *whole)

    if cfg.rope and rope is None:
        raise ValueError(
            "a RoPE model's kernel takes rope, float32 [2, D] (kernel_step.rope_tables)"
        )
    rope = rope if cfg.rope else clock[1]  # unread without RoPE
    k_ref = jax.new_ref(cache["k"], memory_space=plgpu.GMEM)
    v_ref = jax.new_ref(cache["v"], memory_space=plgpu.GMEM)
    outs = [jax.ShapeDtypeStruct((B, E), x.dtype)]
    outs += [jax.ShapeDtypeStruct(shape, f32) for shape in ((H * NS, B, E), (H * NS, 2, ROWS))]
    mesh = plgpu.Mesh(grid=(K, NS), grid_names=("kv", "slice"))
    run = mosaic.interpret_params() if interpret else False
    call = pl.kernel(body, out_type=tuple(outs), mesh=mesh, interpret=run, name="decode_attention")
    weights = [layer[w].reshape(-1, E) for w in ("wq", "wk", "wv")]  # [rows, E]: bitcasts
    wo = layer["wo"].reshape(E, H * D)
    norm = layer["attn_norm"]
    x_now, parts, stats = call(x, pending, norm, *weights, wo, rope, *clock, k_ref, v_ref)
    return x_now, parts, stats, {"k": k_ref[...], "v": v_ref[...]}

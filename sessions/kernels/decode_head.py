"""The decode step's head as one Mosaic GPU kernel: the last partials, the final norm, the logits.

After the last layer XLA's head is four kernels a token: the last MLP kernel's pending
partials added to x, the final norm's sum of squares, the norm and the unembedding (a
multiply-and-reduce), and the decode loop's select that keeps the last logits where a
step is not live (kv_cache.decode_steps). Here they are one launch, the MLP kernel's first
half (decode_mlp.py) with the embedding table [V, E] as its weight:

    x_now  = x + the pending partial sums       (float32, rounded to bf16: decode_residual)
    n      = rms_norm(x_now) * final_norm       (float32, rounded to bf16)
    logits = table @ n^T                        (float32, rounded to bf16 as XLA's
                                                 unembedding, then to float32)

CTA v owns the table's rows 64v..64v+63 (V/64 CTAs), streamed through a ring of weight
tiles, and writes its 64 logits of each token in place over the last ones (an aliased
ref), only where the step is live: a step that is not leaves them as it found them, as
the select did. Limits: those of the MLP kernel, and V a multiple of 64 (head_refusal);
a tied table (cfg.tied): an untied unembedding stays XLA's.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import decode_residual as residual
from sessions.kernels import mosaic
from sessions.kernels.decode_grid import IN_FLIGHT_NEED
from sessions.kernels.decode_mlp import SMEM_BUDGET, TILE, TILE_BYTES, mlp_rings
from sessions.kernels.decode_residual import ROWS, WT, swizzled


def head_refusal(cfg):
    """Why this kernel cannot be the head of cfg, in one line; None if it can."""
    if not cfg.tied:
        return "the unembedding is untied"
    if cfg.vocab % TILE:
        return f"the vocabulary {cfg.vocab} is no multiple of {TILE}"
    return None


def head_rings(cfg, P):
    """(pending chunks in flight, table tiles in flight) a CTA keeps: the MLP kernel's
    pending ring (decode_mlp.mlp_rings), then as many of its rows' E/64 table tiles as SMEM
    holds beside the residual's buffers and the logits' stage; all of them where they fit.
    The grid is V/64 CTAs, small for a small vocabulary, so each keeps all it can."""
    E, (depth, _) = cfg.embed, mlp_rings(cfg, P)
    room = SMEM_BUDGET - residual.smem_bytes(E, P, depth, False) - ROWS * TILE * 4
    return depth, max(1, min(E // TILE, room // TILE_BYTES))


def head_bytes_in_flight(cfg):
    """Table bytes the grid keeps in flight: V/64 CTAs x slots x 8 KB, after the last MLP
    kernel's F/64 partials. GPT-2's bytes vocabulary: 4 CTAs x 12 tiles, 384 KB, its whole
    table (393 KB) at once, yet a sixth of Little's law's 2.3 MB: too little work to fill
    the chip, whose stream takes about one HBM latency (head_share_of_need)."""
    return cfg.vocab // TILE * head_rings(cfg, cfg.ff // TILE)[1] * TILE_BYTES


def head_share_of_need(cfg):
    """The share of Little's law's bytes in flight (decode_grid.IN_FLIGHT_NEED) the head
    keeps, at most 1: the share of the HBM roof its table streams at (predicted)."""
    return min(1.0, head_bytes_in_flight(cfg) / IN_FLIGHT_NEED)


def _body(x_in, pending_in, scale_in, table, step, run, logits, x_out, *scratch):
    """One CTA: the residual sum and the norm, then its 64 rows of the table times them."""
    ring, ring_bars, n_s, o_s, *bufs = scratch
    E, B = x_in.shape[1], x_in.shape[0]
    v = jax.lax.axis_index("v")
    rows = pl.ds(v * TILE, TILE)
    runs = [(E // TILE, lambda k: [table.at[rows, pl.ds(k * TILE, TILE)]])]
    weights = mosaic.Ring(runs, ring, ring_bars)
    weights.start()  # in flight while the residual and the norm are computed
    residual.start(x_in, pending_in, None, scale_in, x_out, n_s, bufs, v, 1)

    def product(acc):  # logits^T [64, 8] = table[v's rows] @ normed^T
        weights.product(0, E // TILE, acc, lambda k: n_s.at[:, pl.ds(k * TILE, TILE)].T)
        return acc[...]

    out = pl.run_scoped(product, plgpu.ACC((TILE, ROWS), jnp.float32))
    out = out.astype(x_in.dtype).astype(jnp.float32)  # rounded as XLA's unembedding

    @pl.when(residual.pos_and_live(step, run)[1])  # one not live keeps the logits it found
    def _():
        o_s.T[...] = plgpu.layout_cast(out, WT)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s.at[pl.ds(0, B)], logits.at[:, pl.ds(v * TILE, TILE)])
        plgpu.wait_smem_to_gmem(0)


def head(w, x, pending, held, clock, cfg, *, interpret):
    """x [B, E] bf16, pending [P, B, E] float32, held: the last logits float32 [B, V],
    clock: where the step is (kernel_step.clock) -> the logits float32 [B, V] of x_now
    through the final norm and the tied table, or `held` where the step is not live. One
    kernel launch."""
    (B, E), P, V = x.shape, pending.shape[0], w["embed"].shape[0]
    depth, S = head_rings(cfg, P)
    scratch = [
        plgpu.SMEM((S, TILE, TILE), x.dtype, transforms=swizzled(x.dtype)),  # the table's ring
        plgpu.Barrier(num_arrivals=1, num_barriers=S),
        plgpu.SMEM((ROWS, E), x.dtype, transforms=swizzled(x.dtype)),  # normed tokens: wgmma's B
        plgpu.SMEM((ROWS, TILE), jnp.float32),  # a CTA's logits, staged for their copy out
        *residual.scratch(E, P, depth, x.dtype, False),  # x, pending, norm
    ]

    def body(*refs):
        pl.run_scoped(lambda *s: _body(*refs, *s), *scratch)

    mesh = plgpu.Mesh(grid=(V // TILE,), grid_names=("v",))
    run = mosaic.interpret_params() if interpret else False
    out = jax.ShapeDtypeStruct((B, E), x.dtype)  # x_now, which no one reads after the head
    call = pl.kernel(body, out_type=out, mesh=mesh, interpret=run, name="decode_head")
    logits = jax.new_ref(held, memory_space=plgpu.GMEM)
    call(x, pending, w["final_norm"].astype(x.dtype), w["embed"], *clock, logits)
    return logits[...]

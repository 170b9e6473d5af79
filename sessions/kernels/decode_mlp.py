"""The MLP half of a decode layer as one Mosaic GPU kernel: residual, norm, MLP.

Decode is a chain of matrix-vector products. Each new token is one row x [E]
(B rows at batch B), and every weight is read once a token to multiply it:
w_in [F, E] @ x^T, then w_out [E, F] @ h^T. That is 2·B FLOPs for each bf16
weight of 2 bytes, B FLOPs a byte, at most 8 here, where an H100 does about 295
FLOPs in the time it reads a byte (989 TFLOP/s of bf16 over 3.35 TB/s, its
datasheet). So the time is the weights' bytes over the bandwidth, or, where they
are small, the launches: XLA runs a decode layer as about 13 kernels (norms,
converts, multiply-and-reduce fusions; 163 a GPT-2 token, compiled for h100:1:
roofline/launch_bound.py)
of about 1.5 us each, against 2.8 us for GPT-2's 9.4 MB of MLP weights at the
roof. This kernel is the layer's MLP half in one launch:

    x_now   = x + the pending partial sums           (float32, rounded to bf16; the
                                                      attention's merged: decode_residual)
    n       = rms_norm(x_now) * mlp_norm              (float32, rounded to bf16)
    h       = relu(w_in @ n^T)                        (or silu(w_gate @ n^T) * (w_in @ n^T))
    partial = w_out[:, f's 64 columns] @ h^T          (float32, one per CTA f)

The tokens sit in wgmma's N. Hopper's tensor-core instruction, wgmma, multiplies
an [M, K] matrix in shared memory (SMEM) by a [K, N] one: M = 64 rows a
warpgroup, N any multiple of 8. A decode weight is stored [out, in]
(sessions/inference/layout.py), so 64 of its rows are the A operand as they stand.
The tokens, padded to 8 rows, are [8, E] in SMEM, K-major: their transpose is B,
with N = 8. So y^T [64 outputs, 8 tokens] = W[64, E] @ x^T, and up to 8 tokens
cost no more than one (in M they would fill 8 of 64 rows). The decode layout
needs no copy of its own: CTA f's tiles of w_out are 64 rows of 128 contiguous
bytes, a box TMA reads as readily as a contiguous one.

The weights stream through SMEM by TMA, the copy engine. CTA f owns rows
64f..64f+63 of w_in (and w_gate) and the same 64 columns of w_out, read as 64 x
64 tiles (8 KB of bf16) in one sequence: E/64 tiles of w_in (each with w_gate's),
then E/64 of w_out. A ring of S buffers, each with its barrier, keeps S tiles
in flight: TMA fills slot t+S while the tensor cores read slot t. The first S
copies start before the residual sum and the norm, which overlap them. By
Little's law the grid needs about 2.3 MB in flight to stream at an H100's roof
(decode_grid.py): F/64 CTAs x S x 8 KB (mlp_bytes_in_flight) is 48 x 8 x 8 KB =
3.1 MB for GPT-2, 128 x 8 x 8 KB = 8.4 MB for the 1.2B shape (predicted). The
first product accumulates h^T [64, 8] in registers over E/64 tiles;
rounded to bf16 as XLA rounds it, through relu, h is the second product's B
operand; each w_out tile then gives 64 of the E outputs.

Pending partials. F/64 CTAs each sum their own slice of w_out's contraction, so
the output is a sum of F/64 partials [B, E] float32. Adding them up would take a
grid-wide barrier or one more launch; instead each CTA writes its own, and the
next kernel adds them to x as it starts (x_now above), a few at a time in a ring
of their own; so does this one with the attention kernel's, which come weighted
by its cache slices' softmax statistics (decode_residual.py). Every CTA computes
x_now itself (B·E numbers, from L2) and CTA 0 writes it out. x_now is rounded
to bf16 once, after the whole sum, where XLA rounds the MLP's output to bf16
first: the two differ by about one bf16 step.

Limits: E and F multiples of 64 (the tile), E ≤ 2048 (the tokens and the normed
tokens sit in SMEM, [8, E] each), batch ≤ 8, bfloat16 (see
mlp_refusal). Mosaic GPU's interpreter runs it from JAX 0.12 on; JAX 0.10's
lacks plgpu.load and transposed wgmma operands. Compiled for an H100, it builds
on JAX 0.10 (the chip compilers this course's 3.11 environment has).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import decode_grid, mosaic
from sessions.kernels import decode_residual as residual
from sessions.kernels.decode_residual import ROWS, WT, swizzled

TILE = 64  # wgmma's M, the rows of a weight a warpgroup multiplies; also each tile's K
# Weight tiles in flight per CTA, 8 KB each, where SMEM holds them (mlp_rings).
SLOTS = 8
PENDING_SLOTS = 4  # pending partials in flight
MAX_EMBED = 2048
SMEM_BUDGET = 200 * 1024  # bytes of SMEM we plan on; an H100 gives a CTA up to 227 KB
TILE_BYTES = TILE * TILE * 2  # a bf16 weight tile
OUT_STAGES = 2 * ROWS * TILE * 4  # two [8, 64] float32 stages for the output's copies out


def tile_runs(w_in, w_gate, w_out, f):
    """The weight tiles CTA f reads, in order, as runs of E/64 (mosaic.Ring): w_in's
    [64 rows of f's block, 64 of E] for each 64 of E (then w_gate's), then w_out's
    [64 of E, f's 64 columns]."""
    rows, n_e = pl.ds(f * TILE, TILE), w_in.shape[1] // TILE
    inputs = [w_in] if w_gate is None else [w_in, w_gate]
    runs = [(n_e, lambda k, w=w: [w.at[rows, pl.ds(k * TILE, TILE)]]) for w in inputs]
    return [*runs, (n_e, lambda j: [w_out.at[pl.ds(j * TILE, TILE), rows]])]


def mlp_body(*refs, gated, weighted, slices):
    """One CTA: the residual sum, the norm, and its F-block's share of the MLP."""
    x_in, pending_in, *refs = refs
    stats_in = refs.pop(0) if weighted else None
    scale_in, w_in, *refs = refs
    w_gate = refs.pop(0) if gated else None
    w_out, x_out, pending_out, ring, ring_bars, n_s, *bufs, h_s, o_s = refs
    B, n_e = x_in.shape[0], x_in.shape[1] // TILE
    f = jax.lax.axis_index("f")
    weights = mosaic.Ring(tile_runs(w_in, w_gate, w_out, f), ring, ring_bars)
    weights.start()  # in flight while the residual and the norm are computed
    residual.start(x_in, pending_in, stats_in, scale_in, x_out, n_s, bufs, f, slices)
    of_n = lambda k: n_s.at[:, pl.ds(k * TILE, TILE)].T  # noqa: E731  normed^T's k-th 64

    def first_product(h_acc, g_acc):  # h^T [64, 8] = w_in[f's block] @ normed^T
        weights.product(0, n_e, h_acc, of_n)
        h = h_acc[...].astype(x_in.dtype).astype(jnp.float32)  # rounded as XLA's dense
        if gated:  # then g^T = w_gate[f's block] @ normed^T
            weights.product(n_e, n_e, g_acc, of_n)
            g = g_acc[...].astype(x_in.dtype).astype(jnp.float32)
            return (g * jax.nn.sigmoid(g) * h).astype(x_in.dtype)
        return jnp.maximum(h, 0.0).astype(x_in.dtype)

    acc = plgpu.ACC((TILE, ROWS), jnp.float32)
    h = pl.run_scoped(first_product, acc, acc if gated else None)
    h_s.T[...] = plgpu.layout_cast(h, WT)
    plgpu.commit_smem()
    done = (2 if gated else 1) * n_e  # the tiles of the first product

    @pl.loop(0, n_e)
    def _(j):  # out^T [64, 8] for each 64 of E = w_out tile @ h^T, out through 2 stages

        def second_product(acc):
            weights.step(done + j, acc, h_s.T)
            return acc[...]

        out = pl.run_scoped(second_product, plgpu.ACC((TILE, ROWS), jnp.float32))
        stage = o_s.at[jax.lax.rem(j, 2)]
        plgpu.wait_smem_to_gmem(1)  # the copy out of this stage, 2 tiles ago, is done
        stage.T[...] = plgpu.layout_cast(out, WT)
        plgpu.commit_smem()
        dst = pending_out.at[f, :, pl.ds(j * TILE, TILE)]
        plgpu.copy_smem_to_gmem(stage.at[pl.ds(0, B)], dst)

    plgpu.wait_smem_to_gmem(0)


def mlp_refusal(cfg, batch):
    """Why this kernel cannot run cfg at `batch`, in one line; None if it can."""
    E, F = cfg.embed, cfg.ff
    if cfg.dtype != "bfloat16":
        return "--decode-impl pallas runs bfloat16: add --dtype bfloat16"
    if batch > ROWS:
        return f"--decode-impl pallas runs batches up to {ROWS}, not {batch}"
    if E % TILE or F % TILE:
        return f"--decode-impl pallas needs embed and ff multiples of {TILE}, not {E} and {F}"
    if E > MAX_EMBED:
        return f"--decode-impl pallas holds the tokens in SMEM: embed up to {MAX_EMBED}, not {E}"
    return None


def mlp_rings(cfg, P, weighted=False):
    """(pending partials in flight, weight tiles in flight) a CTA of this kernel keeps:
    the partials first, leaving room for 4 tiles; then as many tiles as fit, up to SLOTS.
    SMEM: start()'s (34·E + 32·E a partial's slot), 1 KB of h, 8 KB a weight tile."""
    E = cfg.embed
    room = SMEM_BUDGET - residual.smem_bytes(E, P, 0, weighted) - 1024 - OUT_STAGES
    slot = 32 * residual.chunk(E)  # a pending chunk [8, C] float32
    depth = max(1, min(P, PENDING_SLOTS, (room - 4 * TILE_BYTES) // slot))
    tiles = min(SLOTS, (room - depth * slot) // TILE_BYTES)
    return depth, min(tiles, (3 if cfg.gated else 2) * (E // TILE))  # no more than its tiles


def mlp_bytes_in_flight(cfg, batch, P=None):
    """Weight bytes the grid keeps in flight while it streams them: CTAs x slots x 8 KB
    (Little's law asks an H100 for about 2.3 MB). P: the partials it starts from (by
    default the attention kernel's, decode_grid.partials); batch does not change it."""
    P = decode_grid.partials(cfg) if P is None else P
    return cfg.ff // TILE * mlp_rings(cfg, P, cfg.attention)[1] * TILE_BYTES


def mlp_layer(layer, x, pending, cfg, *, stats=None, slices=1, interpret):
    """x [B, E] (cfg.dtype) and pending [P, B, E] float32 -> (x_now [B, E], the
    layer's output as F/64 partials [F/64, B, E] float32), for a layer in the
    decode layout (w_in, w_gate [F, E], w_out [E, F], mlp_norm [E]). stats [P, 2, 8]:
    the attention kernel's, whose partials are merged by them (decode_residual)."""
    B, E = x.shape
    F, P = layer["w_in"].shape[0], pending.shape[0]
    gated, dt, weighted = cfg.gated, x.dtype, stats is not None
    depth, S = mlp_rings(cfg, P, weighted)
    scratch = [
        plgpu.SMEM((S, TILE, TILE), dt, transforms=swizzled(dt)),  # the weights' ring
        plgpu.Barrier(num_arrivals=1, num_barriers=S),
        plgpu.SMEM((ROWS, E), dt, transforms=swizzled(dt)),  # normed tokens: wgmma's B
        *residual.scratch(E, P, depth, dt, weighted),  # x, pending, norm
        plgpu.SMEM((ROWS, TILE), dt, transforms=swizzled(dt)),  # h: the second B
        plgpu.SMEM((2, ROWS, TILE), jnp.float32),  # the output's 64-column blocks, staged
    ]
    body = functools.partial(mlp_body, gated=gated, weighted=weighted, slices=slices)
    run = mosaic.kernel(
        body,
        interpret=interpret,
        out_type=(
            jax.ShapeDtypeStruct((B, E), dt),
            jax.ShapeDtypeStruct((F // TILE, B, E), jnp.float32),
        ),
        scratch_types=scratch,
        grid=(F // TILE,),
        grid_names=("f",),
    )
    w_gate = [layer["w_gate"]] if gated else []  # plgpu.kernel takes arrays only
    merge = [stats] if weighted else []
    norm = layer["mlp_norm"].astype(dt)
    return run(x, pending, *merge, norm, layer["w_in"], *w_gate, layer["w_out"])

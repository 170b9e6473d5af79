"""The MLP half of a decode layer as one Mosaic GPU kernel: residual, norm, MLP.

Decode is a chain of matrix-vector products. Each new token is one row x [E]
(B rows at batch B), and every weight is read once a token to multiply it:
w_in [F, E] @ x^T, then w_out [E, F] @ h^T. That is 2·B FLOPs for each bf16
weight of 2 bytes, B FLOPs a byte, at most 8 here, where an H100 does about 295
FLOPs in the time it reads a byte (989 TFLOP/s of bf16 over 3.35 TB/s, its
datasheet). So the time is the weights' bytes over the bandwidth, or, where they
are small, the launches: XLA runs a decode layer as about 13 kernels (norms,
converts, multiply-and-reduce fusions; 164 a GPT-2 token, compiled for h100:1:
roofline/launch_bound.py)
of about 1.5 us each, against 2.8 us for GPT-2's 9.4 MB of MLP weights at the
roof. This kernel is the layer's MLP half in one launch:

    x_now   = x + the pending partial sums           (float32, rounded to bf16)
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
copies start before the residual sum and the norm, which overlap them. The
first product accumulates h^T [64, 8] in registers over E/64 tiles;
rounded to bf16 as XLA rounds it, through relu, h is the second product's B
operand; each w_out tile then gives 64 of the E outputs.

Pending partials. F/64 CTAs each sum their own slice of w_out's contraction, so
the output is a sum of F/64 partials [B, E] float32. Adding them up would take a
grid-wide barrier or one more launch; instead each CTA writes its own, and the
next kernel adds them to x as it starts (x_now above), a few at a time in a ring
of their own. Every CTA computes x_now itself (B·E numbers, from L2) and CTA 0
writes it out. x_now is rounded to bf16 once, after the whole sum, where XLA
rounds the MLP's output to bf16 first: the two differ by about one bf16 step.

Limits: E and F multiples of 64 (the tile), E ≤ 2048 (the tokens, the normed
tokens and [8, E] float32 partials sit in SMEM), batch ≤ 8, bfloat16 (see
mlp_refusal). Mosaic GPU's interpreter runs it from JAX 0.12 on; JAX 0.10's
lacks plgpu.load and transposed wgmma operands. Compiled for an H100, it builds
on JAX 0.10 (the chip compilers this course's 3.11 environment has).
"""

import functools
import inspect

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.kernels import mosaic

TILE = 64  # wgmma's M, the rows of a weight a warpgroup multiplies; also each tile's K
ROWS = 8  # the tokens padded to wgmma's smallest N
# Weight tiles in flight per CTA, 8 KB each. By Little's law a CTA pulls its bytes in
# flight per round trip to HBM (about a microsecond): GPT-2's 48 CTAs need about 70
# GB/s each for 3.35 TB/s, some 64 KB in flight. 8 where SMEM holds them; untuned.
SLOTS = 8
PENDING_SLOTS = 4  # pending partials in flight
EPS = 1e-6  # transformer.rms_norm's
MAX_EMBED = 2048
SMEM_BUDGET = 200 * 1024  # bytes of SMEM we plan on; an H100 gives a CTA up to 227 KB

WT = plgpu.Layout.WGMMA_TRANSPOSED  # [E, 8] in registers, read from an [8, E] buffer's transpose


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
    return next(c for c in (256, 128, TILE) if E % c == 0)


def copy_rows_in(src, dst, barrier):
    """src [B, E] in GMEM -> the first B rows of dst [E/C, 8, C] in SMEM, one copy
    per C columns (each C x 8 block contiguous, as TMA needs); barrier counts E/C."""
    n, C = dst.shape[0], dst.shape[-1]
    for i in range(n):
        rows = (pl.ds(0, src.shape[0]),) if src.ndim == 2 else ()
        plgpu.copy_gmem_to_smem(src.at[..., pl.ds(i * C, C)], dst.at[(i, *rows)], barrier)


def copy_rows_out(src, dst):
    """The first B rows of src [E/C, 8, C] in SMEM -> dst [B, E] in GMEM."""
    n, C = src.shape[0], src.shape[-1]
    for i in range(n):
        plgpu.copy_smem_to_gmem(src.at[i, pl.ds(0, dst.shape[0])], dst.at[:, pl.ds(i * C, C)])


def tile_sources(w_in, w_gate, w_out, f):
    """The weight tiles CTA f reads, in order: for each 64 columns of E, w_in's
    [64 rows of f's block, 64] (then w_gate's); then w_out's [64 rows, f's 64 columns]."""
    rows, n_e = pl.ds(f * TILE, TILE), w_in.shape[1] // TILE
    inputs = [w_in] if w_gate is None else [w_in, w_gate]
    first = [w.at[rows, pl.ds(k * TILE, TILE)] for k in range(n_e) for w in inputs]
    return first + [w_out.at[pl.ds(j * TILE, TILE), rows] for j in range(n_e)]


def mlp_body(*refs, gated):
    """One CTA: the residual sum, the norm, and its F-block's share of the MLP."""
    x_in, pending_in, scale_in, w_in, *refs = refs
    w_gate = refs.pop(0) if gated else None
    w_out, x_out, pending_out, x_s, p_s, scale_s, n_s, h_s, ring, ring_bars, bars, p_bars = refs
    E, P = x_in.shape[1], pending_in.shape[0]
    f = jax.lax.axis_index("f")
    tiles = tile_sources(w_in, w_gate, w_out, f)
    S = ring.shape[0]  # weight tiles in flight

    def fetch(t):  # tile t into its slot; its barrier says when it has landed
        plgpu.copy_gmem_to_smem(tiles[t], ring.at[t % S], ring_bars.at[t % S])

    for t in range(S):
        fetch(t)
    copy_rows_in(x_in, x_s, bars.at[0])
    copy_rows_in(scale_in, scale_s, bars.at[1])
    depth = p_s.shape[0]  # pending partials in flight

    def fetch_pending(p):
        copy_rows_in(pending_in.at[p], p_s.at[p % depth], p_bars.at[p % depth])

    for p in range(min(depth, P)):
        fetch_pending(p)
    plgpu.barrier_wait(bars.at[0])
    # Rows B..7 of the buffers hold whatever SMEM held: each column of a wgmma's
    # result reads one token alone, so they never reach the B real ones.
    n_c = x_s.shape[0]
    x_t = [load_t(x_s.at[i].T).astype(jnp.float32) for i in range(n_c)]  # [C, 8] each
    for p in range(P):  # the pending partials, in order, in float32
        plgpu.barrier_wait(p_bars.at[p % depth])
        x_t = [x_t[i] + load_t(p_s.at[p % depth, i].T) for i in range(n_c)]
        if p + depth < P:  # refill the slot once every thread has read it
            plgpu.commit_smem()  # a warpgroup barrier (and a fence) before the TMA
            fetch_pending(p + depth)
    x_now = [x.astype(x_in.dtype) for x in x_t]
    for i in range(n_c):
        x_s.at[i].T[...] = x_now[i]
    plgpu.commit_smem()

    @pl.when(f == 0)
    def _():
        copy_rows_out(x_s, x_out)

    # rms_norm as transformer.rms_norm computes it: float32, x * rsqrt(mean(x²) + eps) * scale.
    ms = sum(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=0) for x in x_now) / E  # [8]
    del x_t, x_now  # read again from SMEM below, a chunk at a time: fewer registers
    C = x_s.shape[-1]
    plgpu.barrier_wait(bars.at[1])

    def across(v, dim):  # v broadcast to [C, 8] along the other dim
        return plgpu.layout_cast(jax.lax.broadcast_in_dim(v, (C, ROWS), (dim,)), WT)

    r = across(jax.lax.rsqrt(ms + EPS), 1)
    for i in range(n_c):
        scale = across(load_t(scale_s.at[i], WT.reduce(1)).astype(jnp.float32), 0)
        x32 = load_t(x_s.at[i].T).astype(jnp.float32)
        n_s.at[:, pl.ds(i * C, C)].T[...] = (x32 * r * scale).astype(n_s.dtype)
    plgpu.commit_smem()

    def step(t, acc, b_operand):  # wait for tile t, multiply it in, refill its slot
        plgpu.barrier_wait(ring_bars.at[t % S])
        plgpu.wgmma(acc, ring.at[t % S], b_operand)
        plgpu.wgmma_wait(0)  # the slot is read: it may be refilled
        if t + S < len(tiles):
            fetch(t + S)

    per_k = 2 if gated else 1
    n_e = E // TILE

    def first_product(h_acc, g_acc):  # h^T [64, 8] = w_in[f's block] @ normed^T
        for k in range(n_e):
            b = n_s.at[:, pl.ds(k * TILE, TILE)].T
            step(per_k * k, h_acc, b)
            if gated:
                step(per_k * k + 1, g_acc, b)
        h = h_acc[...].astype(x_in.dtype).astype(jnp.float32)  # rounded as XLA's dense
        if gated:
            g = g_acc[...].astype(x_in.dtype).astype(jnp.float32)
            return (g * jax.nn.sigmoid(g) * h).astype(x_in.dtype)
        return jnp.maximum(h, 0.0).astype(x_in.dtype)

    acc = plgpu.ACC((TILE, ROWS), jnp.float32)
    h = pl.run_scoped(first_product, acc, acc if gated else None)
    h_s.T[...] = plgpu.layout_cast(h, WT)
    plgpu.commit_smem()

    for j in range(n_e):  # out^T [64, 8] for each 64 of E = w_out tile @ h^T

        def second_product(acc, j=j):
            step(per_k * n_e + j, acc, h_s.T)
            return acc[...]

        out = pl.run_scoped(second_product, plgpu.ACC((TILE, ROWS), jnp.float32))
        block = p_s.at[0, j * TILE // C, :, pl.ds(j * TILE % C, TILE)]
        block.T[...] = plgpu.layout_cast(out, WT)
    plgpu.commit_smem()
    copy_rows_out(p_s.at[0], pending_out.at[f])
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


def mlp_layer(layer, x, pending, cfg, *, interpret):
    """x [B, E] (cfg.dtype) and pending [P, B, E] float32 -> (x_now [B, E], the
    layer's output as F/64 partials [F/64, B, E] float32), for a layer in the
    decode layout (w_in, w_gate [F, E], w_out [E, F], mlp_norm [E])."""
    B, E = x.shape
    F = layer["w_in"].shape[0]
    gated, C = cfg.gated, chunk(E)
    # SMEM: 34·E bytes of tokens, normed tokens and scale, 1 KB of h, 32·E bytes a
    # pending partial (8 rows of float32), 8 KB a weight tile. Pending partials first,
    # leaving room for 4 tiles; then as many tiles as fit, up to SLOTS.
    room = SMEM_BUDGET - 34 * E - 1024
    depth = max(1, min(pending.shape[0], PENDING_SLOTS, (room - 4 * TILE**2 * 2) // (32 * E)))
    tile_slots = min(SLOTS, (room - depth * 32 * E) // (TILE**2 * 2))
    S = min(tile_slots, (3 if gated else 2) * (E // TILE))  # no more slots than tiles
    dt = x.dtype
    scratch = [
        plgpu.SMEM((E // C, ROWS, C), dt),  # the tokens, then x_now
        plgpu.SMEM((depth, E // C, ROWS, C), jnp.float32),  # pending partials, then ours
        plgpu.SMEM((E // C, C), dt),  # the norm's scale
        plgpu.SMEM((ROWS, E), dt, transforms=swizzled(dt)),  # normed tokens: wgmma's B
        plgpu.SMEM((ROWS, TILE), dt, transforms=swizzled(dt)),  # h: the second B
        plgpu.SMEM((S, TILE, TILE), dt, transforms=swizzled(dt)),  # the weights' ring
        plgpu.Barrier(num_arrivals=1, num_barriers=S),
        plgpu.Barrier(num_arrivals=E // C, num_barriers=2),
        plgpu.Barrier(num_arrivals=E // C, num_barriers=depth),
    ]
    run = mosaic.kernel(
        functools.partial(mlp_body, gated=gated),
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
    return run(x, pending, layer["mlp_norm"].astype(dt), layer["w_in"], *w_gate, layer["w_out"])

"""The attention kernel's grid and rings (decode_attention.py), sized by Little's law.

A stream from HBM runs at the roof only with bandwidth x latency bytes in flight:
an H100's 3.35 TB/s (datasheet) x about 0.7 us from HBM ≈ 2.3 MB for the whole
grid (IN_FLIGHT_NEED, predicted, not measured). A CTA keeps in flight what its
rings hold: W weight tiles (8 KB each) while it streams weights, C cache tiles (a
64-slot tile of k and of v: 2 x 64 x D x 2 bytes) while it streams the cache. So

    in flight = CTAs x min(W x 8 KB, C x 256·D bytes),   CTAs = K x slices

The rings must fit a CTA's SMEM (an H100 gives up to 227 KB; we plan on 220 KB) beside
xn [8, E], and beside the larger of the residual's buffers (x, the pending ring:
decode_residual) and the attention's (q, the new k and v, p, stages), which reuse the
same bytes one after the other. RINGS lists (pending, W, C) depths, most preferred
first; the first that fits is taken. Then the fewest slices of T that reach
IN_FLIGHT_NEED (each slice adds H partials for the MLP kernel to read and merge).

GPT-2 (K 12, E 768, D 64, T 1024): 4 slices, 48 CTAs, W 8, C 4: 48 x min(64 KB, 64 KB)
= 3.1 MB. The 1.2B shape (K 16, E 2048, D 128): W 4, C 2, so 8 slices, 128 CTAs x 32 KB
= 4.2 MB. Predicted from these sizes; the batch does not change them.
"""

from roofline.plan.decode_estimate import H100_BANDWIDTH, littles_law_bytes
from sessions.kernels import decode_residual as residual

TILE = 64  # wgmma's M and a K chunk: 64 bf16, one 128-byte swizzle line
MAX_SLICES = 8  # slices of T a KV head at most
# Little's law: an H100's 3.35 TB/s x about 0.7 us from HBM, the bytes a grid must keep in
# flight to stream at the roof (predicted, not measured; the estimate's own figures).
IN_FLIGHT_NEED = int(littles_law_bytes(H100_BANDWIDTH))
SMEM_BYTES = 220 * 1024  # what we plan on of an H100's 227 KB a CTA (CUDA guide, sm_90)
TILE_BYTES = TILE * TILE * 2  # a bf16 weight tile
# (pending slots, weight slots, cache slots), most preferred first: the first that fits.
RINGS = [(2, 8, 4), (2, 6, 4), (2, 4, 2), (1, 4, 2), (1, 4, 1), (1, 3, 1), (1, 2, 1)]


def _smem(cfg, P, rings):
    """Bytes of SMEM a CTA takes: the rings, xn and cos/sin for the whole kernel; then the
    larger of the residual's buffers and the attention's (q, new k and v, p, out stage)."""
    E, D, G = cfg.embed, cfg.head_dim, cfg.heads // cfg.n_kv_heads
    depth, w, c = rings
    whole = w * TILE_BYTES + c * 4 * TILE * D + 16 * E + 8 * D + 1024
    first = residual.smem_bytes(E, P, depth, False) - 16 * E
    then = 2 * TILE * G * D + 4 * TILE * D + TILE_BYTES + 4 * TILE * TILE + 4096 + 4096
    return whole + max(first, then)


def _rings(cfg, P, n):
    """(pending slots, weight slots, cache slots) a CTA fits with n slices, or None."""
    per_slice = cfg.seq // TILE // n
    for depth, w, c in RINGS:
        depth, c = max(1, min(depth, P)), min(c, per_slice)
        if _smem(cfg, P, (depth, w, c)) <= SMEM_BYTES:
            return depth, w, c
    return None


def _in_flight(cfg, n, rings):
    """The least the grid keeps in flight while it streams weights or cache: CTAs x
    min(W x 8 KB, C x a cache tile's k and v)."""
    _, w, c = rings
    return cfg.n_kv_heads * n * min(w * TILE_BYTES, c * 2 * TILE * cfg.head_dim * 2)


def slices(cfg):
    """Slices of T a KV head is split into: the fewest (each adds H partials for the MLP
    to read) whose grid keeps IN_FLIGHT_NEED in flight, else the most; n divides T/64."""
    P, tiles = cfg.ff // TILE, cfg.seq // TILE
    fits = [n for n in range(1, MAX_SLICES + 1) if tiles % n == 0 and _rings(cfg, P, n)]
    enough = [n for n in fits if _in_flight(cfg, n, _rings(cfg, P, n)) >= IN_FLIGHT_NEED]
    return (enough or fits or [1])[0 if enough else -1]


def partials(cfg):
    """Partial sums this kernel leaves: one a query head and slice."""
    return cfg.heads * slices(cfg)


def attention_rings(cfg, P):
    """(pending slots, weight slots, cache slots) a CTA uses with P pending partials."""
    return _rings(cfg, P, slices(cfg))


def attention_bytes_in_flight(cfg, batch, P=None):
    """The least the grid keeps in flight while it streams weights or cache: CTAs x
    min(W x 8 KB, C x a cache tile's k and v). P: the MLP's partials (F/64 by default);
    batch does not change it (the cache's tiles are a row's at a time)."""
    n = slices(cfg)
    return _in_flight(cfg, n, _rings(cfg, cfg.ff // TILE if P is None else P, n))

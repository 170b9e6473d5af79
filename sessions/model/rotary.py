"""Rotary positions (RoPE): each query and key turned by an angle that grows with its position.

Learned positions (sessions/model/positions.py) add a vector per position to the token's
embedding, so attention must learn what position 3 beside position 7 means, again at
every distance, and no table reaches past the positions it was trained on. RoPE
(Su et al. 2021, "RoFormer", arxiv.org/abs/2104.09864) adds nothing to the residual
stream. It rotates each pair of a head's D dims, in q and in k, by the angle

    theta[s, i] = s · base^(-2i/D),   i = 0 .. D/2 - 1,  at position s

after their projections and before attention. A rotation keeps lengths, and turning q
(at m) by m·w and k (at n) by n·w turns q·k by the difference alone: q·k after the
rotation is a function of q, k and m - n, never of m or n. So attention sees how far
back a key is, not where it is. Each pair turns at its own rate, in radians a position:
from 1 (i = 0, a full turn every 2π ≈ 6.3 positions) down to nearly 1/base (i near D/2,
a turn every 2π·base: 63,000 positions at base 10,000): fast pairs tell neighbours
apart, slow ones distances of thousands. LLaMA-2 takes base 10,000, LLaMA-3 500,000.

Which dims pair up: dim i with dim i + D/2, the "rotate_half" halves of GPT-NeoX and of
Hugging Face's LLaMA, not the interleaved neighbours (2i, 2i + 1) of RoFormer's paper
and Meta's own LLaMA code. The two are the same model with wq's and wk's D columns
permuted, and the halves are what published LLaMA checkpoints in the Hugging Face
format hold (its converter permutes Meta's weights to them). They are also two
contiguous slices of the head, where the interleaved pairs are a stride-2 gather.

No table is learned and none is stored: the angles are computed from the positions in
float32 (a bfloat16 angle would be off by whole radians at position 1,000), the rotation
is done in float32 and cast back. The decode cache keeps its keys already rotated, each
at its own position, so a step rotates only its new token's q and k
(sessions/inference/kv_cache.py).
"""

import jax.numpy as jnp


def frequencies(head_dim, base):
    """float32 [D/2]: each pair's angle per position, base^(-2i/D)."""
    return base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def rotate(x, start, base):
    """x: [B, S, N, D], N heads (H of queries or K of keys) at positions
    start..start+S-1 (start may be traced: a decoder's position) -> the same,
    each pair (i, i + D/2) of every head turned by (start + s)·base^(-2i/D).
    start is a scalar (every row at the same positions) or int [B], a row's own
    (a serving engine's slots, sessions/serve/paged_cache.py)."""
    S, D = x.shape[1], x.shape[-1]
    positions = (jnp.asarray(start)[..., None] + jnp.arange(S)).astype(jnp.float32)  # [(B,) S]
    theta = positions[..., None] * frequencies(D, base)  # [(B,) S, D/2]
    cos, sin = jnp.cos(theta)[..., None, :], jnp.sin(theta)[..., None, :]  # [(B,) S, 1, D/2]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : D // 2], x32[..., D // 2 :]  # the pairs: dim i with dim i + D/2
    turned = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return turned.astype(x.dtype)

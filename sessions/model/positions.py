"""Learned positional embeddings.

Attention alone is order invariant: the softmax-weighted sum over keys is the
same whatever order the earlier tokens came in, so "dog bites man" and "man
bites dog" would look alike to the last token. Adding a learned vector per
position to each token's embedding breaks that symmetry.
"""

import jax
import jax.numpy as jnp


def init_positions(key, seq, embed):
    """One learned vector per position: [S, E]."""
    # Small, like the token embedding: the residual stream starts near zero
    # and each block's output dominates it early in training.
    return 0.01 * jax.random.normal(key, (seq, embed))


def add_positions(x, pos_SE, start=0):
    """x: [B, S, E] token embeddings at positions start..start+S-1 -> [B, S, E];
    position s gets pos_SE[s]. start may be traced (a decoder's position), or an
    int [B] of each row's own start (past the table: its last row, a padded token's).

    The positions are broadcast over the batch as an outer product with ones,
    "B,SE->BSE": the same numbers as `x + pos[None]`, but a different gradient
    program. The gradient of a broadcast is a sum over the batch; taken from
    `x + pos[None]` it is a reduction over B, and for it XLA's GPU compiler laid
    the residual stream out batch-minor, transposing it at every norm: 35
    transposing kernels, 1.5 ms of the course step's 8.9 ms (the bf16 scatter
    aside) on an H100 (its trace, tests/fixtures/h100/profile-early). Taken from
    the einsum it is a matmul with the ones, "B,BSE->SE", which reads the
    gradient as it lies: the step compiled for h100:1 has no transpose left."""
    B, S, _ = x.shape
    if jnp.ndim(start):  # int [B], each row at its own positions (a serving engine's slots)
        rows = jnp.asarray(start)[:, None] + jnp.arange(S)  # [B, S]
        return x + jnp.take(pos_SE, rows, axis=0, mode="clip").astype(x.dtype)
    pos = jax.lax.dynamic_slice_in_dim(pos_SE, start, S).astype(x.dtype)
    return x + jnp.einsum("B,SE->BSE", jnp.ones((B,), x.dtype), pos)

"""Learned positional embeddings.

Attention alone is order invariant: the softmax-weighted sum over keys is the
same whatever order the earlier tokens came in, so "dog bites man" and "man
bites dog" would look alike to the last token. Adding a learned vector per
position to each token's embedding breaks that symmetry.
"""

import jax


def init_positions(key, seq, embed):
    """One learned vector per position: [S, E]."""
    # Small, like the token embedding: the residual stream starts near zero
    # and each block's output dominates it early in training.
    return 0.01 * jax.random.normal(key, (seq, embed))


def add_positions(x, pos_SE, start=0):
    """x: [B, S, E] token embeddings at positions start..start+S-1 -> [B, S, E];
    position s gets pos_SE[s]. start may be traced (a decoder's position)."""
    S = x.shape[1]
    return x + jax.lax.dynamic_slice_in_dim(pos_SE, start, S)[None, :, :]

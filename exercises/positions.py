"""Positions: attention alone sees the earlier tokens as a set.

The last token's query is scored against every earlier key, and the softmax-
weighted sum of their values does not depend on the order the terms come in.
So in a one-layer model without positional embeddings, shuffling the earlier
tokens leaves the last output unchanged: "dog bites man" = "man bites dog".
A learned vector per position (sessions/model/positions.py) breaks the symmetry.

(With two layers or more, the earlier positions' own outputs depend on the
order of their prefixes, so the invariance holds only for one layer.)
"""

import jax
import jax.numpy as jnp

from sessions.model import forward


def last_output_change(params, tokens, cfg, key):
    """How far the last position's logits move when the earlier tokens are shuffled.

    tokens: int [B, S]. Shuffle positions 0 .. S-2 with one random
    permutation (jax.random.permutation(key, S - 1)), the same for every
    row, leaving the last token where it is; run sessions.model.transformer.forward on
    both; return max |logits[:, -1] - shuffled logits[:, -1]| as a float.
    A one-layer model with cfg.positions False gives 0 (up to float32
    rounding); with positions it does not.
    Hint: tokens.at[:, :S - 1].set(tokens[:, perm]).
    """
    raise NotImplementedError

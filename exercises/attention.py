"""Attention by hand: one query first, then a whole packed batch.

Position s reads every position t <= s, weighted by how well its query
matches their keys (sessions/model/attention.py):

    scores[t] = q . k[t] / sqrt(D)          for t <= s (causal)
    out       = sum_t softmax(scores)[t] * v[t]

Packing several short documents into one row of S tokens wastes no padding;
segment_ids then keep a token from attending across the document boundary.
"""

import jax
import jax.numpy as jnp


def one_query(q_D, k_TD, v_TD, s):
    """The attention output of the query at position s, one head: [D].

    q_D: [D], the query of position s; k_TD, v_TD: [T, D], the keys and
    values of every position of the sequence (one head). Causal: only keys
    t <= s count. Steps: scores [T] = k_TD @ q_D / sqrt(D); set scores[t] to
    -inf where t > s; weights = exp(scores - max) / their sum; return
    weights @ v_TD.
    Hint: jnp.where(jnp.arange(T) <= s, scores, -jnp.inf); exp(-inf) is 0,
    so a masked key gets weight exactly 0.
    """
    raise NotImplementedError


def packed_attention(q, k, v, segment_ids):
    """Causal attention over packed sequences: [B, S, H, D].

    q, k, v: [B, S, H, D]; segment_ids: int [B, S], the document each token
    belongs to (e.g. [0, 0, 0, 1, 1, 2]). Query s sees key t when t <= s AND
    segment_ids[b, s] == segment_ids[b, t], so each document is attended to
    as if it were alone in its row.
    Hint: scores = jnp.einsum("BSHD,BTHD->BHST", q, k) / sqrt(D); the mask is
    a causal [S, T] matrix AND a same-segment [B, S, T] one, broadcast over
    H; softmax over T; then jnp.einsum("BHST,BTHD->BSHD", probs, v).
    """
    raise NotImplementedError

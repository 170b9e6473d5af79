"""Session 4: flash attention from first principles.

Softmax attention needs a row's maximum and its sum before it can weigh a
single value, so written plainly it holds a score for every (query, key)
pair: [S, T] per head, 16k x 16k floats = 1 GiB at S = 16k. Flash attention
never holds them. It walks the keys in blocks and keeps, per query row, a
running maximum m, a running sum l of exp(score - m) and a running weighted
sum of the values, acc (the paper's m, l and O; here row_max, row_sum, acc).
When a block raises the maximum, what was kept is rescaled by exp(m - m'):
the same sums, counted in the new units.

    m' = max(m, max_t s_t)      l' = l·exp(m - m') + Σ_t exp(s_t - m')
    acc' = acc·exp(m - m') + Σ_t exp(s_t - m')·v_t          out = acc / l

Causal attention adds a skip: query block i holds rows i·Bq ... (i+1)·Bq - 1,
which see no key past the last of them, so the key blocks after it are never
loaded. (sessions/kernels/flash.py is the Pallas kernel built on these three ideas.)
"""

import math

import jax.numpy as jnp


def flash_tile(q, k, v, row_max, row_sum, acc, mask=None):
    """One tile of the flash forward: the running (row_max, row_sum, acc) of a
    block of queries, updated by one block of keys. Returns the three updated.

    q [S, D] (a block of queries), k and v [T, D] (a block of keys), row_max
    and row_sum [S], acc [S, D], all float32. Scores s = q·kᵀ/√D, [S, T];
    where mask (bool [S, T]) is False the key is hidden: its score is -inf.
    The new max m' is the larger of row_max and the row's largest score; the
    old row_sum and acc shrink by exp(row_max - m'); row_sum then adds the
    row's sum of exp(s - m'), and acc adds exp(s - m')·v.
    Hint: a row that has seen no visible key yet keeps m' = -inf, and
    exp(-inf - (-inf)) is NaN: use 0 wherever m' is still -inf.
    """
    scores = jnp.einsum("SD,TD->ST", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf)
    new_max = jnp.maximum(row_max, jnp.max(scores, axis=-1))
    hidden = jnp.isneginf(new_max)  # nothing visible yet in this row
    shrink = jnp.where(hidden, 0.0, jnp.exp(row_max - new_max))
    weights = jnp.where(hidden[:, None], 0.0, jnp.exp(scores - new_max[:, None]))  # [S, T]
    new_sum = row_sum * shrink + jnp.sum(weights, axis=-1)
    new_acc = acc * shrink[:, None] + jnp.einsum("ST,TD->SD", weights, v)
    return new_max, new_sum, new_acc


def online_softmax_attention(q, k, v, block):
    """softmax(q·kᵀ/√D)·v over every key, one block of keys at a time:
    float32 [S, D].

    q [S, D], k and v [T, D] (one head, no mask), T a multiple of block.
    Start from row_max = -inf [S], row_sum = 0 [S], acc = 0 [S, D]; apply
    flash_tile to each block of `block` keys in turn; return acc / row_sum.
    The [S, T] scores are never built: at most [S, block] at a time.
    """
    S, D = q.shape
    row_max = jnp.full((S,), -jnp.inf, jnp.float32)
    row_sum = jnp.zeros((S,), jnp.float32)
    acc = jnp.zeros((S, D), jnp.float32)
    for start in range(0, k.shape[0], block):
        keys = slice(start, start + block)
        row_max, row_sum, acc = flash_tile(q, k[keys], v[keys], row_max, row_sum, acc)
    return acc / row_sum[:, None]


def causal_key_blocks(query_block, block_q, block_k):
    """How many key blocks query block `query_block` visits under a causal
    mask: an int.

    Its rows are query_block·block_q ... (query_block + 1)·block_q - 1, and a
    query sees the keys up to its own position, so the block needs keys
    0 ... (query_block + 1)·block_q - 1: that many keys, rounded up to whole
    blocks of block_k. Every later key block is skipped, never loaded.
    """
    return -(-(query_block + 1) * block_q // block_k)

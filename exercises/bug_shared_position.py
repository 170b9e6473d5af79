"""Find the bug: one position shared by every row.

broken_decode_step() is one decode step of single-head attention over a KV cache for
B rows (the engine's slots), the way session 3's decode step does it: every row writes
its key and value at one position, and attends to the keys up to there. Session 3's
rows all start together, so one position serves them all. A continuous batcher's do
not: a request admitted later sits at its own, earlier position. Here the step takes a
position a row and uses row 0's for every row.

Static batching hides it: all rows at one position, every output right. Under
continuous batching rows that arrived at another time than row 0 write their keys over
another token's (or past their own end) and attend to keys that are not theirs yet, or
no longer; nothing fails, the tokens are merely wrong, and only for some rows.

The tool: the same-tokens property. A request's output in a batch must be the one it
gets alone (a batch of one, the only row); compare each row so, under staggered
positions.
"""

import jax
import jax.numpy as jnp
import numpy as np


def broken_decode_step(cache_k, cache_v, q, k, v, positions):
    """q, k, v: [B, D], each row's new query, key and value; cache_k, cache_v: [B, T, D];
    positions: int [B], each row's position -> (out [B, D], cache_k, cache_v), the caches
    with each row's key and value written at its position."""
    pos = positions[0]  # every row at row 0's position
    cache_k = cache_k.at[:, pos].set(k)
    cache_v = cache_v.at[:, pos].set(v)
    scores = jnp.einsum("BD,BTD->BT", q, cache_k) / jnp.sqrt(q.shape[-1])
    visible = jnp.arange(cache_k.shape[1])[None, :] <= pos  # [1, T]
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    return jnp.einsum("BT,BTD->BD", probs, cache_v), cache_k, cache_v


def decode_step(cache_k, cache_v, q, k, v, positions):
    """broken_decode_step, fixed: each row writes at its own position and attends to its
    own keys 0..position. The same arguments and return.
    Hint: index the caches by (row, position) pairs, jnp.arange(B) beside positions; the
    mask compares each row's positions with its own, positions[:, None]."""
    raise NotImplementedError


def rows_that_differ(step, cache_k, cache_v, q, k, v, positions, atol=1e-5):
    """The rows (sorted, ints) whose output from step(...) over the whole batch differs,
    by more than atol anywhere, from the same row's run alone: a batch of one, its own
    cache row, query, key, value and position.
    Hint: slice each row keeping its batch axis (cache_k[b : b + 1]); np.abs, np.max."""
    raise NotImplementedError

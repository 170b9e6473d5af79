"""Session 3: the KV cache. Its bytes and the decode roofline on a napkin,
then one decode step of attention with a cache.

A decoder keeps every earlier token's key and value, per layer, so a new
token costs one position's work instead of the whole sequence's. One decode
step makes a token for each of B sequences; it reads every weight once (W
bytes, shared by the batch) and each sequence's cache (C bytes each), and
each sequence's token costs f FLOPs:

    bytes per step = W + B·C            seconds >= max(bytes / bandwidth, B·f / peak)

(sessions/inference/kv_cache.py is the decoder, roofline/decode_cost.py the roofline.)
"""

import jax
import jax.numpy as jnp


def cache_bytes(layers, batch, context, heads, head_dim, bytes_per_value):
    """Bytes of a KV cache: an int.

    A key and a value of [heads, head_dim] per layer, per sequence of the
    batch and per position of the context: 2·L·B·T·H·D·bytes_per_value.
    """
    return 2 * layers * batch * context * heads * head_dim * bytes_per_value


def decode_step_seconds(
    weight_bytes, cache_bytes_per_sequence, flops_per_sequence, batch, peak_flops, bandwidth
):
    """The roofline's lower bound on one decode step of `batch` sequences, seconds.

    The step must move W + B·C bytes and do B·f FLOPs; it takes at least the
    longer of bytes / bandwidth and FLOPs / peak.
    """
    memory = (weight_bytes + batch * cache_bytes_per_sequence) / bandwidth
    compute = batch * flops_per_sequence / peak_flops
    return max(memory, compute)


def compute_bound_batch(
    weight_bytes, cache_bytes_per_sequence, flops_per_sequence, peak_flops, bandwidth
):
    """The batch B* from which a decode step is compute-bound: a float, or None
    when no batch is.

    Solve B·f / peak = (W + B·C) / bandwidth for B. Each extra sequence adds
    f / peak seconds of compute and C / bandwidth of memory time; when the
    second is the larger, compute never catches up.
    Hint: B* = (W / bandwidth) / (f / peak - C / bandwidth).
    """
    margin = flops_per_sequence / peak_flops - cache_bytes_per_sequence / bandwidth
    if margin <= 0:
        return None
    return weight_bytes / bandwidth / margin


def decode_attention(q, k, v, k_cache, v_cache, pos):
    """One decode step of causal attention with a cache:
    (out [B, H, D], k_cache, v_cache).

    q, k, v: [B, H, D], the query, key and value of the new token, at
    position pos (an int, the same for every row); k_cache, v_cache:
    [B, T, H, D], positions 0..pos-1 filled, the rest unused. Write k and v
    into the caches at pos, then attend: the new query over positions
    0..pos (its own included), as sessions/model/attention.py does over a whole
    sequence. Return the output and both updated caches.
    Hint: k_cache.at[:, pos].set(k); scores = jnp.einsum("BHD,BTHD->BHT",
    q, k_cache) / sqrt(D), masked to -inf where t > pos; softmax over T;
    jnp.einsum("BHT,BTHD->BHD", probs, v_cache).
    """
    k_cache = k_cache.at[:, pos].set(k)
    v_cache = v_cache.at[:, pos].set(v)
    T, D = k_cache.shape[1], q.shape[-1]
    scores = jnp.einsum("BHD,BTHD->BHT", q, k_cache) / jnp.sqrt(D)
    scores = jnp.where(jnp.arange(T) <= pos, scores, -jnp.inf)  # the empty slots after pos
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("BHT,BTHD->BHD", probs, v_cache), k_cache, v_cache

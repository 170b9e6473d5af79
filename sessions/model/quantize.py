"""int8 weights and an int8 KV cache, each with absmax scales.

Decode waits on memory: every step reads every weight and each sequence's whole
cache (roofline/decode_cost.py). Stored in int8, both take 1 byte a number
instead of 2 (bf16) or 4 (float32), and a scale in float32 brings each back:

    a weight [*out, *in] (decode's layout)  one scale per output channel, over its inputs
    the embedding [V, E]                    one per row: its rows are the output
                                            channels of the tied output projection
    a key or value [D]                      one per token and KV head, over D

    scale = max |x| / 127 (1 where all are 0)    values = round(x / scale) in [-127, 127]

so |x - values · scale| <= scale / 2 for each number: half a step of the grid.
The product is computed in the compute dtype, with the scale applied to its
result, never to the weight: (values @ x^T) · scale. The values are integers
of at most 7 bits, exact in bfloat16's 8, so the only rounding added is the
weight's own. The cache's scales factor out of attention's contractions the
same way: the scale of position t multiplies q·k_t, and probs_t · scale_t
weighs v_t. No dequantized copy of either is made per step.

    w8 = quantize_decode_weights(decode_weights(params, cfg))
    cache = kv_cache.init_cache(cfg, batch, int8=True)
    kv_cache.generate(params, cfg, prompts, n, int8_weights=True, int8_cache=True)
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sessions.model.attention import cached_probs
from sessions.shard.sharding import constrain

LEVELS = 127  # symmetric: -127..127, so 0 is exact and -128 is never used


class Int8(NamedTuple):
    """A weight stored as int8 values with one float32 scale per output channel:
    w ≈ values · scale. A pytree, so it travels through jit like any weight."""

    values: jax.Array  # int8 [*out, *in]
    scale: jax.Array  # float32 [*out]


def _under(scale, ndim):
    """scale [*out] broadcast against an array of ndim dims [*out, *in]."""
    return scale.reshape(scale.shape + (1,) * (ndim - scale.ndim))


def quantize_weight(w, n_in):
    """w [*out, *in] (its last n_in dims are its inputs) -> Int8, per output
    channel: scale = max |w| over the inputs / 127 (1.0 where they are all 0),
    values = round(w / scale), clipped to ±127 (rounding may not cross it)."""
    w32 = w.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(w32), axis=tuple(range(w.ndim - n_in, w.ndim)))
    scale = jnp.where(absmax > 0, absmax / LEVELS, 1.0)
    values = jnp.clip(jnp.round(w32 / _under(scale, w.ndim)), -LEVELS, LEVELS)
    return Int8(values.astype(jnp.int8), scale)


def dequantize(q, dtype=jnp.float32):
    """Int8 -> values · scale [*out, *in] in dtype: a reference, never used per step."""
    return (q.values.astype(jnp.float32) * _under(q.scale, q.values.ndim)).astype(dtype)


def stored_bytes(weights):
    """Bytes a tree of weights stores, Int8 ones included: 1 a value, 4 a scale."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))


def lookup(table, tokens):
    """table[tokens]: rows of an embedding [V, E], dense or Int8 (then only the
    rows looked up are dequantized, in float32) -> [*tokens.shape, E]."""
    if not isinstance(table, Int8):
        return table[tokens]
    return table.values[tokens].astype(jnp.float32) * table.scale[tokens][..., None]


def tied_logits(x, table):
    """x [B, S, E] times the embedding [V, E], dense or Int8 -> [B, S, V] in x's
    dtype ("BSE,VE->BSV"); an Int8 table's row scales multiply the logits."""
    if not isinstance(table, Int8):
        return jnp.einsum("BSE,VE->BSV", x, table)
    logits = jnp.einsum("BSE,VE->BSV", x, table.values.astype(x.dtype))
    return (logits * table.scale).astype(x.dtype)


# The int8 KV cache: per layer "k" int8 [B, K, D, T], "v" int8 [B, K, T, D], and
# their scales "k_scale" and "v_scale" float32 [B, K, T]. No dim of 1 (as in
# [B, K, T, 1], which would broadcast against v): a TPU tiles the two minor dims
# of an array by (8, 128), so a dim of 1 there is padded to 8 or 128, and XLA's
# TPU compiler moved the padded scales in and out of its on-chip memory every
# step: 0.4 GB a step at the 1.2B shape, for 3 MB of scales.
KV_LETTERS = {"k": "BKDT", "v": "BKTD", "k_scale": "BKT", "v_scale": "BKT"}


def quantize_kv(x):
    """x [..., D] -> (values int8 [..., D], scale float32 [...]): one absmax
    scale per vector of D numbers (a token's key or value in one KV head)."""
    q = quantize_weight(x, 1)
    return q.values, q.scale


def init_int8_cache(cfg, batch):
    """An empty int8 cache, one dict per layer: values 0, scales 1 (what
    quantize_kv gives zeros), K = cfg.n_kv_heads heads, T = cfg.seq slots."""
    B, K, D, T = batch, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    shapes = {
        "k": (B, K, D, T),
        "v": (B, K, T, D),
        "k_scale": (B, K, T),
        "v_scale": (B, K, T),
    }

    def empty(name):
        full = jnp.zeros if name in ("k", "v") else jnp.ones
        dtype = jnp.int8 if name in ("k", "v") else jnp.float32
        return constrain(full(shapes[name], dtype), KV_LETTERS[name])

    return [
        {name: empty(name) for name in shapes} for _ in range(cfg.layers if cfg.attention else 0)
    ]


def write_int8(cache, k, v, pos, live=True):
    """kv_cache.write for an int8 cache: k, v [B, S, K, D] quantized per token
    and head and written at positions pos..pos+S-1, scales beside them; where
    `live` (a traced bool) is false, those slots keep what they held."""
    (k8, k_scale), (v8, v_scale) = quantize_kv(k), quantize_kv(v)  # [B, S, K, D], [B, S, K]
    new = {
        "k": k8.transpose(0, 2, 3, 1),  # [B, K, D, S]
        "v": v8.transpose(0, 2, 1, 3),  # [B, K, S, D]
        "k_scale": k_scale.transpose(0, 2, 1),  # [B, K, S]
        "v_scale": v_scale.transpose(0, 2, 1),
    }
    at = {"k": (0, 0, 0, pos), "v": (0, 0, pos, 0), "k_scale": (0, 0, pos), "v_scale": (0, 0, pos)}
    if live is not True:  # reads S slots: a few bytes, not the cache
        new = {
            name: jnp.where(live, x, jax.lax.dynamic_slice(cache[name], at[name], x.shape))
            for name, x in new.items()
        }
    return {
        name: constrain(jax.lax.dynamic_update_slice(cache[name], x, at[name]), KV_LETTERS[name])
        for name, x in new.items()
    }


def cached_attention_int8(q, k, v, cache, pos):
    """kv_cache.cached_attention over an int8 cache: q [B, S, H, D], k, v
    [B, S, K, D] (the new tokens, at pos..pos+S-1) -> [B, S, H, D].

    Each of the K KV heads serves G = H / K query heads, so q is read as
    [B, S, K, G, D]. The cache's values enter each dot in the compute dtype and
    their scales multiply what the dot gives: the scores of position t by
    k_scale[t] (after the D-contraction, which it factors out of), and the
    probabilities by v_scale[t] before the T-contraction. The new tokens' own
    keys and values are used as computed, as in the full-precision cache."""
    B, S, H, D = q.shape
    K, T = cache["k"].shape[1], cache["k"].shape[-1]
    qg = q.reshape(B, S, K, H // K, D)  # [B, S, K, G, D]
    f32 = jnp.float32
    old = jnp.einsum(
        "BSKGD,BKDT->BKGST", qg, cache["k"].astype(q.dtype), preferred_element_type=f32
    )
    old = old * cache["k_scale"][:, :, None, None]  # [B, K, 1, 1, T]: each position's scale
    new = jnp.einsum("BSKGD,BTKD->BKGST", qg, k, preferred_element_type=f32)
    probs = cached_probs(old * D**-0.5, new * D**-0.5, pos)  # [B, K, G, S, T + S]
    weighed = probs[..., :T] * cache["v_scale"][:, :, None, None]  # each position's v_scale
    out = jnp.einsum("BKGST,BKTD->BSKGD", weighed.astype(v.dtype), cache["v"].astype(v.dtype))
    out = out + jnp.einsum("BKGST,BTKD->BSKGD", probs[..., T:].astype(v.dtype), v)
    return out.reshape(B, S, H, D)

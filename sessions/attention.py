"""Causal multi-head attention, written out with einsums.

Session 1's model had none: each output depended on one token only. Attention
lets position s read every position t <= s, weighted by how well its query
matches their keys:

    scores[b, h, s, t] = q[b, s, h, :] . k[b, t, h, :] / sqrt(D)
    out[b, s, h, :]    = sum_t softmax_t(scores)[b, h, s, t] * v[b, t, h, :]

Shapes: q [B, S, H, D]; k, v [B, T, H, D] (T = S in self-attention).
"""

import jax
import jax.numpy as jnp


def attention_mask(S, T, segment_ids=None):
    """Which keys each query may see: bool [B or 1, 1, S, T].

    Causal: query s sees keys t <= s. With segment_ids ([B, S] ints; several
    documents packed in one row), a query also sees only keys of its own segment.
    """
    s = jnp.arange(S)[:, None]
    t = jnp.arange(T)[None, :]
    mask = (t <= s)[None, None, :, :]  # [1, 1, S, T]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, S, T]
        mask = mask & same[:, None, :, :]
    return mask


def einsum_attention(q, k, v, segment_ids=None):
    """Attention by hand; the reference every other implementation is checked against."""
    D = q.shape[-1]
    # Scores and softmax in float32 even when q, k are bfloat16: exp() of a
    # bf16 logit loses the small differences that decide where attention goes.
    scores = jnp.einsum("BSHD,BTHD->BHST", q, k, preferred_element_type=jnp.float32)
    scores = scores * D**-0.5
    mask = attention_mask(q.shape[1], k.shape[1], segment_ids)
    # A large negative number, not -inf: a fully masked row would give NaN.
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("BHST,BTHD->BSHD", probs, v)


def fused_attention(q, k, v, segment_ids=None):
    """The library call. On an NVIDIA GPU in bf16/fp16 it asks for cuDNN's
    fused (flash) kernel, which never writes the [B, H, S, T] score matrix to
    memory; it must be asked for by name, since JAX's default implementation
    (None) still means XLA's. Where cuDNN cannot run the shapes, and on other
    backends, XLA lowers the call to the same einsums as above."""
    mask = None if segment_ids is None else attention_mask(q.shape[1], k.shape[1], segment_ids)
    causal = segment_ids is None  # the mask, when given, already is causal

    def call(implementation):
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=causal, implementation=implementation
        )

    if jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16):
        try:
            return call("cudnn")
        except (ValueError, NotImplementedError, RuntimeError):
            pass  # e.g. no cuDNN, or a head dim it does not support: XLA's below
    return call(None)


IMPLEMENTATIONS = {"einsum": einsum_attention, "fused": fused_attention}


def attention(q, k, v, segment_ids=None, impl="einsum"):
    """Causal attention. q: [B, S, H, D], k, v: [B, T, H, D] -> [B, S, H, D]."""
    return IMPLEMENTATIONS[impl](q, k, v, segment_ids)

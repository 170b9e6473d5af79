"""Find the bug: attention FLOPs counted like a matmul with weights.

broken_attention_flops() counts q·k and probs·v as if each were a matmul of
every token against a fixed [D] vector per head. But a query is multiplied
by every key: the score matrix is [S, T] per head, so the count grows with
S·T, not S. At S = T = 2048 it is off by a factor of 2048, and an MFU
computed with it is wrong by attention's whole share.

The tool: XLA's own count of the compiled function,
jax.jit(fn).lower(*args).compile().cost_analysis()["flops"].
"""

import jax


def broken_attention_flops(B, S, T, H, D):
    """Forward FLOPs of attention for q [B, S, H, D] and k, v [B, T, H, D]."""
    return 2 * (2 * B * S * H * D)  # two matmuls, 2 FLOPs per multiply-add


def xla_flops(fn, *args):
    """The FLOPs XLA counts for jax.jit(fn)(*args): a float.

    Hint: jax.jit(fn).lower(*args).compile().cost_analysis() is a dict with
    a "flops" entry (in older JAX versions, a list holding one such dict).
    """
    raise NotImplementedError


def attention_flops(B, S, T, H, D):
    """Forward FLOPs of attention's two matmuls: q·k^T and probs·v.

    q: [B, S, H, D]; k, v: [B, T, H, D]. scores = einsum("BSHD,BTHD->BHST")
    does a D-long dot product for every (b, h, s, t); probs·v the same
    number of multiply-adds again. Count the whole score matrix (the causal
    mask is applied after it is computed). The softmax's few FLOPs per score
    are left out.
    """
    raise NotImplementedError

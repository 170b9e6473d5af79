"""Inference rooflines: how many chips a model needs, three ways.

Prefill (reading the prompt) is one big forward pass, compute-bound:
2 FLOPs per parameter per token. Holding the model needs its weights (and
the KV cache) in HBM. Generating is one token per sequence per step, and at
small batch each step reads every weight once: memory-bound, so the
token rate is set by bandwidth, not FLOP/s.
"""

import math


def chips_for_prefill(params, prompt_tokens, deadline_s, peak_flops, mfu=0.5):
    """Chips needed to read a prompt of prompt_tokens within deadline_s: an int.

    FLOPs = 2 * params * prompt_tokens (a forward pass; attention left
    out); each chip does peak_flops * mfu per second.
    Hint: math.ceil.
    """
    raise NotImplementedError


def kv_cache_bytes(layers, kv_heads, head_dim, seq, batch, bytes_per_value=2):
    """Bytes of the KV cache: a key and a value of [kv_heads, head_dim] per
    token, per layer, for batch sequences of seq tokens:
    2 * layers * kv_heads * head_dim * seq * batch * bytes_per_value.
    """
    raise NotImplementedError


def chips_to_hold(params, bytes_per_param, hbm_bytes, kv_bytes=0):
    """Chips whose memory (hbm_bytes each) holds the weights and the KV cache: an int."""
    raise NotImplementedError


def chips_for_generation(params, bytes_per_param, tokens_per_s, hbm_bandwidth):
    """Chips needed to generate tokens_per_s tokens per second per sequence: an int.

    Each step makes one token per sequence and reads every weight once
    (memory-bound at small batch; the KV cache is left out). With the
    weights split over n chips a step takes params * bytes_per_param /
    (n * hbm_bandwidth) seconds, and it must take at most 1 / tokens_per_s.
    """
    raise NotImplementedError

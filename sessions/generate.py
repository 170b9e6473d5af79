"""Sampling a continuation, one byte at a time.

No KV cache: each new byte reruns the model over a fixed [1, S] window. The
window's shape never changes, so the forward pass compiles once; the cost is
S times the work of a cached decoder, which is nothing at this size.
"""

import functools

import jax
import numpy as np

from sessions.config import UsageError
from sessions.data import decode, encode
from sessions.model import forward


@functools.partial(jax.jit, static_argnames="cfg")
def _next_token(params, window, length, key, temperature, cfg):
    """window: int [1, S], the first `length` slots filled; -> the next token."""
    logits = forward(params, window, cfg)[0, length - 1]  # [V]
    return jax.random.categorical(key, logits / temperature)


def generate(params, cfg, prompt, n_new, key, temperature=0.8):
    """prompt: str -> the prompt followed by n_new sampled bytes, as str."""
    tokens = list(encode(prompt))
    if not tokens:
        raise UsageError("the prompt is empty")
    if len(tokens) > cfg.seq:
        raise UsageError(f"the prompt is {len(tokens)} bytes, longer than the context of {cfg.seq}")
    # One device, one copy of the weights: generation is tiny next to training.
    params = jax.device_put(params, jax.local_devices()[0])
    for i in range(n_new):
        context = tokens[-cfg.seq :]
        window = np.zeros((1, cfg.seq), np.int32)
        window[0, : len(context)] = context
        token = _next_token(
            params, window, len(context), jax.random.fold_in(key, i), temperature, cfg
        )
        tokens.append(int(token))
    return decode(tokens)

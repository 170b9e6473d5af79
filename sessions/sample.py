"""Sampling a continuation of a text, with the cached decoder of sessions/inference.py.

The model sees at most cfg.seq bytes. A continuation longer than that slides
its window: when the context is full, its last half is prefilled again and
decoding goes on from there, so every byte still sees at least half a
context, at positions the model was trained on. Each prefill, first or slid,
runs the model's attention kernel only where it takes that length
(attention.choose_for_length, in inference.generate).
"""

import jax
import numpy as np

from sessions import inference
from sessions.data import text_to_tokens, tokens_to_text
from sessions.errors import UsageError


def sample_text(params, cfg, prompt, n_new, key, temperature=0.8):
    """prompt: str -> the prompt followed by n_new sampled bytes, as str
    (temperature 0: greedy)."""
    tokens = text_to_tokens(prompt)  # int32 [P]
    if not len(tokens):
        raise UsageError("the prompt is empty")
    if len(tokens) > cfg.seq:
        raise UsageError(f"the prompt is {len(tokens)} bytes, longer than the context of {cfg.seq}")
    # One device, one copy of the weights: generation is tiny next to training.
    params = jax.device_put(params, jax.local_devices()[0])
    context, left = tokens, n_new
    while left:
        if len(context) == cfg.seq:
            context = context[-(cfg.seq // 2) :]  # slide: keep the last half
        n = min(left, cfg.seq - len(context))
        chunk_key = jax.random.fold_in(key, len(tokens))  # a fresh stream per window
        out = inference.generate(
            params, cfg, context[None], n, key=chunk_key, temperature=temperature
        )
        context = np.asarray(out[0])
        tokens = np.concatenate([tokens, context[-n:]])
        left -= n
    return tokens_to_text(tokens)

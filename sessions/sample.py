"""Sampling a continuation of a prompt, with the cached decoder of sessions/inference.py.

The model sees at most cfg.seq tokens. A continuation longer than that slides
its window: when the context is full, its last half is prefilled again and
decoding goes on from there, so every token still sees at least half a
context, at positions the model was trained on. Each prefill, first or slid,
runs the model's attention kernel only where it takes that length
(attention.choose_for_length, in inference.generate).

A model of bytes reads and writes text. A model trained on token files reads
and writes a tokenizer's ids, which no tokenizer here turns into text: its
prompts and samples are lists of ids ("464 1330 2643").
"""

import jax
import numpy as np

from sessions import inference
from sessions.data import text_to_tokens, tokens_to_text
from sessions.errors import UsageError


def sample_tokens(params, cfg, tokens, n_new, key, temperature=0.8):
    """int32 [P] -> the prompt followed by n_new sampled tokens (temperature 0: greedy)."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if not len(tokens):
        raise UsageError("the prompt is empty")
    if len(tokens) > cfg.seq:
        too_long = f"{len(tokens)} tokens, longer than the context of {cfg.seq}"
        raise UsageError(f"the prompt is {too_long}")
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
    return tokens


def sample_text(params, cfg, prompt, n_new, key, temperature=0.8):
    """prompt: str -> the prompt followed by n_new sampled bytes, as str."""
    tokens = sample_tokens(params, cfg, text_to_tokens(prompt), n_new, key, temperature)
    return tokens_to_text(tokens)


def prompt_tokens(prompt, unit="byte"):
    """The prompt as int32 token ids: its bytes, or for a model of a tokenizer's
    ids (unit "token"), the ids it lists."""
    if unit == "byte":
        return text_to_tokens(prompt)
    try:
        return np.array([int(t) for t in prompt.replace(",", " ").split()], dtype=np.int32)
    except ValueError:
        raise UsageError(
            f"--prompt '{prompt}': this model reads a tokenizer's ids, not text; give them as "
            "numbers, e.g. --prompt '464 1330 2643'"
        ) from None


def show(tokens, unit="byte"):
    """A sample as a person reads it: text, or the ids with a word on why."""
    if unit == "byte":
        return tokens_to_text(tokens)
    return "token ids (no tokenizer here turns them into text): " + " ".join(map(str, tokens))

"""Sampling a continuation of a prompt, with the cached decoder of sessions/inference/kv_cache.py.

The model sees at most cfg.seq tokens. A continuation longer than that slides
its window: when the context is full, its last half is prefilled again and
decoding goes on from there, so every token still sees at least half a
context, at positions the model was trained on. Each prefill, first or slid,
runs the model's attention kernel only where it takes that length
(attention_choice.choose_for_length, in generate).

A model of bytes reads and writes text. A model trained on token files reads
and writes a tokenizer's ids. None is downloaded: its prompts and samples are
lists of ids ("464 1330 2643"), unless a tokenizer is given with --tokenizer
FILE, a Hugging Face `tokenizer.json` (GPT-2's, say), read by the `tokenizers`
library where it is installed.
"""

import jax
import numpy as np

from sessions.errors import UsageError
from sessions.inference.kv_cache import generate
from sessions.train.data import text_to_tokens, tokens_to_text


def check_prompt(tokens, cfg):
    """A prompt the model can read: not empty, within its context, and every
    token inside its vocabulary (an embedding lookup past the table fails silently)."""
    if not len(tokens):
        raise UsageError("the prompt is empty")
    if len(tokens) > cfg.seq:
        too_long = f"{len(tokens)} tokens, longer than the context of {cfg.seq}"
        raise UsageError(f"the prompt is {too_long}")
    if max(tokens) >= cfg.vocab:
        raise UsageError(
            f"the prompt holds token {max(tokens)}, past the vocabulary of {cfg.vocab}"
        )


def sample_tokens(params, cfg, tokens, n_new, key, temperature=0.8, decode_impl="xla"):
    """int32 [P] -> the prompt followed by n_new sampled tokens (temperature 0: greedy),
    decoded by XLA's step or, with decode_impl "pallas", by our kernels (kv_cache.generate)."""
    tokens = np.asarray(tokens, dtype=np.int32)
    check_prompt(tokens, cfg)
    # One device, one copy of the weights: generation is tiny next to training.
    params = jax.device_put(params, jax.local_devices()[0])
    context, left = tokens, n_new
    while left:
        if len(context) == cfg.seq:
            context = context[-(cfg.seq // 2) :]  # slide: keep the last half
        n = min(left, cfg.seq - len(context))
        chunk_key = jax.random.fold_in(key, len(tokens))  # a fresh stream per window
        out = generate(
            params,
            cfg,
            context[None],
            n,
            key=chunk_key,
            temperature=temperature,
            decode_impl=decode_impl,
        )
        context = np.asarray(out[0])
        tokens = np.concatenate([tokens, context[-n:]])
        left -= n
    return tokens


def sample_text(params, cfg, prompt, n_new, key, temperature=0.8):
    """prompt: str -> the prompt followed by n_new sampled bytes, as str."""
    tokens = sample_tokens(params, cfg, text_to_tokens(prompt), n_new, key, temperature)
    return tokens_to_text(tokens)


def load_tokenizer(path, unit):
    """The tokenizer in a Hugging Face tokenizer.json file, for a model of token
    files' ids (unit "token"); None for no path."""
    if path is None:
        return None
    if unit != "token":
        raise UsageError(f"--tokenizer {path}: this model's tokens are bytes; it reads token files")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(f"--tokenizer {path}: needs `pip install tokenizers`") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises its own errors for a bad file
        raise UsageError(f"--tokenizer {path}: {' '.join(str(e).split())}") from None


def prompt_tokens(prompt, unit="byte", tokenizer=None):
    """The prompt as int32 token ids: its bytes, or for a model of a tokenizer's
    ids (unit "token"), the tokenizer's ids for it or, with none, the ids it lists."""
    if unit == "byte":
        return text_to_tokens(prompt)
    if tokenizer is not None:
        return np.array(tokenizer.encode(prompt).ids, dtype=np.int32)
    try:
        return np.array([int(t) for t in prompt.replace(",", " ").split()], dtype=np.int32)
    except ValueError:
        raise UsageError(
            f"--prompt '{prompt}': this model reads a tokenizer's ids, not text; give them as "
            "numbers, e.g. --prompt '464 1330 2643'"
        ) from None


def closing_prompt(given, default_text, corpus, seq, tokenizer=None):
    """The prompt of a training run's closing sample: the given one (it must fit);
    else the default text cut to half the context or, for token files without a
    tokenizer, the validation split's first ids."""
    if given:
        return prompt_tokens(given, corpus.unit, tokenizer)
    if corpus.unit == "token" and tokenizer is None:
        return np.asarray(corpus.val[: min(16, seq // 2)])
    return prompt_tokens(default_text, corpus.unit, tokenizer)[: seq // 2]


def show(tokens, unit="byte", tokenizer=None):
    """A sample as a person reads it: text, or the ids with a word on why."""
    if unit == "byte":
        return tokens_to_text(tokens)
    if tokenizer is not None:
        return tokenizer.decode([int(t) for t in tokens])
    ids = " ".join(map(str, tokens))
    return f"token ids (pass --tokenizer FILE to read them as text): {ids}"

"""What a cheaper decode costs in quality: loss through the decode path, greedy agreement.

int8 weights and an int8 cache (sessions/model/quantize.py) halve decode's bytes in
bf16; what they give up is measured on the path that serves, not on a copy of
the model: the validation loss of decode_step itself, teacher-forced (each
position's token fed in, its logits scored, the cache filled one token at a
time, as generation fills it), and the fraction of a greedy continuation's
tokens that the cheaper path picks as the full one does. A continuation that
departs once goes on from other text, so agreement falls faster than the loss
grows: the loss says how much the predictions moved, agreement how soon a
reader would see it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sessions.inference.kv_cache import decode_step, generate, init_cache
from sessions.inference.layout import decode_weights, quantize_decode_weights
from sessions.model.transformer import cross_entropy
from sessions.train import data


@functools.partial(jax.jit, static_argnames=("cfg", "int8_cache"))
def teacher_forced_logits(weights, tokens, cfg, int8_cache=False):
    """weights: decode_weights (Int8 ones too); tokens: int [B, S] -> logits
    float32 [B, S, V], position s's prediction of token s + 1, each computed by
    decode_step from a cache holding positions 0..s-1 (int8 if int8_cache)."""
    B, S = tokens.shape

    def step(cache, pos):
        logits, cache = decode_step(weights, cache, tokens[:, pos], pos, cfg)
        return cache, logits

    _, logits = jax.lax.scan(step, init_cache(cfg, B, int8_cache), jnp.arange(S))
    return jnp.swapaxes(logits, 0, 1)  # [S, B, V] -> [B, S, V]


def validation_batches(val_tokens, cfg, tc):
    """The validation batches session 2 evaluates on (step.make_evaluator's):
    tc.eval_batches of {"inputs", "targets"} int [tc.batch, cfg.seq]."""
    return [
        data.get_batch(val_tokens, i, batch=tc.batch, seq=cfg.seq, seed=tc.seed, stream=data.VAL)
        for i in range(tc.eval_batches)
    ]


def val_loss(params, cfg, batches, *, int8_weights=False, int8_cache=False):
    """Mean cross-entropy (nats a token) of the decode path over `batches`, with
    int8 weights and/or an int8 cache. Full precision, it is the model's own
    validation loss, the same numbers summed another way."""
    w = decode_weights(params, cfg)
    w = quantize_decode_weights(w) if int8_weights else w
    losses = [
        cross_entropy(teacher_forced_logits(w, b["inputs"], cfg, int8_cache), b["targets"])
        for b in batches
    ]
    return float(np.mean(losses))


def greedy_agreement(params, cfg, prompts, n_new, *, int8_weights=False, int8_cache=False):
    """The fraction of n_new greedy tokens after each of `prompts` (int [B, P])
    that the int8 path picks as the full one does, position by position."""
    full = generate(params, cfg, prompts, n_new)
    cheap = generate(params, cfg, prompts, n_new, int8_weights=int8_weights, int8_cache=int8_cache)
    P = prompts.shape[1]
    return float(jnp.mean(full[:, P:] == cheap[:, P:]))

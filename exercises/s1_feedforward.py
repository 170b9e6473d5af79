"""Session 1: a model without attention sees one token at a time.

Session 1's block is an MLP applied to each position alone, so the logits at
position s are a function of token s only: the model is a bigram model
however wide or deep it is. Two ways to see it: change one input token and
watch which outputs move, and compute the best loss any bigram model can
reach, the entropy of the next byte given the current one.
"""

import jax
import jax.numpy as jnp
import numpy as np

from sessions.model import forward


def influence(params, tokens, cfg):
    """Which outputs move when one input token changes: bool [S, S].

    moved[s, t] is True when changing token t (in every row of the batch)
    changes the logits at position s. For session 1's model (cfg.attention
    False) it is the identity; with causal attention it is lower triangular.

    params: sessions.model.transformer.init_params(cfg, key); tokens: int [B, S].
    Hint: set column t to (token + 1) % cfg.vocab, run sessions.model.transformer.forward
    again and compare the logits [B, S, V] position by position (a change
    above 1e-4 counts); jax.jit(jax.vmap(...)) over t runs all S changed
    batches in one compiled call.
    """
    raise NotImplementedError


def bigram_entropy(tokens):
    """The best loss of any model that sees one byte: H(next | current), in nats.

    tokens: 1-D uint8 or int array (the corpus). Count the pairs
    (tokens[i], tokens[i + 1]) into a [256, 256] table; with p(a, b) the pair
    frequencies and p(a) the row sums,
        H = -sum over a, b of p(a, b) * log(p(a, b) / p(a)).
    Session 1's model cannot go below this on the data it was counted on;
    compare it with sessions.train.data.unigram_entropy (a model that sees nothing).
    Hint: np.bincount of tokens[:-1] * 256 + tokens[1:], with minlength 65536.
    """
    raise NotImplementedError

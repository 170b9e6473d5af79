"""Session 1: a feed-forward-only model sees one token; its loss floor is the bigram entropy."""

import dataclasses
import itertools

import jax
import numpy as np
import pytest
from adapters import exercise

from sessions.model import init_params
from sessions.train import data

from .expect import expect

influence = exercise("s1_feedforward.influence")
bigram_entropy = exercise("s1_feedforward.bigram_entropy")


def tokens_BS(cfg, B=2, S=6):
    return jax.random.randint(jax.random.key(1), (B, S), 0, cfg.vocab)


@pytest.mark.exercise("s1_feedforward.influence")
def test_feedforward_output_depends_on_its_own_token_only(cfg, key):
    s1 = dataclasses.replace(cfg, attention=False, positions=False)
    moved = np.asarray(influence(init_params(s1, key), tokens_BS(s1), s1))
    assert moved.shape == (6, 6), f"expected [S, S] = (6, 6), got {moved.shape}"
    np.testing.assert_array_equal(moved, np.eye(6, dtype=bool), err_msg="expected the identity")


@pytest.mark.exercise("s1_feedforward.influence")
def test_with_attention_outputs_depend_on_every_earlier_token(cfg, key):
    """The same probe on session 2's model: causal, so lower triangular and full below."""
    moved = np.asarray(influence(init_params(cfg, key), tokens_BS(cfg), cfg))
    np.testing.assert_array_equal(
        moved, np.tril(np.ones((6, 6), dtype=bool)), err_msg="expected lower triangular"
    )


@pytest.mark.exercise("s1_feedforward.bigram_entropy")
def test_bigram_entropy_by_hand():
    """Against a dictionary count on a short sequence, and two known cases."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=400).astype(np.uint8)
    pairs, firsts = {}, {}
    for a, b in itertools.pairwise(tokens):
        pairs[a, b] = pairs.get((a, b), 0) + 1
        firsts[a] = firsts.get(a, 0) + 1
    n = len(tokens) - 1
    expected = -sum(c / n * np.log(c / firsts[a]) for (a, _), c in pairs.items())
    nats = "nats/byte"
    expect(bigram_entropy(tokens), pytest.approx(expected, rel=1e-9), nats, "400 bytes of 0..4")
    cycle = np.tile(np.arange(7, dtype=np.uint8), 50)
    expect(bigram_entropy(cycle), pytest.approx(0, abs=1e-12), nats, "0..6 repeated: no surprise")
    uniform = rng.integers(0, 256, size=2**20).astype(np.uint8)
    expect(bigram_entropy(uniform), pytest.approx(np.log(256), abs=0.05), nats, "uniform: log 256")


@pytest.mark.exercise("s1_feedforward.bigram_entropy")
def test_bigram_entropy_of_the_corpus_is_below_unigram(record_property):
    corpus = data.load_corpus()
    bigram, unigram = bigram_entropy(corpus), data.unigram_entropy(corpus)
    record_property("measured", f"corpus: bigram {bigram:.2f} vs unigram {unigram:.2f} nats/byte")
    expect(
        bigram,
        above=0,
        below=unigram,
        unit="nats/byte",
        what="the corpus; below: its unigram entropy",
    )

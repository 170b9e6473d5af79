"""Find the bug: a model that never beats the unigram baseline.

broken_train() trains session 1's model for a few dozen steps. Session 1's
model sees the previous byte, so it should soon beat the unigram entropy
(the loss of a model that ignores its input) and head for the bigram
entropy. It does not: its loss settles on the unigram entropy and stays.

The tool: look at what the model is fed. print(batch["inputs"][0]) next to
batch["targets"][0] shows it at once.
"""

import jax
import numpy as np

from sessions.model.config import ModelConfig, TrainConfig
from sessions.train import data
from sessions.train.step import init_state, make_optimizer, make_train_step


def broken_train(steps=40, seed=0):
    """Train session 1's model for `steps` steps; returns (losses, unigram entropy)."""
    cfg = ModelConfig(
        embed=32, ff=64, heads=1, head_dim=8, layers=1, seq=32, attention=False, positions=False
    )
    tc = TrainConfig(steps=steps, batch=16, lr=2e-2, warmup=3)
    tokens, _ = data.split(data.load_corpus(), cfg.seq)
    optimizer = make_optimizer(tc, steps)
    state = init_state(jax.random.key(seed), cfg=cfg, optimizer=optimizer)
    step_fn = make_train_step(cfg, optimizer)
    losses = []
    for step in range(steps):
        targets = data.get_batch(tokens, step, batch=tc.batch, seq=cfg.seq, seed=seed)["targets"]
        inputs = np.zeros_like(targets)
        inputs[:, 1:] = inputs[:, :-1]  # position s is fed the token before it
        state, metrics = step_fn(state, {"inputs": inputs, "targets": targets})
        losses.append(metrics["loss"])
    return [float(x) for x in jax.device_get(losses)], data.unigram_entropy(tokens)


def inputs_from_targets(targets):
    """The inputs that go with targets: int [B, S] -> int [B, S].

    Position s must be fed the token before the one it predicts:
    inputs[:, s] = targets[:, s - 1], and position 0, which has no token
    before it in the window, gets 0. Fix the line in broken_train that
    builds them (the tests train with yours and expect the loss to fall
    below the unigram entropy).
    Hint: which array does the broken line copy from?
    """
    raise NotImplementedError

"""The loss over chunks of each sequence (sessions/train/chunked_loss.py, s2_train.py
--loss-chunks N): the same loss and gradients as the whole logits at once, the batch
still split over data-parallel devices, and XLA's memory plan smaller by the logits
and their gradient that no longer live whole."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import s2_in_process

from sessions.model.config import PRESETS, ModelConfig
from sessions.model.transformer import cross_entropy, forward, init_params
from sessions.plan import programs
from sessions.plan.memory_levers import compile_here
from sessions.shard import sharding
from sessions.train.step import loss_fn

# Sizes that differ pairwise, a vocabulary of no power of two, S = 8 for chunks of 1-8.
SMALL = ModelConfig(vocab=300, embed=24, ff=40, heads=3, head_dim=8, layers=1, seq=8)


def batch_of(cfg, rows, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (rows, cfg.seq + 1), 0, cfg.vocab)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


def whole_logits_loss(params, batch, cfg):
    """The reference: the whole logits [B, S, V], then the mean cross-entropy."""
    return cross_entropy(forward(params, batch["inputs"], cfg), batch["targets"])


@pytest.mark.parametrize("tied, chunks", [(True, 4), (False, 8)], ids=["tied", "untied"])
def test_chunks_give_the_loss_and_gradients_of_the_whole_logits(tied, chunks):
    cfg = dataclasses.replace(SMALL, tied=tied)
    params = init_params(cfg, jax.random.key(1))
    batch = batch_of(cfg, rows=2)
    want, want_grads = jax.jit(jax.value_and_grad(whole_logits_loss), static_argnums=2)(
        params, batch, cfg
    )
    chunked = dataclasses.replace(cfg, loss_chunks=chunks)
    got, grads = jax.jit(jax.value_and_grad(loss_fn), static_argnums=2)(params, batch, chunked)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert ("unembed" in grads) == (not tied)  # the untied projection gets its own gradient
    leaves = jax.tree_util.tree_leaves_with_path(grads)
    for (path, g), w in zip(leaves, jax.tree.leaves(want_grads), strict=True):
        scale = float(jnp.max(jnp.abs(w)))  # a gradient's small entries: to its own scale
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=str(path))


def test_a_chunked_step_keeps_each_devices_own_rows():
    """Under 8 data-parallel devices, each holding one row, the chunked loss and its
    gradient need no collective but the gradients' all-reduce (and the loss's): no
    chunk is moved between devices. The loss is the one device's."""
    cfg = dataclasses.replace(SMALL, loss_chunks=4)
    params = init_params(cfg, jax.random.key(2))
    batch = batch_of(cfg, rows=8, seed=3)
    mesh = sharding.make_mesh({"data": 8, "fsdp": 1, "tp": 1})
    rows = sharding.batch_sharding(mesh)
    step = jax.jit(jax.value_and_grad(loss_fn), static_argnums=2)
    with jax.set_mesh(mesh):
        placed = jax.device_put(batch, rows)
        compiled = step.lower(params, placed, cfg).compile()
        loss, _ = compiled(params, placed)
    hlo = compiled.as_text()
    moved = [op for op in ("all-gather", "all-to-all", "collective-permute") if op in hlo]
    assert not moved, f"rows moved between devices: {moved}"
    assert "all-reduce" in hlo  # the gradients, summed over the devices' rows
    np.testing.assert_allclose(loss, whole_logits_loss(params, batch, cfg), rtol=1e-4)


def test_chunks_that_do_not_divide_the_sequence_are_one_line(capsys):
    code, err = s2_in_process(["--preset", "tiny", "--loss-chunks", "3", "--steps", "1"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "--loss-chunks 3" in err and "64" in err


# GPT-2's padded vocabulary at the cpu preset's width, one layer, a short sequence:
# 8 x 64 = 512 tokens, whose float32 logits are 512 x 50,304 x 4 B = 103 MB by hand,
# against 1.5 MB for x [B, S, E] and 26 MB for the embedding table.
WIDE_VOCAB = {"vocab": 50_304, "seq": 64, "layers": 1}
TOKENS = 8 * 64


@pytest.fixture(scope="module")
def plans():
    """XLA's memory plan (compiled.memory_analysis()) of the train step on one device
    of this CPU, for each number of chunks."""
    base = PRESETS["cpu"]
    tc = dataclasses.replace(base.train, batch=TOKENS // WIDE_VOCAB["seq"])
    found = {}
    for chunks in (1, 16):
        cfg = dataclasses.replace(base.model, **WIDE_VOCAB, loss_chunks=chunks)
        compiled, _ = compile_here(cfg, tc, programs.one_device_mesh())
        found[chunks] = compiled.memory_analysis()
    return found


def test_the_plan_sheds_the_logits_and_their_gradient(plans):
    """The napkin: the float32 logits [tokens, V] and their gradient, tokens x V x 4 B
    each, live whole at N = 1 and one chunk of each at N: the temporaries fall by at
    least 2 x tokens x V x 4 B x (1 - 1/N): 193 MB at N = 16 (XLA's CPU plan sheds 238).
    (At N = 4 it sheds 154.54 MB against the napkin's 154.53: too close to hold a test
    to.) The state (arguments) does not change."""
    chunks, logits = 16, TOKENS * WIDE_VOCAB["vocab"] * 4
    fell = plans[1].temp_size_in_bytes - plans[chunks].temp_size_in_bytes
    assert fell >= 2 * logits * (1 - 1 / chunks)
    assert plans[chunks].argument_size_in_bytes == plans[1].argument_size_in_bytes

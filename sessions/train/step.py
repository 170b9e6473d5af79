"""The training step: loss, gradient and optimizer update in one function,
compiled whole by `jax.jit`.

Jitting only the forward pass leaves the backward pass and the optimizer
running op by op, each op a round trip through memory and the Python
dispatcher. Jitting the whole step lets XLA fuse the elementwise work (Adam's
moment updates are a dozen elementwise ops per weight) into few kernels, and
donating the old state lets it update the weights in place.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sessions.model.transformer import head_weights, hidden, init_params
from sessions.shard import sharding
from sessions.train import data
from sessions.train.chunked_loss import chunked_cross_entropy
from sessions.train.master_weights import in_float32
from sessions.train.offload import optimizer_on_host, to_device, to_host


def loss_fn(params, batch, cfg):
    """Mean cross-entropy of the batch, over cfg.loss_chunks chunks of each sequence
    (sessions/train/chunked_loss.py; 1: the whole logits [B, S, V] at once)."""
    x = hidden(params, batch["inputs"], cfg)
    return chunked_cross_entropy(head_weights(params, cfg), x, batch["targets"], cfg.loss_chunks)


def make_optimizer(tc, total_steps):
    """AdamW with linear warm-up and cosine decay; weight decay on matrices only
    (decaying norm scales towards zero would fight the normalisation). For bfloat16
    weights (tc.weights), it runs in float32, on a master copy with tc.master."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=tc.lr,
        warmup_steps=min(tc.warmup, max(total_steps - 1, 1)),
        decay_steps=max(total_steps, 2),
        end_value=tc.lr / 10,
    )
    adamw = optax.chain(
        optax.clip_by_global_norm(tc.clip),
        optax.adamw(
            schedule,
            b1=0.9,
            b2=0.95,
            weight_decay=tc.weight_decay,
            mask=lambda params: jax.tree.map(lambda w: w.ndim >= 2, params),
        ),
    )
    return adamw if tc.weights == "float32" else in_float32(adamw, master=tc.master)


def init_state(key, *, cfg, optimizer, weights="float32"):
    """The whole training state, one pytree: {"params": ..., "opt": ...}, the params
    stored in `weights`' dtype (TrainConfig.weights): drawn in float32, then rounded,
    after the optimizer's master copy (if it keeps one) took the draw as it is."""
    params = init_params(cfg, key)
    opt = optimizer.init(params)
    return {"params": jax.tree.map(lambda w: w.astype(weights), params), "opt": opt}


def compile_ahead(step_fn, state, batch, log=print):
    """step_fn compiled for these shapes before the loop: no step is timed
    with compilation in it, and the loop can never trigger a recompile."""
    start = time.perf_counter()
    compiled = step_fn.lower(state, batch).compile()
    log(f"compiled the train step in {time.perf_counter() - start:.1f} s")
    return compiled


def accumulate(params, batch, cfg, accum):
    """(mean loss, mean gradient) of the batch as `accum` microbatches of B/accum rows,
    run one after another under lax.scan: one microbatch's activations alive at a time.
    Row r of microbatch i is row r·accum + i, so each device keeps its own rows. The
    gradients sum in float32, whatever the weights' dtype, then divide once."""
    micro = jax.tree.map(lambda x: jnp.moveaxis(x.reshape(-1, accum, *x.shape[1:]), 1, 0), batch)

    def add(totals, microbatch):
        loss, grads = jax.value_and_grad(loss_fn)(params, microbatch, cfg)
        return jax.tree.map(lambda t, x: t + x.astype(t.dtype), totals, (loss, grads)), None

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), (jnp.zeros(()), params))
    (loss, grads), _ = jax.lax.scan(add, zeros, micro)
    return jax.tree.map(lambda total: total / accum, (loss, grads))


def train_step(state, batch, *, cfg, optimizer, accum=1, offload="none"):
    """One step. Returns (new state, {"loss", "grad_norm"}), both still on device.
    accum > 1: the batch in that many microbatches, one update (accumulate).
    offload "optimizer": the optimizer's state arrives in host memory, is fetched to
    the chip for the update and sent back (sessions/train/offload.py)."""
    if accum == 1:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, cfg)
    else:
        loss, grads = accumulate(state["params"], batch, cfg, accum)
    opt = to_device(state["opt"]) if offload == "optimizer" else state["opt"]
    updates, opt = optimizer.update(grads, opt, state["params"])
    params = optax.apply_updates(state["params"], updates)
    opt = to_host(opt) if offload == "optimizer" else opt
    return {"params": params, "opt": opt}, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def make_train_step(
    cfg, optimizer, *, jit=True, state_shardings=None, batch_sharding=None, accum=1,
    offload="none",
):  # fmt: skip
    """The step function the loop calls: jitted with the state donated, or
    (jit=False, session 1's way) run op by op; accum microbatches a step; the
    optimizer's state in host memory with offload "optimizer"."""
    step = functools.partial(train_step, cfg=cfg, optimizer=optimizer, accum=accum, offload=offload)
    return jit_step(step, state_shardings, batch_sharding) if jit else step


def jit_step(step, state_shardings, batch_sharding):
    """step(state, batch) -> (state, metrics), jitted over these shardings."""
    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, None),
        donate_argnums=0,  # the old state's buffers are reused for the new one
    )


def make_evaluator(cfg, tc, val_tokens, batch_sharding, *, jit=True):
    """params -> mean loss over the same tc.eval_batches validation batches
    every time (no update), each process loading only its own rows."""
    eval_step = functools.partial(loss_fn, cfg=cfg)
    eval_step = jax.jit(eval_step) if jit else eval_step
    B, S = tc.batch, cfg.seq
    rows = sharding.process_rows(batch_sharding, B, S)
    batches = [
        sharding.place_batch(
            data.get_batch(val_tokens, i, batch=B, seq=S, seed=tc.seed, stream=data.VAL, rows=rows),
            batch_sharding,
        )
        for i in range(tc.eval_batches)
    ]
    return lambda params: float(np.mean([eval_step(params, b) for b in batches]))


def train_briefly(cfg, tc, train_tokens, val_batches):
    """(params, mean validation loss over val_batches) after tc.steps jitted steps from
    scratch on one device: no mesh, checkpoints or overlap (session 2 shows those).
    Session 5 trains each grouped-query variant of one model this way, on the same
    batches, so that their losses differ by K alone."""
    optimizer = make_optimizer(tc, tc.steps)
    state = init_state(jax.random.key(tc.seed), cfg=cfg, optimizer=optimizer)
    step = jax.jit(functools.partial(train_step, cfg=cfg, optimizer=optimizer), donate_argnums=0)
    for i in range(tc.steps):
        batch = data.get_batch(train_tokens, i, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
        state, _ = step(state, batch)
    evaluate = jax.jit(functools.partial(loss_fn, cfg=cfg))
    return state["params"], float(np.mean([evaluate(state["params"], b) for b in val_batches]))


def abstract_state(cfg, tc, mesh):
    """(optimizer, init, abstract): the optimizer, init(key) -> the training
    state (sessions/train/step.py), and that state as jax.ShapeDtypeStructs carrying
    the sharding each weight's rule gives it over `mesh`. Nothing is built:
    `jax.jit(init, out_shardings=...)` then builds each shard on its device, a
    checkpoint restores into it, or a compiler for another chip reads it. With
    tc.offload "optimizer", the optimizer's shardings are in host memory."""
    optimizer = make_optimizer(tc, tc.steps)
    init = functools.partial(init_state, cfg=cfg, optimizer=optimizer, weights=tc.weights)
    key = jax.eval_shape(lambda: jax.random.key(tc.seed))  # only its shape is used
    with jax.set_mesh(mesh):
        abstract = sharding.abstract_sharded(init, key, mesh)
    if tc.offload == "optimizer":
        abstract = optimizer_on_host(abstract)
    return optimizer, init, abstract


def abstract_batch(batch, seq, batch_sharding):
    """A batch of token ids [B, S] as shapes, split as the loader splits it."""
    tokens = jax.ShapeDtypeStruct((batch, seq), np.int32, sharding=batch_sharding)
    return {"inputs": tokens, "targets": tokens}

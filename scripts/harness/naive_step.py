"""The baselines our code is measured against, written as plainly as possible:
the training step (scripts/bench.py, on the same shapes and params) and the
generator before session 3's KV cache (scripts/bench_decode.py).

What ours does differently, each explained where it lives:
  - 3-D einsums here, one 2-D matmul per projection in sessions/model/transformer.py (dense)
  - a one-hot cross-entropy here, logsumexp minus the picked logit in sessions/train/step.py
  - gradient, optimizer update and apply jitted separately here (three programs,
    the state copied between them), one donated program in sessions/train/step.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sessions.model import transformer


def forward(params, tokens, cfg):
    """The model of sessions/model/transformer.py, op for op, with every einsum 3-D."""
    x = params["embed"][tokens]
    if cfg.positions:
        x = x + params["pos"][: tokens.shape[1]]
    for layer in params["layers"]:
        if cfg.attention:
            h = norm(x, layer["attn_norm"])
            q = jnp.einsum("BSE,EHD->BSHD", h, layer["wq"])
            k = jnp.einsum("BSE,EHD->BSHD", h, layer["wk"])
            v = jnp.einsum("BSE,EHD->BSHD", h, layer["wv"])
            scores = jnp.einsum("BSHD,BTHD->BHST", q, k) / jnp.sqrt(q.shape[-1])
            S = tokens.shape[1]
            causal = jnp.tril(jnp.ones((S, S), bool))
            probs = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
            out = jnp.einsum("BHST,BTHD->BSHD", probs, v)
            x = x + jnp.einsum("BSHD,HDE->BSE", out, layer["wo"])
        h = norm(x, layer["mlp_norm"])
        h = jax.nn.relu(jnp.einsum("BSE,EF->BSF", h, layer["w_in"]))
        x = x + jnp.einsum("BSF,FE->BSE", h, layer["w_out"])
    x = norm(x, params["final_norm"])
    return jnp.einsum("BSE,VE->BSV", x, params["embed"])


def norm(x, scale):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def loss_fn(params, batch, cfg):
    logits = forward(params, batch["inputs"], cfg)
    one_hot = jax.nn.one_hot(batch["targets"], cfg.vocab)  # [B, S, V], all but one zero
    return -jnp.mean(jnp.sum(one_hot * jax.nn.log_softmax(logits), axis=-1))


def make_naive_step(cfg, optimizer):
    """(state, batch) -> (state, {"loss"}), in three separately jitted pieces."""
    grad_fn = jax.jit(jax.value_and_grad(loss_fn), static_argnums=2)
    update_fn = jax.jit(optimizer.update)
    apply_fn = jax.jit(optax.apply_updates)

    def step(state, batch):
        loss, grads = grad_fn(state["params"], batch, cfg)
        updates, opt = update_fn(grads, state["opt"], state["params"])
        return {"params": apply_fn(state["params"], updates), "opt": opt}, {"loss": loss}

    return step


@functools.partial(jax.jit, static_argnames="cfg")
def _next_token(params, window, length, cfg):
    """The old generator's step: window int [1, S], the first `length` slots filled."""
    return jnp.argmax(transformer.forward(params, window, cfg)[0, length - 1])  # the model's own


def uncached_generate(params, cfg, prompt, n_new):
    """The generator before session 3 (greedy here): one forward pass over the
    whole window per new token, and a host round trip (int(token)) after each."""
    tokens = list(prompt)
    for _ in range(n_new):
        context = tokens[-cfg.seq :]
        window = np.zeros((1, cfg.seq), np.int32)
        window[0, : len(context)] = context
        tokens.append(int(_next_token(params, window, len(context), cfg)))
    return tokens

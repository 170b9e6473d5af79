"""Inference: a KV cache, prefill and decode.

A new token needs the keys and values of every token before it, in every
layer. They never change once computed, so a decoder keeps them, the KV cache,
and each step computes only the new token's:

    prefill  the prompt [B, P] through the model once, like a training forward
             pass (compute-bound); its keys and values fill the cache's first P slots.
    decode   one token per row per step, [B, 1] through the model: it writes its
             own K and V at its position and attends to the cache up to there.
             Each step reads every weight and the cache for B tokens:
             memory-bound until B is large (roofline/decode.py).

The cache: a key and a value of [H, D] per layer, row and position, T =
cfg.seq positions, in the compute dtype: 2·L·B·T·H·D·bytes. It is held as
one dict per layer, like the params, with "v" [B, H, T, D] and "k" stored
transposed, [B, H, D, T]: q·k contracts D and probs·v contracts T, and a
matmul reads its right operand fastest as [contracted, kept]. In [B, T, H, D]
order XLA's CPU backend transposes the whole cache, every layer, every step,
before its matmuls: 3x slower decode attention at gpt2 shapes, for the same
bytes.

The weights, too, are laid out for decode (decode_weights): each matmul
weight stored transposed, [out, in], as torch.nn.Linear keeps its own, and
multiplied as weight @ tokens^T (dense_out_in). A decode step is a chain of
matrix-vector products, and XLA's CPU backend streams a matrix fastest when
each output is the dot of one contiguous row with the vector: gpt2's 24 MLP
matrices at batch 1 take 9.4 ms [out, in] against 11.0 ms [in, out], the
training layout, on this course's 2-core machine. The copy is made once per
generate(), not per token; on GPU and TPU the layout makes no difference.

The whole decode loop is one compiled program (lax.fori_loop): no host round
trip per token, and its step count is an argument, not a shape, so it
compiles once per batch size.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sessions import sharding
from sessions.attention import attention
from sessions.config import UsageError
from sessions.model import block, cast, embed, unembed
from sessions.sharding import constrain


def init_cache(cfg, batch):
    """An empty cache, one dict per layer (like params["layers"]): "k" zeros
    [B, H, D, T] and "v" zeros [B, H, T, D], in the compute dtype. A model
    without attention needs none: its tokens never read each other."""
    B, H, D, T = batch, cfg.heads, cfg.head_dim, cfg.seq
    return [
        {
            "k": constrain(jnp.zeros((B, H, D, T), cfg.dtype), "BHDT"),
            "v": constrain(jnp.zeros((B, H, T, D), cfg.dtype), "BHTD"),
        }
        for _ in range(cfg.layers if cfg.attention else 0)
    ]


def cache_bytes(cache):
    """Bytes the cache holds: 2·L·B·T·H·D·bytes per element."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def cached_attention(q, k, v, cache, pos):
    """The new tokens' attention over the cache and over themselves.

    q, k, v: [B, S, H, D], the tokens at positions pos..pos+S-1; cache: one
    layer's {"k": [B, H, D, T], "v": [B, H, T, D]}, filled before pos ->
    [B, S, H, D]. Query s sees the cached keys t < pos and the new keys up to
    itself: one softmax over both, the causal mask of sessions/attention.py."""
    S, T, D = q.shape[1], cache["k"].shape[-1], q.shape[-1]
    # Scores in float32, as in sessions/attention.py: exp() of bf16 scores is too coarse.
    old = jnp.einsum("BSHD,BHDT->BHST", q, cache["k"], preferred_element_type=jnp.float32)
    new = jnp.einsum("BSHD,BTHD->BHST", q, k, preferred_element_type=jnp.float32)
    old, new = old * D**-0.5, new * D**-0.5
    low = jnp.finfo(jnp.float32).min  # not -inf: a fully masked row would give NaN
    old = jnp.where(jnp.arange(T) < pos, old, low)
    new = jnp.where(jnp.arange(S)[None, :] <= jnp.arange(S)[:, None], new, low)
    probs = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1)
    probs = probs.astype(v.dtype)
    out = jnp.einsum("BHST,BHTD->BSHD", probs[..., :T], cache["v"])
    return out + jnp.einsum("BHST,BTHD->BSHD", probs[..., T:], v)


def write(cache, k, v, pos):
    """One layer's cache with k, v [B, S, H, D] written at positions pos..pos+S-1."""
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, H, D, S], [B, H, S, D]
    return {
        "k": constrain(jax.lax.dynamic_update_slice(cache["k"], k, (0, 0, 0, pos)), "BHDT"),
        "v": constrain(jax.lax.dynamic_update_slice(cache["v"], v, (0, 0, pos, 0)), "BHTD"),
    }


def _attend_with_cache(cache, pos):
    """attend(q, k, v) for model.block: attention over this layer's cache and the
    new tokens, then their k, v written into the cache, in place (the cache is
    the loop's carry)."""

    def attend(q, k, v):
        out = cached_attention(q, k, v, cache, pos)
        # Every read of the cache must come before the write, or XLA keeps the
        # old cache alive by copying it, all of it, every step. The write's
        # inputs are made to depend on the attention's output to say so: adding
        # 0·out, which XLA cannot drop (0·NaN is NaN). optimization_barrier is
        # the documented tool, but XLA's CPU backend removes it too early.
        after = 0 * out[:, :1, :1, :1]
        return out, write(cache, k + after, v + after, pos)

    return attend


# How many leading dims of each matmul weight are its inputs (model.dense's n_in).
INPUT_DIMS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_in": 1, "w_out": 1}


def out_in_order(path, ndim):
    """The permutation that puts a weight's output dims before its input dims
    ([E, H, D] -> [H, D, E]), found by its name at the end of `path`; None for
    a leaf decode reads as stored (norm scales, the embedding)."""
    n_in = INPUT_DIMS.get(path[-1].key)
    return None if n_in is None else (*range(n_in, ndim), *range(n_in))


def out_in_spec(path, leaf, order):
    """The weight's partition rule (sessions/sharding.py), its dims permuted alike."""
    spec = sharding.spec_for(path, leaf)
    return P(*(spec[i] for i in order))


@functools.partial(jax.jit, static_argnames="cfg")
def decode_weights(params, cfg):
    """The params as a decode step reads them: in the compute dtype, each
    matmul weight transposed to [*out, *in] (wq [E, H, D] -> [H, D, E], wo
    [H, D, E] -> [E, H, D], w_in [E, F] -> [F, E], ...), split over a mesh by
    its own rule, permuted. The tied embedding [V, E] is [out, in] already."""

    def relayout(path, w):
        order = out_in_order(path, w.ndim)
        if order is None:
            return w
        w = jnp.transpose(w, order)
        if jax.sharding.get_abstract_mesh().empty:
            return w
        return jax.lax.with_sharding_constraint(w, out_in_spec(path, w, order))

    return jax.tree_util.tree_map_with_path(relayout, cast(params, cfg))


def abstract_decode_weights(abstract_params):
    """What decode_weights returns, from ShapeDtypeStructs carrying shardings
    (compile-only planning, sessions/aot.py): shapes and rules permuted alike."""

    def relayout(path, x):
        order = out_in_order(path, x.ndim)
        if order is None:
            return x
        shape = tuple(x.shape[i] for i in order)
        sharding_ = NamedSharding(x.sharding.mesh, out_in_spec(path, x, order))
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding_)

    return jax.tree_util.tree_map_with_path(relayout, abstract_params)


def dense_out_in(x, w, n_in=1):
    """model.dense for a weight stored [*out, *in] (decode_weights): x [B, S, *in]
    -> [B, S, *out], as one product with the weight on the left and the tokens
    as its columns, [out, in] @ [in, B·S], transposed back (a few KB).

    That order matters on a CPU. With the weight on the left, XLA's CPU backend
    reads it once, row by row, whatever the batch; as x @ w^T, 2 to 8 rows cost
    it about twice one row's time (gpt2's MLP weights at batch 4: 11.8 ms
    against 18.4 ms). Its simplifier rewrites the one into the other, so the
    product is held as computed behind an optimization barrier."""
    B, S = x.shape[:2]
    out_shape, in_shape = w.shape[: w.ndim - n_in], w.shape[w.ndim - n_in :]
    x2 = x.reshape(B * S, math.prod(in_shape))
    w2 = w.reshape(math.prod(out_shape), math.prod(in_shape))
    y = jax.lax.optimization_barrier(w2 @ x2.T)  # [out, B·S]
    return y.T.reshape(B, S, *out_shape)


def decode_step(w, cache, token, pos, cfg):
    """One token per row through the model.

    w: decode_weights(params, cfg); token: int [B] at position pos (traced) ->
    (logits float32 [B, V] for position pos + 1, the cache with pos written)."""
    x = embed(w, token[:, None], cfg, start=pos)  # [B, 1, E]
    written = []
    for i, layer in enumerate(w["layers"]):
        attend = _attend_with_cache(cache[i], pos) if cfg.attention else None
        x, new = block(layer, x, cfg, attend, dense=dense_out_in)
        written.append(new)
    return unembed(w, x)[:, 0], written if cfg.attention else cache


@functools.partial(jax.jit, static_argnames="cfg")
def prefill(params, prompts, cfg):
    """prompts: int [B, P] -> (logits float32 [B, V] for position P, the cache
    with slots 0..P-1 filled). The prompt runs through the model once, with the
    model's own causal attention; each layer's k, v go into the cache."""
    p = cast(params, cfg)

    def keep(q, k, v):
        return attention(q, k, v, impl=cfg.attention_impl), (k, v)

    x, cache = embed(p, prompts, cfg), init_cache(cfg, prompts.shape[0])
    for i, layer in enumerate(p["layers"]):
        x, kv = block(layer, x, cfg, keep)
        if cfg.attention:  # without attention no token reads another: nothing to keep
            cache[i] = write(cache[i], *kv, 0)
    return unembed(p, x[:, -1:])[:, 0], cache


def pick(logits, key, pos, temperature, greedy):
    """logits float32 [B, V] -> tokens int [B]: argmax when greedy, else a sample
    at `temperature` with a key folded in from the position, so a run is
    reproducible from its key whatever the batch's sharding."""
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    key = jax.random.fold_in(key, pos)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "greedy"), donate_argnames=("cache", "tokens"))
def decode(weights, cache, tokens, logits, start, n, key, temperature, cfg, greedy):
    """n decode steps as one program.

    weights: decode_weights(params, cfg); tokens: int [B, T], filled up to
    start; logits: float32 [B, V], the prediction for position start. Step i
    picks the token at start + i, writes it into tokens, and runs it through
    the model for the next logits. -> (tokens, cache, logits), the same
    shapes. start and n are traced: one compile serves every prompt length
    and count."""

    def step(i, carry):
        tokens, cache, logits = carry
        pos = start + i
        token = pick(logits, key, pos, temperature, greedy)
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, pos))
        logits, cache = decode_step(weights, cache, token, pos, cfg)
        return tokens, cache, logits

    return jax.lax.fori_loop(0, n, step, (tokens, cache, logits))


def check_lengths(cfg, prompt_len, n_new):
    """UsageError unless a prompt of prompt_len tokens and n_new more fit the context."""
    if prompt_len < 1:
        raise UsageError("the prompt is empty")
    if prompt_len > cfg.seq:
        raise UsageError(f"the prompt is {prompt_len} tokens, longer than the context of {cfg.seq}")
    if n_new < 0 or prompt_len + n_new > cfg.seq:
        raise UsageError(
            f"a prompt of {prompt_len} tokens and {n_new} new ones do not fit the context of "
            f"{cfg.seq}; ask for at most {cfg.seq - prompt_len} new tokens"
        )


def generate(params, cfg, prompts, n_new, *, key=None, temperature=0.0):
    """prompts: int [B, P] -> int [B, P + n_new], the prompts and their continuations.

    temperature 0: greedy (argmax); otherwise sampled at that temperature with
    `key`. Prefill once, then n_new decode steps in one compiled loop. Under a
    mesh (jax.set_mesh) the cache is split like the activations: rows over
    data and fsdp, heads over tp."""
    prompts = jnp.asarray(prompts, jnp.int32)
    if prompts.ndim != 2:
        raise UsageError(f"prompts must be [batch, length], got shape {prompts.shape}")
    P = prompts.shape[1]
    check_lengths(cfg, P, n_new)
    if temperature < 0:
        raise UsageError(f"the temperature must be 0 (greedy) or positive, got {temperature}")
    if temperature > 0 and key is None:
        raise UsageError("sampling (temperature > 0) needs a key")
    key = jax.random.key(0) if key is None else key  # unused when greedy
    logits, cache = prefill(params, prompts, cfg)
    tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - P)))  # [B, T], room for the new tokens
    tokens, _, _ = decode(
        decode_weights(params, cfg), cache, tokens, logits, P, n_new, key, temperature,
        cfg=cfg, greedy=temperature == 0,
    )
    return tokens[:, : P + n_new]

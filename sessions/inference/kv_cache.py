"""Inference: a KV cache, prefill and decode.

A new token needs the keys and values of every token before it, in every
layer. They never change once computed, so a decoder keeps them, the KV cache,
and each step computes only the new token's:

    prefill  the prompt [B, P] through the model once, like a training forward
             pass (compute-bound); its keys and values fill the cache's first P slots.
    decode   one token per row per step, [B, 1] through the model: it writes its
             own K and V at its position and attends to the cache up to there.
             Each step reads every weight and the cache for B tokens:
             memory-bound until B is large (roofline/decode_cost.py).

The cache: a key and a value of [K, D] per layer, row and position (K heads:
H, or fewer shared by G = H/K query heads each), T = cfg.seq positions, in the
compute dtype: 2·L·B·T·K·D·bytes. It is one dict per layer, like the params,
with "v" [B, K, T, D] and "k" stored transposed, [B, K, D, T]: q·k contracts D
and probs·v contracts T, and a matmul reads its right operand fastest as
[contracted, kept]. In [B, T, K, D] order XLA's CPU backend transposes the
whole cache, every layer, every step, before its matmuls: 3x slower decode
attention at gpt2 shapes, for the same bytes. Rotary keys are cached turned,
each at its own position (sessions/model/rotary.py): a step turns only its own.

The weights, too, are laid out for decode (sessions/inference/layout.py): each
matmul weight [out, in], multiplied with the weight on the left.

Decode runs as one compiled program of STEPS steps (decode_steps), called
again until n_new tokens are out: one dispatch per STEPS tokens, queued
without waiting (JAX dispatches asynchronously). Its loop's trip count is a
constant, not the step count: XLA's GPU runtime runs a loop of unknown count
by copying its predicate to the host and waiting for it after every trip
(WhileThunk::ExecuteOnStream, xla/backends/gpu/runtime/while_thunk.cc), a
round trip per token, where the roofline gives a whole step of the course
preset on an H100 about 8 us. The start and the count are arguments, not
shapes: one compile per batch size.

Prefill's attention is the model's, except where a kernel would not take the
prompt: attention_choice.choose_for_length decides, for its length and platform.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from sessions.errors import UsageError
from sessions.inference.kernel_step import impl_for, step_function
from sessions.inference.layout import decode_weights, dense_out_in, quantize_decode_weights
from sessions.model import quantize
from sessions.model.attention import attention, cached_probs
from sessions.model.attention_choice import choose_for_length, platform_of
from sessions.model.transformer import block, cast, embed, unembed
from sessions.shard.sharding import constrain


def init_cache(cfg, batch, int8=False):
    """An empty cache, one dict per layer (like params["layers"]): "k" zeros
    [B, K, D, T] and "v" zeros [B, K, T, D], in the compute dtype. A model
    without attention needs none: its tokens never read each other."""
    if int8:  # int8, with a scale per token and KV head (sessions/model/quantize.py)
        return quantize.init_int8_cache(cfg, batch)
    B, K, D, T = batch, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    return [
        {
            "k": constrain(jnp.zeros((B, K, D, T), cfg.dtype), "BKDT"),
            "v": constrain(jnp.zeros((B, K, T, D), cfg.dtype), "BKTD"),
        }
        for _ in range(cfg.layers if cfg.attention else 0)
    ]


def cache_bytes(cache):
    """Bytes the cache holds: 2·L·B·T·K·D·bytes per element."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def cached_attention(q, k, v, cache, pos):
    """The new tokens' attention over the cache and over themselves.

    q: [B, S, H, D], k, v: [B, S, K, D], the tokens at positions pos..pos+S-1;
    cache: one layer's {"k": [B, K, D, T], "v": [B, K, T, D]}, filled before
    pos -> [B, S, H, D]. Query s sees the cached keys t < pos and the new keys
    up to itself: one softmax over both, in float32, with the causal mask and the
    groups of sessions/model/attention.py (query head h = k·G + g reads KV head k)."""
    if "k_scale" in cache:  # an int8 cache (sessions/model/quantize.py)
        return quantize.cached_attention_int8(q, k, v, cache, pos)
    B, S, H, D = q.shape
    K, T = k.shape[2], cache["k"].shape[-1]
    if K == H:  # multi-head, as before grouping existed: the same einsums, the same bits
        old = jnp.einsum("BSHD,BHDT->BHST", q, cache["k"], preferred_element_type=jnp.float32)
        new = jnp.einsum("BSHD,BTHD->BHST", q, k, preferred_element_type=jnp.float32)
    else:  # q to [B, K, G, S, D], a few KB: XLA's CPU has no bf16 dot from [B, S, K, G, D]
        q = q.reshape(B, S, K, H // K, D).transpose(0, 2, 3, 1, 4)
        old = jnp.einsum("BKGSD,BKDT->BKGST", q, cache["k"], preferred_element_type=jnp.float32)
        new = jnp.einsum("BKGSD,BTKD->BKGST", q, k, preferred_element_type=jnp.float32)
    probs = cached_probs(old * D**-0.5, new * D**-0.5, pos).astype(v.dtype)
    if K == H:
        out = jnp.einsum("BHST,BHTD->BSHD", probs[..., :T], cache["v"])
        return out + jnp.einsum("BHST,BTHD->BSHD", probs[..., T:], v)
    out = jnp.einsum("BKGST,BKTD->BSKGD", probs[..., :T], cache["v"])
    out = out + jnp.einsum("BKGST,BTKD->BSKGD", probs[..., T:], v)
    return out.reshape(B, S, H, D)


def write(cache, k, v, pos, live=True):
    """One layer's cache with k, v [B, S, K, D] written at positions pos..pos+S-1;
    where `live` (a traced bool) is false, those slots keep what they held."""
    if "k_scale" in cache:  # an int8 cache (sessions/model/quantize.py)
        return quantize.write_int8(cache, k, v, pos, live)
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, K, D, S], [B, K, S, D]
    if live is not True:  # reads S slots: a few KB, not the cache
        k = jnp.where(live, k, jax.lax.dynamic_slice(cache["k"], (0, 0, 0, pos), k.shape))
        v = jnp.where(live, v, jax.lax.dynamic_slice(cache["v"], (0, 0, pos, 0), v.shape))
    return {
        "k": constrain(jax.lax.dynamic_update_slice(cache["k"], k, (0, 0, 0, pos)), "BKDT"),
        "v": constrain(jax.lax.dynamic_update_slice(cache["v"], v, (0, 0, pos, 0)), "BKTD"),
    }


def _attend_with_cache(cache, pos, live):
    """attend(q, k, v) for transformer.block: attention over this layer's cache and the
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
        return out, write(cache, k + after, v + after, pos, live)

    return attend


def decode_step(w, cache, token, pos, cfg, live=True):
    """One token per row through the model.

    w: decode_weights(params, cfg); token: int [B] at position pos (traced) ->
    (logits float32 [B, V] for position pos + 1, the cache with pos written,
    unless `live` is false). Its positions (learned or rotary) are pos's."""
    x = embed(w, token[:, None], cfg, start=pos)  # [B, 1, E]
    written = []
    for i, layer in enumerate(w["layers"]):
        attend = _attend_with_cache(cache[i], pos, live) if cfg.attention else None
        x, new = block(layer, x, cfg, attend, dense=dense_out_in, start=pos)
        written.append(new)
    logits = unembed(w, x, dense=dense_out_in)[:, 0].astype(jnp.float32)
    return logits, written if cfg.attention else cache


@functools.partial(jax.jit, static_argnames=("cfg", "int8_cache"))
def prefill(params, prompts, cfg, int8_cache=False):
    """prompts: int [B, P] -> (logits float32 [B, V] for position P, the cache
    with slots 0..P-1 filled, int8 if int8_cache). The prompt runs through the
    model once, with the model's own causal attention; each layer's k, v go into
    the cache (the keys turned by their positions 0..P-1 when rotary)."""
    p = cast(params, cfg)

    def keep(q, k, v):
        return attention(q, k, v, impl=cfg.attention_impl), (k, v)

    x, cache = embed(p, prompts, cfg), init_cache(cfg, prompts.shape[0], int8_cache)
    for i, layer in enumerate(p["layers"]):
        x, kv = block(layer, x, cfg, keep)
        if cfg.attention:  # without attention no token reads another: nothing to keep
            cache[i] = write(cache[i], *kv, 0)
    return unembed(p, x[:, -1:])[:, 0].astype(jnp.float32), cache


def pick(logits, key, pos, temperature, greedy):
    """logits float32 [B, V] -> tokens int [B]: argmax when greedy, else a sample at
    `temperature`, its key folded in from the position (reproducible whatever the sharding)."""
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    key = jax.random.fold_in(key, pos)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


# Decode steps per compiled call. A call takes the host 60-100 us to dispatch (the
# course preset on this course's 2-core machine), which 16 steps of about 8 us on an
# H100 outlast, so the host stays ahead of the chip. The last call runs up to 15
# steps that count for nothing; 16 divides s3_infer.py's 64 new tokens and
# sample.py's windows of 64.
STEPS = 16


@functools.partial(jax.jit, static_argnames=("cfg", "greedy", "impl"), donate_argnums=(1, 2))
def decode_steps(
    weights, cache, tokens, logits, start, n, key, temperature, cfg, greedy, impl=None
):
    """STEPS decode steps as one program, of which the first n count.

    weights: decode_weights(params, cfg); tokens: int [B, T], filled up to start; logits:
    float32 [B, V], the prediction for position start. Step i picks the token at start + i,
    writes it into tokens, and runs it through the model for the next logits. -> (tokens,
    cache, logits), the same shapes. The trip count is a constant the compiler sees (a GPU
    runs the body STEPS times, never the condition); steps from n on still run (a branch
    would cost a GPU a host round trip, in its ConditionalThunk) but leave tokens, cache
    and logits as they found them. start and n are traced: one compile serves every
    prompt length and count. impl: None, XLA's step, or our kernels' (step_function)."""
    decode = step_function(impl, decode_step)

    def step(i, carry):
        tokens, cache, logits = carry
        pos, live = start + i, i < n
        token = pick(logits, key, pos, temperature, greedy)
        held = jax.lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1)  # [B, 1]
        token_ = jnp.where(live, token[:, None], held)
        tokens = jax.lax.dynamic_update_slice(tokens, token_, (0, pos))
        # held where not live; (i, run): where the step is, for our kernels (kernel_step.clock)
        logits, cache = decode(weights, cache, token, pos, cfg, live, logits, (i, run))
        return tokens, cache, logits

    run = jnp.stack([start, n])  # once a call, outside the loop
    return jax.lax.fori_loop(0, STEPS, step, (tokens, cache, logits))


def decode_loop(weights, cache, tokens, logits, start, n, key, temperature, cfg, greedy, impl=None):
    """n decode steps (start, n: ints) from position start, as decode_steps
    calls of STEPS each, the last one masked: -> (tokens, cache, logits). The
    calls queue on the device; nothing waits for one to finish."""
    for done in range(0, n, STEPS):
        args = (weights, cache, tokens, logits, start + done, n - done, key, temperature)
        tokens, cache, logits = decode_steps(*args, cfg, greedy, impl)
    return tokens, cache, logits


def repeatable_decode(weights, cache, tokens, logits, start, n, key, cfg, impl=None):
    """A call that runs decode_loop's n steps from `start`, sampled at temperature
    1, as often as a timing repeats it (roofline.timing.time_calls). decode_steps
    donates the cache and the tokens, so each call decodes from what the last one
    returned; every call writes the same slots, so each does the same work."""
    state = [tokens, cache, logits]  # as decode_loop returns them

    def call():
        tokens, cache, logits = state
        state[:] = decode_loop(weights, cache, tokens, logits, start, n, key, 1.0, cfg, False, impl)
        return state

    return call


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


def generate(
    params,
    cfg,
    prompts,
    n_new,
    *,
    key=None,
    temperature=0.0,
    int8_weights=False,
    int8_cache=False,
    decode_impl="xla",
):
    """prompts: int [B, P] -> int [B, P + n_new], the prompts and their continuations.

    temperature 0: greedy (argmax); otherwise sampled at that temperature with
    `key`. Prefill once, then n_new decode steps in compiled chunks of STEPS. Under a
    mesh (jax.set_mesh) the cache is split like the activations: rows over
    data and fsdp, KV heads over tp. int8_weights, int8_cache: decode reads its
    weights, its cache, in int8 (sessions/model/quantize.py), one program for each kind.
    decode_impl "pallas": our kernels decode (sessions/inference/kernel_step.py)."""
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
    impl, _ = choose_for_length(cfg, platform_of(params), *prompts.shape)
    prefill_cfg = dataclasses.replace(cfg, attention_impl=impl)
    logits, cache = prefill(params, prompts, prefill_cfg, int8_cache)
    tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - P)))  # [B, T], room for the new tokens
    w = decode_weights(params, cfg)
    w = quantize_decode_weights(w) if int8_weights else w
    impl = impl_for(decode_impl, platform_of(params))
    tokens, _, _ = decode_loop(
        w, cache, tokens, logits, P, n_new, key, temperature, cfg, temperature == 0, impl
    )
    return tokens[:, : P + n_new]

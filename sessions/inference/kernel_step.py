"""The decode step in kernels: each layer two Mosaic GPU launches, not XLA's dozen.

At small batches a decode step on a GPU is bound by its launches, not its
bytes: GPT-2's step compiled for an H100 runs 163 kernels a token, about
0.39 ms measured, where its bytes take about 0.065 ms at the HBM roof. Here each
layer is one kernel for its attention half (sessions/kernels/decode_attention.py) and
one for its MLP half (sessions/kernels/decode_mlp.py), and the head (the last partials,
the final norm, the logits, the loop's select) one more (sessions/kernels/decode_head.py);
the embedding stays XLA's. Same signature and results as kv_cache.decode_step.

The residual between kernels ("pending" partial sums): a kernel may split its
last matmul's contraction over P thread blocks, each writing its own float32
partial sum [B, E], with no grid-wide barrier. The next kernel adds them:

    x        [B, E] cfg.dtype  the residual without the partials still pending
    pending  [P, B, E] f32     the last block's output, in P partial sums

Each kernel begins with x_now = (x + pending[0] + pending[1] + ..., in float32 in
that order, cast to cfg.dtype once, as XLA rounds `x + block(x)`), its norm, its
work, and returns (x_now, its own partials). The attention kernel's come from slices
of the cache (flash decoding) with their softmax stats, which weigh them as the MLP
kernel adds them (sessions/kernels/decode_residual.py). The first kernel gets P = 0 partials
(an empty array, not zeros: zeros would cost a kernel a token to write). After the
last layer the step adds the last partials itself, in the same order.

`impl` names the step a decode program runs (kv_cache.decode_steps): None for
XLA's (kv_cache.decode_step), "pallas" for these kernels compiled for a GPU, or
"pallas-interpret" for the same kernels in Mosaic GPU's interpreter (a CPU, slowly).
--decode-impl pallas picks between the two by the platform (impl_for).
"""

import functools
import inspect

import jax
import jax.numpy as jnp

from roofline.decode_cost import dtype_bytes, kv_cache_bytes, weight_bytes
from sessions.errors import UsageError
from sessions.inference.layout import dense_out_in
from sessions.kernels.decode_grid import attention_bytes_in_flight
from sessions.kernels.decode_head import head_bytes_in_flight, head_refusal
from sessions.kernels.decode_mlp import mlp_bytes_in_flight
from sessions.model import rotary
from sessions.model.transformer import embed, unembed

MAX_BATCH = 8  # rows a wgmma's N holds: the batch rides there (see decode_mlp.py)
TILE = 64  # a warpgroup's rows (wgmma's M): E, F and H·D come in tiles of it
IMPLS = (None, "pallas", "pallas-interpret")


def check_supported(
    cfg, batch, *, int8_weights=False, int8_cache=False, devices=1, interpret=False
):
    """None if the kernels run this model at this batch on `devices` devices, else
    UsageError saying why, on one line. Each kernel is asked too (its own shapes), so
    no shape reaches Mosaic GPU's assertions. interpret: in the interpreter (a CPU)."""
    why = None
    if jnp.dtype(cfg.dtype) != jnp.bfloat16:
        why = "runs bfloat16: add --dtype bfloat16"
    elif int8_weights or int8_cache:
        why = "reads bfloat16 weights and cache, not int8"
    elif batch > MAX_BATCH:
        why = f"takes batches of at most {MAX_BATCH}, not {batch}"
    elif devices > 1:
        why = f"runs on one device, not a mesh of {devices}"
    else:
        sizes = {
            "--embed": cfg.embed,
            "--ff": cfg.ff,
            "heads x --head-dim": cfg.heads * cfg.head_dim,
        }
        if odd := [f"{name} {n}" for name, n in sizes.items() if n % TILE]:
            why = f"needs multiples of {TILE}, not {', '.join(odd)}"
    if why:
        raise UsageError(f"--decode-impl pallas {why}")
    from sessions.kernels import decode_attention, decode_mlp, mosaic  # loads Mosaic GPU

    if interpret and mosaic.OLD_INTERPRETER:  # JAX 0.10's lacks the MLP kernel's primitives
        raise UsageError(
            "--decode-impl pallas on a CPU runs in Mosaic GPU's interpreter, "
            "which needs JAX 0.11 or later (Python 3.12+)"
        )
    kernels = [decode_mlp.mlp_refusal(cfg, batch)]
    if cfg.attention:
        kernels.insert(0, decode_attention.attention_refusal(cfg, batch))
    if why := next((w for w in kernels if w), None):
        prefix = "--decode-impl pallas "  # decode_mlp's reasons name the flag already
        raise UsageError(why if why.startswith(prefix) else prefix + why)


def impl_for(decode_impl, platform):
    """The step a --decode-impl runs on `platform` ("cpu", "gpu", "tpu"): our kernels
    compiled for a GPU, anywhere else in Mosaic GPU's interpreter."""
    if decode_impl == "xla":
        return None
    return "pallas" if platform == "gpu" else "pallas-interpret"


def step_function(impl, xla_step):
    """decode_step(w, cache, token, pos, cfg, live) for `impl` (IMPLS); xla_step is
    kv_cache.decode_step, which this module does not import (it imports this one)."""
    if impl not in IMPLS:
        raise ValueError(f"decode step {impl!r}: one of {IMPLS}")
    if impl is None:

        def held_where_not_live(w, cache, token, pos, cfg, live, held, loop=None):
            logits, cache = xla_step(w, cache, token, pos, cfg, live)
            return jnp.where(live, logits, held), cache

        return held_where_not_live
    return functools.partial(kernel_decode_step, interpret=impl == "pallas-interpret")


def clock(pos, live, loop=None):
    """Where a step is, as our kernels read it (decode_residual.pos_and_live): (int32 [1],
    int32 [2]), step i of a call that decodes n steps from position start. In
    kv_cache.decode_steps both are arrays its loop holds, the counter i and (start, n)
    made once a call (loop), so no kernel a token puts pos and live together. A step
    alone is the first of a call of 1 (live) or 0 steps from pos."""
    i, run = loop if loop is not None else (0, jnp.stack([pos, live]))
    return jnp.reshape(i, (1,)).astype(jnp.int32), run.astype(jnp.int32)


def _settle(x, pending):
    """x [B, E] with its pending partials [P, B, E] added: x + p[0] + p[1] + ... in
    float32 in that order, then rounded to x's dtype once, as the kernels add them."""
    total = x.astype(jnp.float32)
    for partial in pending:  # one at a time, in order: not pending.sum(0), reordered
        total = total + partial
    return total.astype(x.dtype)


def kernel_decode_step(w, cache, token, pos, cfg, live=True, held=None, loop=None, *, interpret):
    """One token per row through the model, two kernels a layer.

    w: decode_weights(params, cfg); token: int [B] at position pos (traced) ->
    (logits float32 [B, V] for position pos + 1, the cache with pos written unless
    `live` is false), as kv_cache.decode_step. held: the last logits, returned where
    the step is not live (None: none kept). loop: (i, (start, n)) of kv_cache.decode_steps'
    loop, or None for a step alone. interpret: run the kernels in Mosaic GPU's
    interpreter (True on a CPU) or compile them for a GPU (False). What the kernels do
    not run is refused here, as the program is traced."""
    int8_cache = bool(cache) and "k_scale" in cache[0]
    int8_weights = any(leaf.dtype == jnp.int8 for leaf in jax.tree.leaves(w))
    mesh = jax.sharding.get_abstract_mesh()  # the mesh the step is traced under, if any
    devices = 1 if mesh.empty else mesh.size
    kinds = {"int8_weights": int8_weights, "int8_cache": int8_cache, "devices": devices}
    kinds["interpret"] = interpret
    check_supported(cfg, token.shape[0], **kinds)
    # Imported here, as first traced: XLA's decode never loads Mosaic GPU.
    from sessions.kernels import decode_attention, decode_grid, decode_head, decode_mlp

    where = clock(pos, live, loop)

    x = embed(w, token[:, None], cfg, start=pos)[:, 0]  # [B, E]
    pending = jnp.zeros((0, *x.shape), jnp.float32)  # none before layer 0: no buffer to fill
    rope = rope_tables(jnp.asarray(pos), cfg.head_dim, cfg.rope_base) if cfg.rope else None
    written, stats, slices = [], None, decode_grid.slices(cfg)
    for i, layer in enumerate(w["layers"]):
        if cfg.attention:  # its partials come with the softmax stats the MLP merges them by
            x, pending, stats, new = once(decode_attention.attention_layer)(
                layer, cache[i], x, pending, where, cfg, rope=rope, interpret=interpret
            )
            written.append(new)
        merge = {"stats": stats, "slices": slices, "interpret": interpret}
        x, pending = once(decode_mlp.mlp_layer)(layer, x, pending, cfg, **merge)
    cache = written if cfg.attention else cache
    if held is not None and decode_head.head_refusal(cfg) is None:  # the head: one kernel
        return decode_head.head(w, x, pending, held, where, cfg, interpret=interpret), cache
    x = _settle(x, pending)[:, None]  # [B, 1, E]: the last layer's partials, added here
    logits = unembed(w, x, dense=dense_out_in)[:, 0].astype(jnp.float32)
    return (logits if held is None else jnp.where(live, logits, held)), cache


@functools.cache
def once(kernel):
    """kernel under jax.jit: the layers that call it with one shape trace it and lower it
    to Mosaic GPU once, not once a layer (GPT-2: 12 alike), and share its compiled code."""
    static = {"cfg", "slices", "interpret"} & set(inspect.signature(kernel).parameters)
    return jax.jit(kernel, static_argnames=tuple(static))


def rope_tables(pos, D, base):
    """float32 [2, D]: cos and sin of each dim's angle at `pos`, as rotary.rotate computes
    them; sin negated on the first half, where rotate_half subtracts."""
    theta = pos.astype(jnp.float32) * rotary.frequencies(D, base)  # [D/2]
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.concatenate([cos, cos]), jnp.concatenate([-sin, sin])])


def byte_streams(cfg, batch):
    """The step's bytes by the kernels that read them, each with the bytes its grid keeps in
    flight, for the estimate's Little's law (roofline/plan/decode_estimate.py): the attention
    kernels' (q, k, v and o weights, the norm, the caches), the MLP kernels' (their weights and
    norm), the head kernel's (the table and the final norm), and the rest, XLA's (the
    embedding and position rows; the head where ours refuses it: None in flight, XLA's
    fitted rate). [(bytes, bytes in flight)]"""
    E, F, H, K, D = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    value, cache = dtype_bytes(cfg.dtype), kv_cache_bytes(cfg, batch)
    attention = cfg.layers * (2 * H * D * E + 2 * K * D * E + E) * value + cache
    mlp = cfg.layers * ((3 if cfg.gated else 2) * E * F + E) * value
    head = (cfg.vocab * E + E) * value if head_refusal(cfg) is None else 0
    rest = weight_bytes(cfg) + cache - attention - mlp - head
    streams = [
        (attention, attention_bytes_in_flight(cfg, batch)),
        (mlp, mlp_bytes_in_flight(cfg, batch)),
        (rest, None),
    ]
    return streams + ([(head, head_bytes_in_flight(cfg))] if head else [])

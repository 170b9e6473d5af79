"""The paged KV cache on the device: a pool of pages a layer, written and read through
each row's page table, and the one compiled step that serves both decode and prefill.

The pool: per layer "k" [pages + 1, K, D, N] and "v" [pages + 1, K, N, D] in cfg.dtype,
N tokens a page, the last page the padding page (sessions/serve/pages.py). The same
orders as session 3's contiguous cache (sessions/inference/kv_cache.py: "k" [B, K, D, T],
"v" [B, K, T, D]) with the row replaced by the page and T by the page's N: a page is one
contiguous block of K·D·N values, so gathering a row's P pages copies whole blocks, and
the gathered keys come out [R, K, D, P·N] (q·k contracts D, read as [contracted, kept])
and the values [R, K, P·N, D] (probs·v contracts T), the layouts XLA's CPU multiplies
without transposing again (kv_cache.py measured 3x for [T, K, D] keys). XLA's CPU
backend gathers page-major, [R, P, K, D, N], then transposes: the row's pages are copied
twice a step (its compiled program; a lax.gather asked for the head-major order directly
compiles to the same two copies).

A step takes R rows of C tokens: row r's count[r] tokens at positions start[r] ..
start[r] + count[r] - 1. Each layer first writes the rows' new keys and values into the
pool, token at position p into page table[r, p // N] at offset p % N, by a scatter whose
padded tokens (and rows with count 0, not live) aim past the pool and are dropped
(mode="drop"): a row that is not live writes nothing. Then it gathers every row's P pages
and attends over them, each query to the keys at or before its own position: each row
its own causal mask and length. Decode is R = slots rows of C = 1; a prefill chunk is
R = 1 row of C = prefill_chunk: two shapes, two compiles, one function.

The gather reads a row's P pages and writes them again before the matmuls read them: the
cache's bytes a second time, the price of paging on XLA. On a chip a paged-attention
kernel reads the pages in place through the table: jax.experimental.pallas.ops.tpu.
paged_attention (TPUs; ragged_paged_attention, beside it, takes prefill chunks and decodes
in one call, as vLLM's TPU backend does) and jax.experimental.pallas.ops.gpu.
paged_attention (a Triton kernel for GPUs), both with pages [K, pages, N, D].
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sessions.inference.layout import dense_out_in
from sessions.model.attention import masked_softmax
from sessions.model.transformer import block, embed, unembed


def init_pool(cfg, pages, page_size):
    """An empty pool, one dict per layer: "k" zeros [pages + 1, K, D, N], "v" zeros
    [pages + 1, K, N, D] in cfg.dtype (the last page the padding page). A model
    without attention keeps no cache."""
    K, D, N = cfg.n_kv_heads, cfg.head_dim, page_size
    return [
        {
            "k": jnp.zeros((pages + 1, K, D, N), cfg.dtype),
            "v": jnp.zeros((pages + 1, K, N, D), cfg.dtype),
        }
        for _ in range(cfg.layers if cfg.attention else 0)
    ]


def write_pages(layer, k, v, page, offset):
    """One layer's pool with k, v [R, C, K, D] written at (page, offset) [R, C]; a
    token whose page is past the pool is dropped, no write at all."""
    return {
        "k": layer["k"].at[page, :, :, offset].set(k, mode="drop"),  # [R, C, K, D] slots
        "v": layer["v"].at[page, :, offset, :].set(v, mode="drop"),
    }


def read_pages(layer, page_table):
    """A layer's pages gathered through page_table int [R, P] -> keys [R, K, D, T],
    values [R, K, T, D], T = P·N, in position order."""
    R, P = page_table.shape
    k = layer["k"][page_table]  # [R, P, K, D, N]
    v = layer["v"][page_table]  # [R, P, K, N, D]
    _, _, K, D, N = k.shape
    keys = k.transpose(0, 2, 3, 1, 4).reshape(R, K, D, P * N)
    values = v.transpose(0, 2, 1, 3, 4).reshape(R, K, P * N, D)
    return keys, values


def paged_attention(q, keys, values, positions):
    """q [R, C, H, D] at positions int [R, C], over keys [R, K, D, T] and values
    [R, K, T, D] -> [R, C, H, D]. Query (r, c) sees key t where t <= positions[r, c];
    groups as sessions/model/attention.py: query head h = k·G + g reads KV head k.
    Scores and softmax in float32. In the einsums, the course's letters: the rows are
    its batch B, their C tokens its queries S."""
    R, C, H, D = q.shape
    K, T = keys.shape[1], keys.shape[-1]
    q = q.reshape(R, C, K, H // K, D).transpose(0, 2, 3, 1, 4)  # [R, K, G, C, D]
    scores = jnp.einsum("BKGSD,BKDT->BKGST", q, keys, preferred_element_type=jnp.float32)
    seen = jnp.arange(T)[None, None, :] <= positions[:, :, None]  # [R, C, T]
    probs = masked_softmax(scores * D**-0.5, seen[:, None, None]).astype(values.dtype)
    out = jnp.einsum("BKGST,BKTD->BSKGD", probs, values)
    return out.reshape(R, C, H, D)


def _attend_paged(layer, page_table, page, offset, positions):
    """attend(q, k, v) for transformer.block: the new k, v written into this layer's
    pages, then attention over the pages read back (the write first: the new tokens
    see themselves, and no read of the old pool outlives the in-place write)."""

    def attend(q, k, v):
        written = write_pages(layer, k, v, page, offset)
        return paged_attention(q, *read_pages(written, page_table), positions), written

    return attend


def sample(logits, seeds, out_index, temperature):
    """logits float32 [R, V] -> tokens int [R]: argmax where temperature is 0, else a
    draw at that temperature with the key fold_in(key(seed), out_index), the request's
    own seed and output index: the same token whatever the row or its neighbours."""

    def draw(seed, i, row, t):
        return jax.random.categorical(jax.random.fold_in(jax.random.key(seed), i), row / t)

    sampled = temperature > 0
    drawn = jax.vmap(draw)(seeds, out_index, logits, jnp.where(sampled, temperature, 1.0))
    return jnp.where(sampled, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("pool",))
def paged_step(weights, pool, page_table, tokens, start, count, seeds, out_index, temperature, cfg):
    """R rows of up to C tokens through the model, their keys and values into the pool.

    weights: decode_weights(params, cfg); pool: init_pool's (donated); page_table int
    [R, P]; tokens int [R, C], of which row r's first count[r] are real, at positions
    start[r]..; seeds uint32 [R], out_index int [R], temperature float32 [R] ->
    (next_token int [R], top2_gap float32 [R], pool). Row r's token is picked from the
    logits (float32) at its last real token; top2_gap is their largest minus the
    second (a near-tie where it is tiny). A row with count 0 writes nothing and its
    token means nothing."""
    C = tokens.shape[1]
    positions = start[:, None] + jnp.arange(C)  # [R, C]
    real = jnp.arange(C)[None, :] < count[:, None]
    if cfg.attention:
        pages_plus_padding, N = pool[0]["v"].shape[0], pool[0]["v"].shape[2]
        column = jnp.minimum(positions // N, page_table.shape[1] - 1)
        page = jnp.take_along_axis(page_table, column, axis=1)
        page = jnp.where(real, page, pages_plus_padding)  # past the pool: dropped
        offset = positions % N
    x = embed(weights, tokens, cfg, start=start)  # [R, C, E]
    written = []
    for i, layer in enumerate(weights["layers"]):
        attend = (
            _attend_paged(pool[i], page_table, page, offset, positions) if cfg.attention else None
        )
        x, new = block(layer, x, cfg, attend, dense=dense_out_in, start=start)
        written.append(new)
    last = jnp.maximum(count - 1, 0)[:, None, None]  # [R, 1, 1]
    x = jnp.take_along_axis(x, last, axis=1)  # [R, 1, E]: the rows' last real tokens
    logits = unembed(weights, x, dense=dense_out_in)[:, 0].astype(jnp.float32)  # [R, V]
    top2 = jax.lax.top_k(logits, 2)[0]
    next_token = sample(logits, seeds, out_index, temperature)
    return next_token, top2[:, 0] - top2[:, 1], written if cfg.attention else pool


# The columns of slot_step's one host array a row, after its page table's P.
START, COUNT, SLOT, SEED, OUT_INDEX, TEMPERATURE = range(6)


def pack_rows(table, start, count, slot, seed, out_index, temperature):
    """The rows' host inputs as one int32 array [R, P + 6] (one transfer a call, not
    seven: each costs the host tens of microseconds): the page table, then the
    columns above; the seed's and the temperature's bits reinterpreted as int32."""
    columns = [start, count, slot, np.asarray(seed, np.uint32).view(np.int32), out_index]
    columns.append(np.asarray(temperature, np.float32).view(np.int32))
    return np.concatenate([table, np.stack(columns, axis=1).astype(np.int32)], axis=1)


@functools.partial(jax.jit, static_argnames=("cfg", "from_last"), donate_argnames=("pool", "last"))
def slot_step(weights, pool, last, rows, tokens, cfg, from_last):
    """paged_step for an engine's slots, each slot's latest token kept on the device.

    last int [slots]: each slot's latest token; rows: pack_rows' int32 [R, P + 6];
    from_last: the rows' tokens [R, 1] are last[slot] (a decode: the host need not
    read the previous step's tokens to queue this one), else `tokens` [R, C] (a prefill
    chunk) -> (float32 [R, 2]: each row's next token and its top-2 gap, pool, last with
    each live row's token written)."""
    P = rows.shape[1] - 6
    table, column = rows[:, :P], rows[:, P:]
    slot, count = column[:, SLOT], column[:, COUNT]
    seed = jax.lax.bitcast_convert_type(column[:, SEED], jnp.uint32)
    temperature = jax.lax.bitcast_convert_type(column[:, TEMPERATURE], jnp.float32)
    if from_last:
        tokens = last[slot][:, None]
    args = (table, tokens, column[:, START], count, seed, column[:, OUT_INDEX], temperature)
    token, gap, pool = paged_step(weights, pool, *args, cfg)
    last = last.at[slot].set(jnp.where(count > 0, token, last[slot]))
    return jnp.stack([token.astype(jnp.float32), gap], axis=1), pool, last

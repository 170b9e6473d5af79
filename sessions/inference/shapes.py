"""Every array prefill and decode take, as jax.ShapeDtypeStruct with its sharding, unbuilt.

A program can be compiled, its memory planned and its collectives counted from
shapes alone: `jax.eval_shape` runs an initialiser on shapes and returns
ShapeDtypeStructs, each weight's rule (sessions/shard/sharding.py) adds where its
shards live, and nothing is allocated. The same shapes then serve three ways:
`jax.jit(init, out_shardings=...)` builds each shard on its own device, a
checkpoint restores into them, or a compiler for a chip this machine lacks
reads them (sessions/plan/). Every shape a decode or prefill program takes is
built here (the training state's and a batch's: sessions/train/step.py):

    abstract_weights        the params as a server keeps them, in the compute dtype
    abstract_decode_weights those weights as a decode step reads them, transposed
    abstract_int8_weights   those weights in int8 (sessions/model/quantize.py)
    abstract_prefill_inputs everything kv_cache.prefill takes
    abstract_decode_inputs  everything kv_cache.decode_steps takes
"""

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sessions.inference.kv_cache import init_cache
from sessions.inference.layout import out_in_order, out_in_spec, quantize_decode_weights
from sessions.model import quantize
from sessions.model.transformer import init_params
from sessions.shard import sharding


def abstract_weights(cfg, mesh):
    """The params as a server keeps them: ShapeDtypeStructs in the compute dtype
    (cast once, at load), each with its sharding rule over `mesh`."""
    key = jax.eval_shape(lambda: jax.random.key(0))  # an abstract key: no device is touched
    params = sharding.abstract_sharded(functools.partial(init_params, cfg), key, mesh)
    return jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape, cfg.dtype, sharding=w.sharding), params
    )


def abstract_decode_weights(abstract_params):
    """What decode_layout.decode_weights returns, from ShapeDtypeStructs carrying
    shardings: shapes and rules permuted alike."""

    def relayout(path, x):
        order = out_in_order(path, x.ndim)
        if order is None:
            return x
        shape = tuple(x.shape[i] for i in order)
        sharding_ = NamedSharding(x.sharding.mesh, out_in_spec(path, x, order))
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding_)

    return jax.tree_util.tree_map_with_path(relayout, abstract_params)


def abstract_int8_weights(weights):
    """What quantize_decode_weights returns, from abstract_decode_weights'
    ShapeDtypeStructs: each Int8's values split as their weight, its scales
    [*out] as the weight's output dims (the first: decode's layout is [*out, *in])."""

    def place(x, q):
        if not isinstance(q, quantize.Int8):
            return x
        spec = (*x.sharding.spec, *(None,) * x.ndim)[: q.scale.ndim]
        scale = NamedSharding(x.sharding.mesh, P(*spec))
        return quantize.Int8(
            jax.ShapeDtypeStruct(q.values.shape, q.values.dtype, sharding=x.sharding),
            jax.ShapeDtypeStruct(q.scale.shape, q.scale.dtype, sharding=scale),
        )

    return jax.tree.map(place, weights, jax.eval_shape(quantize_decode_weights, weights))


def abstract_prefill_inputs(cfg, batch, prompt_len, mesh):
    """(arguments, static keywords) of kv_cache.prefill for `batch` prompts of
    prompt_len tokens over `mesh`: the weights as a server keeps them, and the
    prompts [B, P] split by rows like every batch."""
    prompts = jax.ShapeDtypeStruct(
        (batch, prompt_len), np.int32, sharding=sharding.batch_sharding(mesh)
    )
    return (abstract_weights(cfg, mesh), prompts), {"cfg": cfg}


def abstract_decode_inputs(cfg, batch, mesh, int8_weights=False, int8_cache=False):
    """(arguments, static keywords) of kv_cache.decode_steps for `batch` sequences over
    `mesh`: ShapeDtypeStructs carrying their shardings, the weights and the cache
    in int8 where asked (sessions/model/quantize.py). The one place that knows
    decode's signature.

    The weights come as decode reads them, in the compute dtype, so nothing
    runs outside the loop: the program is one step, repeated. The cache's
    layout is kv_cache.init_cache's own, read off a small copy of that
    program compiled (zeros, never run: one row per group of devices and one
    position, so it fits whatever the batch), which lays out every batch and
    length alike. Tokens and logits are split by rows like every batch.
    Greedy: no random draw in the step."""
    rows = sharding.batch_sharding(mesh)
    small = rows.mesh.shape["data"] * rows.mesh.shape["fsdp"]
    with jax.set_mesh(mesh):
        make = jax.jit(init_cache, static_argnums=(0, 1, 2))
        small_cfg = dataclasses.replace(cfg, seq=1)
        layouts = make.lower(small_cfg, small, int8_cache).compile().output_shardings
    shapes = jax.eval_shape(functools.partial(init_cache, cfg, batch, int8_cache))
    cache = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, layouts
    )
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq), np.int32, sharding=rows)
    logits = jax.ShapeDtypeStruct((batch, cfg.vocab), np.float32, sharding=rows)
    start = n = jax.ShapeDtypeStruct((), np.int32)  # traced: one program for every length
    key = jax.eval_shape(lambda: jax.random.key(0))
    temperature = jax.ShapeDtypeStruct((), np.float32)
    weights = abstract_decode_weights(abstract_weights(cfg, mesh))
    weights = abstract_int8_weights(weights) if int8_weights else weights
    inputs = (weights, cache, tokens, logits, start, n, key, temperature)
    return inputs, {"cfg": cfg, "greedy": True}

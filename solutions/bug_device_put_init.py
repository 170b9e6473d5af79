"""Find the bug: parameters built on one device, then moved.

broken_init() gives correctly sharded parameters, so the training step
never notices. But it first builds every weight whole on one device and
only then cuts it up and copies the pieces out: the day the model does not
fit on one chip, it fails, and until then device 0 needs room for the
whole model and every byte crosses the interconnect once.

The tool: ask the initialiser where its outputs live.
jax.jit(init).lower(key).compile().output_shardings shows one device for
every weight; jax.profiler.device_memory_profile() shows device 0 full.
"""

import functools

import jax

from sessions.model import init_params
from sessions.shard.sharding import tree_shardings


def broken_init(cfg, key, mesh):
    """Parameters on the mesh with sessions/shard/sharding.py's rules, the slow way."""
    params = init_params(cfg, key)  # every weight, whole, on the default device
    shardings = tree_shardings(jax.eval_shape(lambda: params), mesh)
    return jax.device_put(params, shardings)  # then cut up and moved


def make_sharded_init(cfg, mesh):
    """An initialiser whose outputs are born sharded: key -> params.

    Return a jax.jit-ed function of the key alone, computing
    init_params(cfg, key), whose out_shardings are sessions/shard/sharding.py's
    rules for the mesh, so each device computes only its own shards.
    Hint: jax.eval_shape(functools.partial(init_params, cfg), key) gives the
    ShapeDtypeStructs; sessions.shard.sharding.tree_shardings(shapes, mesh) the
    NamedShardings; jax.jit(..., out_shardings=those).
    """
    init = functools.partial(init_params, cfg)
    shapes = jax.eval_shape(init, jax.random.key(0))  # jax.ShapeDtypeStructs: no memory
    return jax.jit(init, out_shardings=tree_shardings(shapes, mesh))

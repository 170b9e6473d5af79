"""Multichip: params born sharded on a mesh, and the FSDP napkin.

Describe first, then build: jax.eval_shape runs the initialiser on shapes
alone and returns jax.ShapeDtypeStructs; a partition rule per weight turns
each into a sharding; jax.jit(init, out_shardings=...) builds every shard on
the device that holds it. No device ever holds a whole weight.

FSDP (fully sharded data parallelism) splits the batch over the chips and
each weight along E; before a layer runs, its weights are all-gathered, and
after its backward pass the weight gradients are reduce-scattered. A chip
can fetch the next layer's weights while it computes this one, so the
communication is hidden when a layer's compute takes longer than it.
"""

import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sessions.model import init_params


def param_shapes(cfg):
    """The param tree of sessions.model.transformer.init_params(cfg, key) as jax.ShapeDtypeStructs.

    Nothing is allocated: jax.eval_shape traces the initialiser with shapes.
    Hint: jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0)).
    """
    raise NotImplementedError


def param_specs(shapes):
    """A PartitionSpec for every weight: a tree shaped like `shapes`.

    For a mesh with axes "fsdp" and "tp" (and "data", which splits only the
    batch): every matmul weight is split over both, E over "fsdp" and heads,
    F or V over "tp"; pos only along E; the [E] norm scales are replicated.
    Weights: embed [V, E], pos [S, E], wq wk wv [E, H, D], wo [H, D, E],
    w_in [E, F], w_out [F, E], attn_norm mlp_norm final_norm [E].
    Hint: jax.tree_util.tree_map_with_path(fn, shapes); a path's last
    jax.tree_util.DictKey holds the weight's name (path[-1].key).
    """
    raise NotImplementedError


def init_sharded(cfg, key, mesh):
    """sessions.model.transformer.init_params(cfg, key), each weight built directly in shards.

    mesh: a jax.sharding.Mesh with axes "fsdp" and "tp" (e.g.
    sessions.shard.sharding.make_mesh({"data": 1, "fsdp": 2, "tp": 4})). Returns
    the param tree whose arrays carry NamedSharding(mesh, spec) with the
    specs of param_specs(param_shapes(cfg)).
    Hint: jax.jit(functools.partial(init_params, cfg), out_shardings=tree of
    NamedSharding)(key); jax.tree.map over the specs builds that tree (a
    PartitionSpec is a tuple, so tell tree.map it is a leaf:
    is_leaf=lambda x: isinstance(x, P)).
    """
    raise NotImplementedError


def fsdp_flops_per_chip(layer_params, tokens, chips):
    """Training FLOPs one chip does for one layer in one step, under FSDP.

    The batch of `tokens` tokens is split over `chips`; each chip runs the
    whole layer (its weights all-gathered) on its share:
    6 * (tokens / chips) * layer_params.
    """
    raise NotImplementedError


def fsdp_bytes_per_chip(layer_params, chips, bytes_per_param=2):
    """Bytes one chip receives over the interconnect for one layer in one step.

    All-gather the weights for the forward pass, again for the backward
    pass, and reduce-scatter the gradients: three collectives, in each of
    which a chip receives the (chips - 1) / chips of the layer it lacks:
    3 * layer_params * bytes_per_param * (chips - 1) / chips.
    """
    raise NotImplementedError


def fsdp_comm_hidden(layer_params, tokens, chips, peak_flops, ici_bandwidth, bytes_per_param=2):
    """True when a layer's compute takes at least as long as its communication.

    compute_s = fsdp_flops_per_chip / peak_flops;
    comm_s = fsdp_bytes_per_chip / ici_bandwidth (bytes/s a chip receives).
    Then fetching the next layer's weights during this layer hides it all.
    Working it out: hidden when tokens / chips >= peak_flops * bytes_per_param
    * (chips - 1) / chips / (2 * ici_bandwidth): a batch per chip of some
    hundreds of tokens on a TPU, whatever the model's size.
    """
    raise NotImplementedError

"""The weights as a decode step reads them (sessions/inference/kv_cache.py).

Each matmul weight is stored transposed, [out, in], as torch.nn.Linear keeps its own, and
multiplied as weight @ tokens^T (dense_out_in). A decode step is a chain of
matrix-vector products, and XLA's CPU backend streams a matrix fastest when
each output is the dot of one contiguous row with the vector: GPT-2's 24 MLP
matrices at batch 1 take 9.4 ms [out, in] against 11.0 ms [in, out], the
training layout, on this course's 2-core machine. The copy is made once per
generate(), not per token; on GPU and TPU the layout makes no difference.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from sessions.model.quantize import Int8, quantize_weight
from sessions.model.transformer import cast
from sessions.shard import sharding

# How many leading dims of each matmul weight are its inputs (transformer.dense's n_in).
INPUT_DIMS = {
    "wq": 1,
    "wk": 1,
    "wv": 1,
    "wo": 2,
    "w_in": 1,
    "w_gate": 1,
    "w_out": 1,
    "unembed": 1,
}


def out_in_order(path, ndim):
    """The permutation that puts a weight's output dims before its input dims
    ([E, H, D] -> [H, D, E]), found by its name at the end of `path`; None for
    a leaf decode reads as stored (norm scales, the embedding, the positions)."""
    n_in = INPUT_DIMS.get(path[-1].key)
    return None if n_in is None else (*range(n_in, ndim), *range(n_in))


def out_in_spec(path, leaf, order):
    """The weight's partition rule (sessions/shard/sharding.py), its dims permuted alike."""
    spec = sharding.spec_for(path, leaf)
    return P(*(spec[i] for i in order))


@functools.partial(jax.jit, static_argnames="cfg")
def decode_weights(params, cfg):
    """The params as a decode step reads them: in the compute dtype, each
    matmul weight transposed to [*out, *in] (wq [E, H, D] -> [H, D, E], wo
    [H, D, E] -> [E, H, D], w_in [E, F] -> [F, E], an untied unembed [E, V] ->
    [V, E], ...), split over a mesh by its own rule, permuted. The tied
    embedding [V, E] is [out, in] already."""

    def relayout(path, w):
        order = out_in_order(path, w.ndim)
        if order is None:
            return w
        w = jnp.transpose(w, order)
        if jax.sharding.get_abstract_mesh().empty:
            return w
        return jax.lax.with_sharding_constraint(w, out_in_spec(path, w, order))

    return jax.tree_util.tree_map_with_path(relayout, cast(params, cfg))


def dense_out_in(x, w, n_in=1):
    """transformer.dense for a weight stored [*out, *in] (decode_weights): x [B, S, *in]
    -> [B, S, *out], as one product with the weight on the left and the tokens
    as its columns, [out, in] @ [in, B·S], transposed back (a few KB).

    That order matters on a CPU. With the weight on the left, XLA's CPU backend
    reads it once, row by row, whatever the batch; as x @ w^T, 2 to 8 rows cost
    it about twice one row's time (GPT-2's MLP weights at batch 4: 11.8 ms
    against 18.4 ms). Its simplifier rewrites the one into the other, so the
    product is held as computed behind an optimization barrier.

    An int8 weight (sessions/model/quantize.py) is multiplied in the compute dtype,
    its values converted where the dot reads them (exactly: they are integers
    of 7 bits), and each output channel's scale then multiplies its row of the
    product, in float32."""
    scale = w.scale if isinstance(w, Int8) else None
    w = w if scale is None else w.values.astype(x.dtype)
    B, S = x.shape[:2]
    out_shape, in_shape = w.shape[: w.ndim - n_in], w.shape[w.ndim - n_in :]
    x2 = x.reshape(B * S, math.prod(in_shape))
    w2 = w.reshape(math.prod(out_shape), math.prod(in_shape))
    y = jax.lax.optimization_barrier(w2 @ x2.T)  # [out, B·S]
    if scale is not None:
        y = (y * scale.reshape(-1, 1)).astype(y.dtype)
    return y.T.reshape(B, S, *out_shape)


@jax.jit
def quantize_decode_weights(weights):
    """decode_weights(params, cfg) with every matmul weight (INPUT_DIMS) and the
    embedding [V, E] as Int8 (sessions/model/quantize.py); the norm scales and the
    positional table as they were (a few KB, read a row at a time)."""

    def convert(path, w):
        name = path[-1].key
        if name == "embed":
            return quantize_weight(w, 1)
        return quantize_weight(w, INPUT_DIMS[name]) if name in INPUT_DIMS else w

    return jax.tree_util.tree_map_with_path(convert, weights)

"""Session 4: FSDP and a collective matmul, their collectives written by hand.

Under `jax.jit` with sharded inputs the partitioner decides every collective.
Under `jax.shard_map` the function body sees one device's shards and says its
collectives itself: `jax.lax.all_gather` to assemble a weight, `ppermute` to
pass a shard to a neighbour, `psum_scatter` to sum gradients and keep one's
own share. The mesh here has one axis, "fsdp", of N devices; x [B, E] has its
rows split over it and the weight w [E, F] its E rows (FSDP's layout: device
i holds x_i [B/N, E] and w_i [E/N, F]).

The plain way gathers all of w, then multiplies: the matmul units wait while
the bytes move. The collective matmul splits the product by shards of E,

    x_i @ w = Σ_j x_i[:, E-block j] @ w_j

and passes the shards around the ring one hop a step, multiplying the shard
in hand while the next one travels: the transfer hides behind the math.
(sessions/train/manual_fsdp.py and sessions/shard/collective_matmul.py are the full versions.)
"""

import jax
from jax.sharding import PartitionSpec as P


def fsdp_dense(x, w, mesh):
    """x @ w in FSDP's layout, its all-gather written by hand: float32 [B, F].

    x [B, E], rows split over mesh axis "fsdp"; w [E, F], E split over "fsdp".
    Under jax.shard_map(mesh=mesh, in_specs=(P("fsdp", None), P("fsdp", None)),
    out_specs=P("fsdp", None)), each device gathers the whole w with
    jax.lax.all_gather(w, "fsdp", tiled=True) and multiplies its own rows.
    Its gradient with respect to w comes back as w is split, each device's
    share summed over every device's rows: the transpose of an all-gather is
    a reduce-scatter (psum_scatter), and autodiff writes it for you.
    """
    raise NotImplementedError


def ring_matmul(x, w, mesh):
    """The same x @ w without an all-gather: float32 [B, F]. The shards of w
    go round the ring of "fsdp" devices by jax.lax.ppermute, one hop a step,
    and each device multiplies the shard in hand while the next is on its way.

    Inside shard_map (specs as in fsdp_dense) device i holds x_i [B/N, E] and
    w_i [E/N, F]. At step s = 0 ... N - 1 the shard in hand is w_j with
    j = (i + s) mod N: add x_i[:, j·E/N : (j + 1)·E/N] @ it, then pass it on,
    each device sending to the one before it (perm [(d, (d - 1) mod N)]), so
    that it receives w_(j+1). N - 1 permutes in all: the last shard stays.
    Hint: i = jax.lax.axis_index("fsdp"); N = mesh.shape["fsdp"];
    jax.lax.dynamic_slice_in_dim(x_i, j * (E // N), E // N, axis=1).
    """
    raise NotImplementedError

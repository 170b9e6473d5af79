"""Multichip: a device mesh, one partition rule per weight, and parameters
that are born sharded.

The anti-pattern is to build every weight on one chip and then move it: it
works until the day the model no longer fits on one chip. Instead we describe
the computation first. `jax.eval_shape` runs the initialiser on shapes only and
returns `jax.ShapeDtypeStruct`s; the rules below turn each shape into a
sharding (sessions/inference/shapes.py builds every such shape a program takes);
`jax.jit(init, out_shardings=...)` then builds every shard on the device that
holds it, and no device ever sees a whole weight.

Mesh axes:
    data  batch split, weights replicated (plain data parallelism)
    fsdp  batch split AND weights split along E; each layer's weights are
          all-gathered just before use (fully sharded data parallelism)
    tp    heads, F and V split (tensor parallelism, Megatron style)

Which chip sits where in the mesh, on a TPU slice's torus or across slices,
is sessions/shard/topology.py's concern.
"""

import math

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sessions.errors import UsageError
from sessions.shard.topology import AXES, device_grid

BATCH = ("data", "fsdp")  # the batch dimension is split over both

# The partition rules, one line per weight: which mesh axis splits each dimension.
PARAM_SPECS = {
    "embed": P("tp", "fsdp"),  # [V, E], also the tied output projection
    "unembed": P("fsdp", "tp"),  # [E, V], the untied output projection: embed's transposed
    "pos": P(None, "fsdp"),  # [S, E]
    "wq": P("fsdp", "tp", None),  # [E, H, D]
    "wk": P("fsdp", "tp", None),  # [E, K, D]: the K heads split over tp like the H
    "wv": P("fsdp", "tp", None),  # [E, K, D]
    "wo": P("tp", None, "fsdp"),  # [H, D, E]
    "w_in": P("fsdp", "tp"),  # [E, F]
    "w_gate": P("fsdp", "tp"),  # [E, F], the gated MLP's second input matrix
    "w_out": P("tp", "fsdp"),  # [F, E]
    "attn_norm": P(None),  # [E], a few KB: replicate
    "mlp_norm": P(None),  # [E]
    "final_norm": P(None),  # [E]
}

# Activations, named by their einsum letters. Pinning them keeps XLA from
# guessing a layout that would need an extra collective.
ACTIVATION_SPECS = {
    "BS": P(BATCH, None),  # tokens
    "BSE": P(BATCH, None, None),  # the residual stream
    "BSHD": P(BATCH, None, "tp", None),  # queries (keys and values when K = H)
    # Keys and values, K heads; split over tp like the queries' H, so that the G query
    # heads that read a KV head sit on its device (H/tp = G·K/tp heads each).
    "BSKD": P(BATCH, None, "tp", None),
    "BSF": P(BATCH, None, "tp"),  # the MLP's hidden layer
    "BSV": P(BATCH, None, "tp"),  # logits
    # The KV cache, one layer: values [B, K, T, D], keys stored transposed [B, K, D, T]
    # (sessions/inference/kv_cache.py says why); split like the keys and values themselves.
    "BKTD": P(BATCH, "tp", None, None),
    "BKDT": P(BATCH, "tp", None, None),
    "BKT": P(BATCH, "tp", None),  # an int8 cache's scales, one per position (quantize.py)
}

# Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in
# Large Transformer Models", section 4.2.2): between the blocks, where tp would hold the
# residual stream whole on every chip, each chip holds S/tp of its positions instead.
# The norms and the residual adds act on each position alone, so they run on the slice.
# Inside attention and the MLP the heads and F stay split over tp (ACTIVATION_SPECS), so
# the partitioner turns each block's all-reduce of [B, S, E] into a reduce-scatter onto
# the slices and an all-gather before the next block's matmuls: the same bytes on the
# wires, and the stream, the norms' inputs and whatever is saved of them held 1/tp each.
# MaxText pins the same tensors, ("activation_batch", "activation_norm_length",
# "activation_embed"), and its rules may put that length on a tensor axis.
SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, "tp", None)}


def constrain(x, letters, sequence_parallel=False):
    """Pin activation x to the layout named by its letters, e.g. "BSE"; the residual
    stream "BSE" split along S over tp under sequence_parallel (SEQUENCE_PARALLEL_SPECS).

    A no-op outside a mesh context (`jax.set_mesh`), so the model runs
    unchanged on one device, and inside `jax.shard_map` (sessions/train/manual_fsdp.py),
    where each device's arrays are its own and there is nothing to place."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.are_all_axes_manual:
        return x
    specs = SEQUENCE_PARALLEL_SPECS if sequence_parallel else {}
    return jax.lax.with_sharding_constraint(x, specs.get(letters, ACTIVATION_SPECS[letters]))


def parse_mesh(text, n_devices):
    """'fsdp=4,tp=2' -> {'data': 1, 'fsdp': 4, 'tp': 2}. None: every device on fsdp."""
    if not text:
        return {"data": 1, "fsdp": n_devices, "tp": 1}
    sizes = dict.fromkeys(AXES, 1)
    for item in text.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in AXES:
            raise UsageError(f"mesh '{text}': unknown axis '{name}' (axes are {', '.join(AXES)})")
        if not value.strip().isdigit() or int(value) < 1:
            raise UsageError(f"mesh '{text}': '{item}' needs a positive size, e.g. {name}=2")
        sizes[name] = int(value)
    if math.prod(sizes.values()) != n_devices:
        shown = " x ".join(f"{a}={n}" for a, n in sizes.items())
        raise UsageError(
            f"mesh '{text}': {shown} = {math.prod(sizes.values())} devices, "
            f"but {n_devices} are present"
        )
    return sizes


def make_mesh(sizes, devices=None):
    """A mesh over the first data x fsdp x tp devices (all of jax.devices() by
    default), axes in the order data, fsdp, tp, laid over the chips' wires by
    sessions/shard/topology.py. Every axis Auto: the partitioner places what we leave
    unconstrained."""
    devices = list(np.asarray(jax.devices() if devices is None else devices).flat)
    devices = devices[: math.prod(sizes[a] for a in AXES)]  # as jax.make_mesh takes them
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.sharding.Mesh(device_grid(sizes, devices), AXES, axis_types=auto)


def check_divisible(model_cfg, batch, sizes, processes=1):
    """Every split dimension must divide evenly; say which one does not."""
    n_batch = sizes["data"] * sizes["fsdp"]
    checks = [
        ("batch", batch, n_batch, "data x fsdp"),
        ("batch", batch, processes, "the process count"),
        ("heads", model_cfg.heads, sizes["tp"], "tp"),
        ("kv_heads", model_cfg.n_kv_heads, sizes["tp"], "tp"),
        ("ff", model_cfg.ff, sizes["tp"], "tp"),
        ("vocab", model_cfg.vocab, sizes["tp"], "tp"),
        ("embed", model_cfg.embed, sizes["fsdp"], "fsdp"),
    ]
    tp = sizes["tp"]
    if model_cfg.sequence_parallel and tp == 1:
        raise UsageError("--sequence-parallel shards the sequence over tp: give a mesh with tp > 1")
    if model_cfg.sequence_parallel and model_cfg.seq % tp:
        raise UsageError(f"--sequence-parallel: seq {model_cfg.seq} does not divide over tp = {tp}")
    for field, value, parts, axes in checks:
        if value % parts:
            raise UsageError(f"{field} {value} does not divide over {axes} = {parts}")


def spec_for(path, leaf):
    """The PartitionSpec of one leaf of the train state, found by its weight name.

    Works for the optimizer state too: Adam's moments `mu` and `nu` mirror the
    param tree, so their paths end in the same weight names and each moment is
    sharded exactly like its parameter."""
    if leaf.ndim == 0:
        return P()  # step counters
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return PARAM_SPECS[names[-1]]


def tree_shardings(shapes, mesh):
    """ShapeDtypeStructs -> NamedShardings, by the rules above."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, spec_for(path, leaf)), shapes
    )


def init_sharded(init_fn, key, mesh):
    """Run init_fn(key) so that each device builds only its own shards.

    Returns (tree, shardings)."""
    shapes = jax.eval_shape(init_fn, key)  # shapes and dtypes only: no memory used
    shardings = tree_shardings(shapes, mesh)
    return jax.jit(init_fn, out_shardings=shardings)(key), shardings


def batch_sharding(mesh):
    """Token batches [B, S]: rows split over data x fsdp."""
    return NamedSharding(mesh, ACTIVATION_SPECS["BS"])


def describe(params, shardings, mesh):
    """Lines of text: each weight's global shape, rule and per-device shard shape."""
    mesh_text = ", ".join(f"{a}={n}" for a, n in mesh.shape.items())
    lines = [f"mesh: {mesh_text} ({mesh.size} devices)"]
    lines.append(f"  {'weight':<22} {'global':>16} {'rule':<24} {'per device':>16}")
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_shardings = jax.tree.leaves(shardings)
    for (path, leaf), sharding in zip(flat, flat_shardings):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        shard = sharding.shard_shape(leaf.shape)
        lines.append(f"  {name:<22} {leaf.shape!s:>16} {sharding.spec!s:<24} {shard!s:>16}")
    return lines


def bytes_per_device(tree, shardings):
    """(bytes one device holds, bytes of the whole tree)."""
    leaves = jax.tree.leaves(tree)
    per_device = sum(
        math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for x, s in zip(leaves, jax.tree.leaves(shardings))
    )
    total = sum(x.size * np.dtype(x.dtype).itemsize for x in leaves)
    return per_device, total


def process_rows(sharding, batch, seq, process=None):
    """int [rows]: the rows of the global [B, S] batch that this process's
    devices hold, in the order jax.make_array_from_process_local_data reads
    them from its local data: each distinct block once, by where it starts.

    With one process that is every row. On a pod the blocks are scattered: a
    TPU mesh orders devices by the torus, so host 0 of a v5e-16 holds blocks
    0, 1, 6 and 15 of 16 under fsdp=16. Each process loads exactly these rows,
    and no host ever builds the whole batch."""
    process = jax.process_index() if process is None else process
    index = sharding.devices_indices_map((batch, seq))
    blocks = {
        (rows.start or 0, batch if rows.stop is None else rows.stop)
        for device, (rows, _) in index.items()
        if device.process_index == process
    }
    return np.concatenate([np.arange(start, stop) for start, stop in sorted(blocks)])


def rows_line(batch_sharding, batch, seq):
    """One header line of a multi-process run: the blocks of the batch this
    process loads (scattered on a pod, where the mesh follows the torus)."""
    n_blocks = math.prod(batch_sharding.mesh.shape[a] for a in BATCH)
    rows = process_rows(batch_sharding, batch, seq)
    blocks = sorted({int(r) * n_blocks // batch for r in rows})
    return (
        f"batch rows: process {jax.process_index()} of {jax.process_count()} loads "
        f"{len(rows)} of {batch}, blocks {', '.join(map(str, blocks))} of {n_blocks}"
    )


def place_batch(batch, sharding):
    """Host arrays -> global device arrays with the batch sharding.

    One process: device_put splits the rows over the devices. Several: each
    process holds only its own rows, and JAX assembles the global array."""
    if jax.process_count() == 1:
        return jax.device_put(batch, sharding)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def abstract_sharded(init_fn, key, mesh):
    """What init_fn(key) would build, without building it: a tree of
    jax.ShapeDtypeStruct, each carrying the sharding its rule gives."""
    shapes = jax.eval_shape(init_fn, key)  # shapes and dtypes only: no memory used
    shardings = tree_shardings(shapes, mesh)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )


def held_bytes(tree):
    """Bytes of a tree of sharded ShapeDtypeStructs that one device holds."""
    return bytes_per_device(tree, jax.tree.map(lambda x: x.sharding, tree))[0]

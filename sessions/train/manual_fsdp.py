"""FSDP written by hand: the train step under `jax.shard_map`, every collective
in the source (`--collectives manual`; `auto` leaves them to the partitioner).

Each device holds 1/fsdp of every weight matrix (split along E, as
sessions/shard/sharding.py's rules say) and its own rows of the batch. One step, per device:

    forward    all-gather each layer's weights over fsdp just before the layer uses them
    backward   all-gather them again (they were not kept), then the weight gradients
               reduce-scattered over fsdp: each device gets the sum for its own shard
    then       all-reduce (mean) every gradient and the loss over data
    update     AdamW on the local shards, exactly as on whole weights: it is elementwise

The backward's reduce-scatter is never written: it is the transpose of the forward's
all-gather, and JAX's autodiff writes it (`jax.lax.all_gather`'s transpose is
`jax.lax.psum_scatter`). Gathering E copies shards to every device; the
gradient of that copy sums what every device computed back onto the shard's owner.

Kept or gathered again? Gathered again: each layer runs under `jax.checkpoint` keeping
only its matmuls' outputs (`dots_saveable`), so the backward all-gathers its weights a
second time and redoes the layer's few elementwise ops (norms, ReLU, softmax), never a
matmul. (JAX 0.10.2's CPU compiler then merges each second gather with the first, the
same instruction on the same shard, and keeps the weights after all; JAX 0.12's, like
a TPU's, keeps them apart.)
Keeping them would hold every layer's whole weights on every device from forward to
backward, fsdp times their shards, the memory FSDP exists to save. The embedding and
positions are gathered once and kept, as they are used at both ends of the model:
(V + S)·E values per device.

Only meshes with tp=1: with tp > 1 the shards of a weight would also be split over
heads, F and V, a different program (left to the partitioner, `--collectives auto`).

Session 4 checks it against the partitioner (`train_both_ways`): the same steps trained
twice, from the same state on the same batches, once with each step's collectives.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from sessions.errors import UsageError
from sessions.model.attention import attention
from sessions.model.config import PRESETS
from sessions.model.transformer import block, cast, embed, float32_tables
from sessions.shard import sharding
from sessions.shard.sharding import BATCH, PARAM_SPECS
from sessions.train import data
from sessions.train.chunked_loss import chunked_cross_entropy
from sessions.train.step import init_state, jit_step, make_optimizer, make_train_step

# What a layer keeps for its backward: its matmuls' outputs, never its gathered weights.
REGATHER = jax.checkpoint_policies.dots_saveable


def check_collectives(mode, sizes):
    """--collectives manual runs on data x fsdp meshes only; say so on one line."""
    if mode == "manual" and sizes["tp"] > 1:
        raise UsageError(
            f"--collectives manual supports meshes over data and fsdp only (tp=1), "
            f"not tp={sizes['tp']}; use --collectives auto for tensor parallelism"
        )


def collectives_line(mode):
    """The header's line on who wrote the step's collectives."""
    if mode == "manual":
        return (
            "collectives: manual (jax.shard_map: all-gather over fsdp, reduce-scatter back, "
            "all-reduce over data; sessions/train/manual_fsdp.py)"
        )
    return "collectives: auto (inserted by XLA's partitioner from the sharding rules)"


def fsdp_dim(name):
    """The dimension of weight `name` that fsdp splits (sessions/shard/sharding.py), or None."""
    spec = tuple(PARAM_SPECS[name])
    return spec.index("fsdp") if "fsdp" in spec else None


def gather_weights(weights):
    """{name: local shard} -> {name: whole weight}: one all-gather over fsdp per split weight."""
    whole = {}
    for name, w in weights.items():
        dim = fsdp_dim(name)
        if dim is not None:
            w = jax.lax.all_gather(w, "fsdp", axis=dim, tiled=True)
        whole[name] = w
    return whole


def device_loss(params, batch, cfg):
    """This device's loss: the mean over its own rows, from its shards of the params."""
    p = cast(params, cfg)  # cast the shards, then gather: bfloat16 halves the bytes sent

    def causal(q, k, v):
        return attention(q, k, v, impl=cfg.attention_impl), None

    @functools.partial(jax.checkpoint, policy=REGATHER)
    def layer(shards, x):
        return block(gather_weights(shards), x, cfg, causal)[0]

    # The ends are gathered as stored, float32 or bfloat16, and looked up as float32: the
    # embedding's lookup must sum its gradient in float32 (sessions/model/transformer.py,
    # embed); the output projection then reads them cast.
    ends = gather_weights({name: w for name, w in params.items() if name != "layers"})
    x = embed(float32_tables(ends), batch["inputs"], cfg)
    for shards in p["layers"]:
        x = layer(shards, x)
    return chunked_cross_entropy(cast(ends, cfg), x, batch["targets"], cfg.loss_chunks)


def is_split(path):
    """Whether the weight at `path` (in the params or their gradients) is split over fsdp."""
    return fsdp_dim(path[-1].key) is not None


def global_norm(grads):
    """The norm of the whole gradient: each device squares its own shards, a psum over
    fsdp adds the shards up; replicated vectors (norm scales) are counted once."""
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    split = sum(jnp.sum(g * g) for path, g in flat if is_split(path))
    whole = sum(jnp.sum(g * g) for path, g in flat if not is_split(path))
    return jnp.sqrt(jax.lax.psum(split, "fsdp") + whole)


def device_step(state, batch, *, cfg, optimizer, clip):
    """One step, as one device runs it on its shards and rows. Returns (new state,
    {"loss", "grad_norm"}), the same as sessions.train.step.train_step."""
    params = state["params"]
    n_fsdp = jax.lax.axis_size("fsdp")
    # The backward is the transpose of the forward: of each all-gather, a reduce-scatter
    # (jax.lax.psum_scatter) over fsdp that sums the group's gradients onto each shard's
    # owner. Dividing the loss by the group's size first makes that sum the group's mean.
    loss, grads = jax.value_and_grad(lambda p: device_loss(p, batch, cfg) / n_fsdp)(params)
    # Replicated vectors got no reduce-scatter: their sum over fsdp is an all-reduce.
    grads = jax.tree_util.tree_map_with_path(
        lambda path, g: g if is_split(path) else jax.lax.psum(g, "fsdp"), grads
    )
    loss = jax.lax.psum(loss, "fsdp")
    # Data parallelism: every data replica computed the same shards' gradients on other rows.
    if jax.lax.axis_size("data") > 1:
        loss, grads = jax.lax.pmean((loss, grads), "data")

    # Clip by the global norm, as the optimizer's own clip (optax.clip_by_global_norm) would
    # on whole gradients; on shards it would see only a part of the norm. Its own clip then
    # sees a norm within tc.clip and leaves the gradients as they are.
    norm = global_norm(grads)
    grads = jax.tree.map(lambda g: jax.lax.select(norm < clip, g, g / norm * clip), grads)
    updates, opt = optimizer.update(grads, state["opt"], params)
    params = optax.apply_updates(params, updates)
    return {"params": params, "opt": opt}, {"loss": loss, "grad_norm": norm}


def make_manual_step(cfg, optimizer, clip, state_shardings, batch_sharding, *, jit=True, accum=1):
    """The step the loop calls, as sessions.train.step.make_train_step makes it (jitted, the
    state donated), with every collective in device_step: shard_map hands each device
    its shards and rows, by the same rules. clip: the optimizer's (TrainConfig.clip)."""
    if accum > 1:
        raise UsageError("--accum: the hand-written step takes one batch (--collectives auto)")
    mesh = batch_sharding.mesh
    specs = jax.tree.map(lambda s: s.spec, state_shardings)
    rows = {"inputs": P(BATCH, None), "targets": P(BATCH, None)}
    step = functools.partial(device_step, cfg=cfg, optimizer=optimizer, clip=clip)
    # check_vma=False: JAX would otherwise add the data all-reduce and the norms' psum
    # itself (the transpose of using a replicated weight on varying rows); here they are written.
    step = jax.shard_map(
        step, mesh=mesh, in_specs=(specs, rows), out_specs=(specs, P()), check_vma=False
    )
    return jit_step(step, state_shardings, batch_sharding) if jit else step


def train_both_ways(mesh_text, steps, devices, preset="tiny"):
    """{"auto" | "manual": (losses, compiled step)}: the same `steps` steps of
    `preset` over `mesh_text` on `devices`, from the same initial state and
    batches, once with the partitioner's collectives and once with ours."""
    cfg, tc = PRESETS[preset].model, PRESETS[preset].train
    optimizer = make_optimizer(tc, steps)
    tokens = data.split(data.default_corpus(), cfg.seq)[0]
    mesh = sharding.make_mesh(sharding.parse_mesh(mesh_text, len(devices)), devices)
    runs = {}
    with jax.set_mesh(mesh):
        rows = sharding.batch_sharding(mesh)
        init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
        for mode in ("auto", "manual"):
            state, shardings = sharding.init_sharded(init, jax.random.key(tc.seed), mesh)
            if mode == "manual":
                step = make_manual_step(cfg, optimizer, tc.clip, shardings, rows)
            else:
                step = make_train_step(
                    cfg, optimizer, state_shardings=shardings, batch_sharding=rows
                )
            batches = [
                sharding.place_batch(
                    data.get_batch(tokens, i, batch=tc.batch, seq=cfg.seq, seed=tc.seed), rows
                )
                for i in range(steps)
            ]
            compiled = step.lower(state, batches[0]).compile()
            losses = []
            for batch in batches:
                state, metrics = compiled(state, batch)
                losses.append(float(metrics["loss"]))
            runs[mode] = (losses, compiled)
    return runs

"""Multichip on 8 simulated CPU devices: params born sharded by the rules,
and sharded training equal to single-device training."""

import dataclasses
import functools
import json
import math

import jax
import numpy as np
import pytest
from helpers import TINY_STEPS, run_python
from jax.sharding import NamedSharding

from sessions.model.config import PRESETS
from sessions.shard import sharding
from sessions.train import data
from sessions.train.step import init_state, make_optimizer, make_train_step

PRESET = PRESETS["tiny"]
CFG = PRESET.model
TC = dataclasses.replace(PRESET.train, steps=TINY_STEPS)  # the suite's: one compiled step
OPTIMIZER = make_optimizer(TC, TC.steps)
TRAIN = data.split(data.default_corpus(), CFG.seq)[0]
MESHES = ["data=8", "fsdp=8", "fsdp=4,tp=2", "data=2,fsdp=2,tp=2"]


def train_steps(mesh_text, n_devices):
    sizes = sharding.parse_mesh(mesh_text, n_devices)
    mesh = sharding.make_mesh(sizes, devices=jax.devices()[:n_devices])
    with jax.set_mesh(mesh):
        init = functools.partial(init_state, cfg=CFG, optimizer=OPTIMIZER)
        state, shardings = sharding.init_sharded(init, jax.random.key(TC.seed), mesh)
        batch_sharding = sharding.batch_sharding(mesh)
        step = make_train_step(
            CFG, OPTIMIZER, state_shardings=shardings, batch_sharding=batch_sharding
        )
        # Keep the initial state: the step donates its input.
        initial = jax.tree.map(lambda x: x.copy(), state)
        losses = []
        for i in range(TC.steps):
            batch = data.get_batch(TRAIN, i, batch=TC.batch, seq=CFG.seq, seed=TC.seed)
            state, metrics = step(state, sharding.place_batch(batch, batch_sharding))
            losses.append(float(metrics["loss"]))
    return {
        "losses": losses,
        "initial": initial,
        "shardings": shardings,
        "sizes": sizes,
        "mesh": mesh,
    }


@pytest.fixture(scope="module")
def single():
    return train_steps(None, 1)


@pytest.fixture(scope="module", params=MESHES)
def sharded(request):
    return request.param, train_steps(request.param, 8)


def test_sharded_losses_equal_single_device_losses(single, sharded):
    mesh_text, run = sharded
    np.testing.assert_allclose(run["losses"], single["losses"], rtol=1e-4, err_msg=mesh_text)


def expected_shard_shape(shape, spec, sizes):
    """What a rule implies, computed here by hand: each dimension divided by
    the product of the mesh axes that split it."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        out.append(dim // math.prod(sizes[a] for a in axes))
    return tuple(out)


def weights(tree):
    """(weight name, leaf) for every leaf of the params or an optimizer moment."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        if leaf.ndim:
            yield names[-1], leaf


def test_every_shard_has_the_shape_its_rule_implies(sharded):
    mesh_text, run = sharded
    checked = 0
    for name, leaf in weights(run["initial"]):
        expected = expected_shard_shape(leaf.shape, sharding.PARAM_SPECS[name], run["sizes"])
        assert len(leaf.addressable_shards) == 8
        for shard in leaf.addressable_shards:
            assert shard.data.shape == expected, (mesh_text, name)
        checked += 1
    # params, Adam's mu and nu: three copies of every weight
    assert checked == 3 * len(list(weights(run["initial"]["params"])))


# The layout, worked out by hand for the tiny preset (V=256, S=64, E=48, F=96,
# H=4, D=12), independently of PARAM_SPECS: per weight, the shape each device
# holds and how many different shards there are (the rest are replicas).
# Intended: fsdp splits E, tp splits V, H and F, data splits no weight.
NORM = ((48,), 1)
LAYOUT = {
    "data=8": {
        "embed": ((256, 48), 1),
        "pos": ((64, 48), 1),
        "wq": ((48, 4, 12), 1),
        "wo": ((4, 12, 48), 1),
        "w_in": ((48, 96), 1),
        "w_out": ((96, 48), 1),
    },
    "fsdp=8": {
        "embed": ((256, 6), 8),
        "pos": ((64, 6), 8),
        "wq": ((6, 4, 12), 8),
        "wo": ((4, 12, 6), 8),
        "w_in": ((6, 96), 8),
        "w_out": ((96, 6), 8),
    },
    "fsdp=4,tp=2": {
        "embed": ((128, 12), 8),
        "pos": ((64, 12), 4),
        "wq": ((12, 2, 12), 8),
        "wo": ((2, 12, 12), 8),
        "w_in": ((12, 48), 8),
        "w_out": ((48, 12), 8),
    },
    "data=2,fsdp=2,tp=2": {
        "embed": ((128, 24), 4),
        "pos": ((64, 24), 2),
        "wq": ((24, 2, 12), 4),
        "wo": ((2, 12, 24), 4),
        "w_in": ((24, 48), 4),
        "w_out": ((48, 24), 4),
    },
}
for layout in LAYOUT.values():
    layout.update(wk=layout["wq"], wv=layout["wq"], attn_norm=NORM, mlp_norm=NORM, final_norm=NORM)


def test_the_layout_by_hand(sharded):
    """Each weight, and Adam's two moments of it, laid out as worked out above."""
    mesh_text, run = sharded
    seen = set()
    for name, leaf in weights(run["initial"]):
        shape, distinct = LAYOUT[mesh_text][name]
        shards = leaf.addressable_shards
        assert [s.data.shape for s in shards] == [shape] * 8, (mesh_text, name)
        indices = {tuple((i.start, i.stop) for i in s.index) for s in shards}
        assert len(indices) == distinct, (mesh_text, name)
        seen.add(name)
    assert seen == set(LAYOUT[mesh_text])


def test_the_compiled_initialiser_outputs_the_intended_shardings(sharded):
    mesh_text, run = sharded
    mesh = run["mesh"]
    init = functools.partial(init_state, cfg=CFG, optimizer=OPTIMIZER)
    # Under the mesh, as the fixture's init_sharded ran: the program it compiled, read back.
    with jax.set_mesh(mesh):
        compiled = jax.jit(init, out_shardings=run["shardings"]).lower(jax.random.key(0)).compile()
    out = jax.tree.leaves(compiled.output_shardings)
    leaves = jax.tree_util.tree_flatten_with_path(run["initial"])[0]
    assert len(out) == len(leaves)
    for (path, leaf), got in zip(leaves, out):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        spec = sharding.PARAM_SPECS[names[-1]] if leaf.ndim else jax.sharding.PartitionSpec()
        intended = NamedSharding(mesh, spec)
        assert got.is_equivalent_to(intended, leaf.ndim), (mesh_text, names)
        assert leaf.sharding.is_equivalent_to(intended, leaf.ndim), (mesh_text, names)


def test_params_are_never_whole_on_one_device_under_fsdp():
    sizes = sharding.parse_mesh("fsdp=8", 8)
    mesh = sharding.make_mesh(sizes)
    init = functools.partial(init_state, cfg=CFG, optimizer=OPTIMIZER)
    shapes = jax.eval_shape(init, jax.random.key(0))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(shapes))
    with jax.set_mesh(mesh):  # as the fixture built fsdp=8's: its initialiser, read back
        state, shardings = sharding.init_sharded(init, jax.random.key(0), mesh)
    held, total = sharding.bytes_per_device(state, shardings)
    # Everything but the small norm vectors and step counters is split 8 ways.
    assert total / 8 <= held < total / 7


def test_two_processes_match_one(single, tmp_path):
    """2 processes x 2 devices, joined over loopback, train like one device."""
    metrics = tmp_path / "metrics.jsonl"
    launch = ["scripts/launch_local.py", "--processes", "2", "--devices-per-process", "2"]
    train = ["--preset", "tiny", "--steps", str(TC.steps), "--log-every", "1"]
    train += ["--sample-bytes", "0"]
    outputs = ["--metrics-out", str(metrics), "--run-dir", str(tmp_path)]
    result = run_python(*launch, "--log-dir", str(tmp_path), "--", *train, *outputs)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "4 x cpu (2 processes)" in result.stdout
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    np.testing.assert_allclose(losses, single["losses"], rtol=1e-4)

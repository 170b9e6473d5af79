"""Weights stored in bfloat16 (s2_train.py --weights bfloat16 [--master]): what the float32
master keeps that bf16 weights alone lose, that the recipe follows the float32 run's
arithmetic, that its sums stay float32, that its checkpoints restore or refuse in one
line, and that XLA's plan holds the state the napkin counts for it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import s2_in_process

from roofline.flops import param_count
from sessions.model import init_params
from sessions.model.config import PRESETS
from sessions.plan import programs
from sessions.plan.memory_levers import RECIPES, measure_lever, stored
from sessions.run.checkpoint import Checkpoints, newest_meta
from sessions.run.defaults import configs_for
from sessions.run.serving import load_params
from sessions.train import data, step
from sessions.train.master_weights import in_float32

CFG = dataclasses.replace(PRESETS["tiny"].model, dtype="bfloat16")


def sgd_steps(master, steps=10, lr=1e-3):
    """(weight, master or None) after `steps` SGD steps of lr x a gradient of 1 on a bf16
    weight of 1.0."""
    optimizer = in_float32(optax.sgd(lr), master=master)
    params = {"w": jnp.ones((), jnp.bfloat16)}
    state = optimizer.init(params)
    for _ in range(steps):
        updates, state = optimizer.update({"w": jnp.ones((), jnp.bfloat16)}, state, params)
        params = optax.apply_updates(params, updates)
    return params["w"], state.master["w"] if master else None


def test_an_update_below_half_a_bf16_place_is_lost_without_a_master():
    """By hand: below 1.0 bf16's values are 2^-8 = 0.0039 apart, so 1 - 0.001 rounds back to
    1.0 every step. The master reaches 1 - 10 x 0.001 = 0.99, whose nearest bf16 values are
    1 - 3 x 2^-8 = 0.98828125 (0.0017 away) and 0.9921875 (0.0022 away)."""
    alone, _ = sgd_steps(master=False)
    assert alone.dtype == jnp.bfloat16 and float(alone) == 1.0
    weight, master = sgd_steps(master=True)
    assert weight.dtype == jnp.bfloat16 and float(weight) == 0.98828125
    assert master.dtype == jnp.float32 and float(master) == pytest.approx(0.99, abs=1e-6)


def train(weights, master, steps):
    """(state, losses) after `steps` steps of the tiny preset, bf16 matmuls, seed 0."""
    tc = dataclasses.replace(PRESETS["tiny"].train, weights=weights, master=master)
    optimizer = step.make_optimizer(tc, tc.steps)
    state = step.init_state(jax.random.key(0), cfg=CFG, optimizer=optimizer, weights=weights)
    fn = jax.jit(functools.partial(step.train_step, cfg=CFG, optimizer=optimizer))
    tokens = data.split(data.default_corpus(), CFG.seq)[0]
    losses = []
    for i in range(steps):
        batch = data.get_batch(tokens, i, batch=tc.batch, seq=CFG.seq, seed=tc.seed)
        state, metrics = fn(state, batch)
        losses.append(float(metrics["loss"]))
    return state, losses


def test_the_master_recipe_follows_the_float32_weights_run():
    """float32 weights cast to bf16 in the step and bf16 weights rounded from a float32
    master compute the same forward: the first two losses agree exactly (the first update
    is at the warm-up's lr 0). Their matrices' gradients are the same bf16 numbers made
    float32, so after the second update the master is the float32 weights to float32's
    rounding; the embedding's two gradients (the lookup's and the tied projection's) are
    summed in bf16 here, in float32 there, so it moves by at most the two updates, 2 lr."""
    reference, expected = train("float32", False, 2)
    state, got = train("bfloat16", True, 2)
    assert got == expected
    flat = jax.tree_util.tree_flatten_with_path(state["opt"].master)[0]
    ref = dict(jax.tree_util.tree_flatten_with_path(reference["params"])[0])
    stored_params = dict(jax.tree_util.tree_flatten_with_path(state["params"])[0])
    lr = PRESETS["tiny"].train.lr
    for path, w in flat:
        assert w.dtype == jnp.float32 and stored_params[path].dtype == jnp.bfloat16
        np.testing.assert_array_equal(stored_params[path], w.astype(jnp.bfloat16))
        bound = 2 * lr if jax.tree_util.keystr(path) == "['embed']" else 1e-6
        np.testing.assert_allclose(w, ref[path], rtol=0, atol=bound, err_msg=str(path))


def test_accumulation_sums_bf16_weights_gradients_in_float32():
    """Four microbatches that are one microbatch four times: their mean gradient is that
    microbatch's exactly when the sum is float32 (g + g + g + g = 4g holds for any bf16 g
    there), not in bf16, where 2g + g rounds to 8 bits."""
    params = jax.tree.map(lambda w: w.astype(jnp.bfloat16), init_params(CFG, jax.random.key(0)))
    rng = np.random.default_rng(0)
    one = {k: rng.integers(0, CFG.vocab, (2, CFG.seq)) for k in ("inputs", "targets")}
    # Row r of microbatch i is row 4r + i (step.accumulate): rows 0-3 are one's row 0.
    four = {k: jnp.asarray(np.repeat(v, 4, axis=0)) for k, v in one.items()}
    accumulate = jax.jit(step.accumulate, static_argnums=(2, 3))
    _, grads = accumulate(params, four, CFG, 4)
    _, expected = accumulate(params, jax.tree.map(jnp.asarray, one), CFG, 1)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(got, want)


def test_a_checkpoint_of_bf16_weights_restores_serves_and_refuses_another_recipe(tmp_path, capsys):
    """Saved with bf16 weights and a master, it restores into the same recipe's state and
    serves; a float32 run's --resume is refused in one line naming the recipe."""
    run = configs_for("cpu", preset="tiny", train_fields={"weights": "bfloat16", "master": True})
    cfg, tc = run.model, run.train
    assert cfg.dtype == "bfloat16"  # bf16 weights compute in bf16
    mesh = programs.one_device_mesh()
    _, init, abstract = step.abstract_state(cfg, tc, mesh)
    state = init(jax.random.key(0))
    with Checkpoints(tmp_path / "checkpoints", 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, state)
        _, restored = checkpoints.restore_latest(abstract)
    meta = newest_meta(str(tmp_path / "checkpoints"))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params, _ = load_params(str(tmp_path / "checkpoints"), 0, cfg, meta, mesh)
    assert {w.dtype for w in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    argv = ["--preset", "tiny", "--dtype", "bfloat16", "--resume", "--run-dir", str(tmp_path)]
    code, err = s2_in_process(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "weights float32 here, bfloat16 there; master False here, True there" in err


@pytest.fixture(scope="module")
def recipes():
    """The three RECIPES compiled here at the course preset's widths and 16 sequences:
    the state, 12.8M parameters, is most of the step."""
    run = configs_for("cpu", preset="course", train_fields={"batch": 16})
    return run, [(lever, measure_lever(run, lever)) for lever in RECIPES]


def test_xla_holds_the_state_the_napkin_counts_for_each_recipe(recipes):
    """Each recipe within 15% of XLA's plan either way: the napkin counts bf16 activations
    at 2 bytes, and JAX 0.10's CPU backend keeps them in float32 (0.90x there, 1.00x on
    JAX 0.12). The recipes compute alike, so their plans differ by the state alone: the
    bytes a parameter each bf16 recipe adds to float32 weights' (18 - 16 with a master,
    14 - 16 without) are what XLA's plan adds, within half a byte."""
    run, rows = recipes
    params = param_count(run.model)
    (_, f32_row), *bf16 = rows
    for lever, row in rows:
        assert 0.85 <= row.planned_bytes / row.xla_bytes <= 1.15, (lever, row)
    for lever, row in bf16:
        napkin = sum(stored(lever).bytes_per_param().values()) - 16
        assert napkin == (2 if lever.master else -2)
        xla = (row.xla_bytes - f32_row.xla_bytes) / params
        assert abs(xla - napkin) < 0.5, (lever, xla)

"""The Flax NNX transformer is our transformer: same logits, same training step,
the same sharding rules carried beside its weights."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from roofline.compiled.scatters import scatters
from sessions.errors import UsageError
from sessions.model import flax_model, forward, init_params
from sessions.model.config import TrainConfig
from sessions.model.transformer import cross_entropy
from sessions.shard.sharding import PARAM_SPECS, make_mesh
from sessions.train.step import make_optimizer, make_train_step


def tokens(cfg, B=2, S=12, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, S), 0, cfg.vocab)


def spec_tuple(spec):
    """P('fsdp', None) and P('fsdp') shard alike: compare without trailing Nones."""
    names = tuple(spec)
    while names and names[-1] is None:
        names = names[:-1]
    return names


@pytest.mark.parametrize("switches", [{}, {"attention": False, "positions": False}])
def test_logits_equal_ours(cfg, key, switches):
    cfg = dataclasses.replace(cfg, **switches)
    params = init_params(cfg, key)
    model = flax_model.from_params(params, cfg)
    x = tokens(cfg)
    np.testing.assert_allclose(model(x), forward(params, x, cfg), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "switch", [{"kv_heads": 1}, {"rope": True}, {"gated": True}, {"tied": False}]
)
def test_session_5_s_switches_are_refused_in_one_line(cfg, switch):
    """The Flax model is session 2's: a switch it lacks is refused, never ignored."""
    with pytest.raises(UsageError, match="the Flax model is session 2's model") as refused:
        flax_model.Transformer(dataclasses.replace(cfg, **switch), rngs=nnx.Rngs(params=0))
    assert "\n" not in str(refused.value)


def test_conversion_round_trips_and_own_init_has_our_shapes(cfg, key):
    params = init_params(cfg, key)
    back = flax_model.to_params(flax_model.from_params(params, cfg))
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    own = flax_model.to_params(flax_model.Transformer(cfg, nnx.Rngs(params=0)))

    def shape(x):
        return (x.shape, x.dtype)

    assert jax.tree.map(shape, own) == jax.tree.map(shape, params)


def test_the_embedding_is_tied(cfg, key):
    """One Param, read by the lookup and the output projection: its gradient
    has both contributions, as our dict's single "embed" entry does."""
    model = flax_model.from_params(init_params(cfg, key), cfg)
    assert [p for p, _ in flax_model.weights(model)].count(("embed",)) == 1
    assert len(jax.tree.leaves(nnx.state(model, nnx.Param))) == len(
        jax.tree.leaves(init_params(cfg, key))
    )


def test_partition_metadata_is_our_rules(cfg, key):
    model = flax_model.from_params(init_params(cfg, key), cfg)
    for path, variable in flax_model.weights(model):
        spec = nnx.get_partition_spec({"w": variable})["w"].get_value()
        assert spec_tuple(spec) == spec_tuple(PARAM_SPECS[path[-1]]), path


def test_under_a_mesh_weights_are_born_sharded_and_logits_unchanged(cfg):
    cfg = dataclasses.replace(cfg, heads=2)  # tp=2 splits heads, F=40 and V=256
    mesh = make_mesh({"data": 1, "fsdp": 4, "tp": 2})
    x = tokens(cfg, B=4)
    with jax.set_mesh(mesh):
        model = nnx.jit(lambda: flax_model.Transformer(cfg, nnx.Rngs(params=0)))()
        for path, variable in flax_model.weights(model):
            sharding = variable[...].sharding
            assert spec_tuple(sharding.spec) == spec_tuple(PARAM_SPECS[path[-1]]), path
        sharded = nnx.jit(lambda m, t: m(t))(model, x)
    params = jax.device_get(flax_model.to_params(model))
    np.testing.assert_allclose(sharded, forward(params, np.asarray(x), cfg), rtol=1e-5, atol=1e-5)


def test_one_flax_training_step_equals_ours(cfg, key):
    x = tokens(cfg, S=cfg.seq + 1, seed=2)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
    optimizer = make_optimizer(TrainConfig(), total_steps=10)
    params = init_params(cfg, key)

    # A copy: the Flax step donates its model's buffers, and from_params shares ours.
    model = flax_model.from_params(jax.tree.map(lambda w: w.copy(), params), cfg)
    opt = flax_model.make_flax_optimizer(model, optimizer)
    flax_step = flax_model.make_flax_train_step()
    theirs = [flax_step(model, opt, batch) for _ in range(2)]  # the 2nd sees the 1st's update

    state = {"params": params, "opt": optimizer.init(params)}
    step = make_train_step(cfg, optimizer)  # jitted, as the Flax step is: one compile, not op by op
    ours = []
    for _ in range(2):
        state, metrics = step(state, batch)
        ours.append(metrics)
    for a, b in zip(theirs, ours):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(flax_model.to_params(model)), jax.tree.leaves(state["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_flax_lookup_sums_its_gradient_in_float32(cfg, key):
    """nnx.Embed given a compute dtype casts its table before the lookup, and
    its gradient then sums in bf16 (sessions/model/transformer.py, embed). The Flax model
    in bf16, its gradient compiled here: every scatter sums in float32."""
    cfg = dataclasses.replace(cfg, dtype="bfloat16")
    graphdef, state = nnx.split(flax_model.from_params(init_params(cfg, key), cfg))
    x = tokens(cfg)

    def loss(state):
        return cross_entropy(nnx.merge(graphdef, state)(x), x)

    found = scatters(jax.jit(jax.grad(loss)).lower(state).compile().as_text())
    assert (cfg.vocab, cfg.embed) in {s.shape for s in found}  # the lookup's gradient
    assert {s.dtype for s in found} == {"f32"}, found

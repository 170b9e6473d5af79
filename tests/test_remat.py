"""Session 6's remat lever (ModelConfig.remat, s2_train.py --remat): what each layer
keeps for the backward changes, the arithmetic does not. The same loss and gradients
under every policy; the layer the forward runs keeps exactly what the napkin says
(jax.ad_checkpoint.print_saved_residuals); the GPU's compiler plans less memory for
each policy down the list, while XLA's CPU backend, with the layers unrolled, plans the
same bytes for all three (it honours remat only inside a scan)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import need, residual_values

from roofline.hardware import find_chip
from roofline.plan.training_memory import plan_memory
from sessions.errors import UsageError
from sessions.model import init_params
from sessions.model.attention import attention
from sessions.model.config import PRESETS, ModelConfig
from sessions.model.transformer import REMAT, block, remat
from sessions.plan import programs
from sessions.plan.train_on_target import plan_target
from sessions.run.checkpoint import identity
from sessions.run.cli import resolve, train_flags
from sessions.train import step

POLICIES = ("none", "dots", "block")
CFG = ModelConfig(embed=24, ff=40, heads=4, kv_heads=2, head_dim=6, layers=2, seq=16)


def test_every_policy_gives_the_same_loss_and_gradients():
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, CFG.vocab)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    results = {}
    for policy in POLICIES:
        cfg = dataclasses.replace(CFG, remat=policy)
        results[policy] = jax.jit(jax.value_and_grad(step.loss_fn), static_argnums=2)(
            params, batch, cfg
        )
    loss, grads = results["none"]
    for policy in ("dots", "block"):
        other_loss, other_grads = results[policy]
        assert other_loss == pytest.approx(float(loss), rel=1e-6), policy
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=policy)


@pytest.mark.parametrize("policy", ["dots", "block"])
def test_the_model_s_own_lever_keeps_what_the_napkin_counts(policy):
    """The layer function the forward builds (remat(..., policy)), 2 sequences of 16."""
    layer = init_params(CFG, jax.random.key(0))["layers"][0]

    def causal(q, k, v):
        return attention(q, k, v), None

    layer_fn = remat(lambda w, x: block(w, x, CFG, causal)[0], policy)
    x = jnp.ones((2, 16, CFG.embed))
    napkin = plan_memory(CFG, find_chip("h100"), batch_tokens=32, remat=policy).saved
    kept = residual_values(lambda w, x: layer_fn(w, x).sum(), layer, x)
    assert kept == sum(n for n, *_ in napkin.values())
    assert set(REMAT) == {"dots", "block"}


def test_a_bad_policy_is_one_line():
    with pytest.raises(UsageError, match="--remat all: none, dots or block"):
        ModelConfig(remat="all")


def test_a_checkpoint_resumes_under_another_policy():
    """remat changes what the step recomputes, never the weights: it is no part of
    what a checkpoint must match to continue a run."""
    train = PRESETS["tiny"].train
    assert identity(dataclasses.replace(CFG, remat="block"), train) == identity(CFG, train)
    assert identity(dataclasses.replace(CFG, layers=3), train) != identity(CFG, train)


def test_the_gpu_plans_less_for_each_policy_and_this_cpu_the_same():
    need("gpu")
    target, devices = programs.devices_for("h100:1")
    planned = {}
    for policy in POLICIES:
        argv = ["--preset", "tiny", "--target", "h100:1", "--remat", policy]
        run = resolve(train_flags(argv), platform="gpu")
        assert run.model.remat == policy
        plan = plan_target(None, run, target, devices, lambda *a: None).plan
        planned[policy] = plan.memory_per_device_bytes
    assert planned["none"] > planned["dots"] > planned["block"], planned

    cfg, train = PRESETS["tiny"].model, PRESETS["tiny"].train
    optimizer = step.make_optimizer(train, train.steps)
    state = jax.eval_shape(lambda: step.init_state(jax.random.key(0), cfg=cfg, optimizer=optimizer))
    tokens = jax.ShapeDtypeStruct((train.batch, cfg.seq), jnp.int32)
    here = set()
    for policy in POLICIES:
        fn = step.make_train_step(dataclasses.replace(cfg, remat=policy), optimizer)
        compiled = fn.lower(state, {"inputs": tokens, "targets": tokens}).compile()
        here.add(compiled.memory_analysis().temp_size_in_bytes)
    assert len(here) == 1, here

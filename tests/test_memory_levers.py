"""Session 6's levers in the step, which change what it holds and never its arithmetic.

remat (ModelConfig.remat, s2_train.py --remat): the same loss and gradients under every
policy; the layer the forward runs keeps exactly what the napkin says
(jax.ad_checkpoint.print_saved_residuals); the compilers plan less memory under block
remat wherever their schedule rebuilds in the backward (a GPU's; a scanned step's on a
CPU; an unrolled one's on JAX 0.12's CPU, not on JAX 0.10's).

scan (ModelConfig.scan_layers, s2_train.py --scan-layers): the unrolled loop's loss and
gradients.

accum (TrainConfig.accum, s2_train.py --accum): N microbatches of B/N give one batch's
loss and gradient, to summation order, and the compiled step holds one microbatch's
activations, within 15% above the napkin's plan."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import need, residual_values, s2_in_process

from roofline.hardware import find_chip
from roofline.plan.training_memory import plan_memory
from sessions.errors import UsageError
from sessions.model import init_params
from sessions.model.attention import attention
from sessions.model.config import PRESETS, ModelConfig
from sessions.model.remat import REMAT, remat
from sessions.model.transformer import block
from sessions.plan import programs
from sessions.plan.memory_levers import Lever, measure_lever, recompute_runs_in_forward
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
    assert {"dots", "block"} <= set(REMAT)


@pytest.mark.parametrize("policy", ["none", "block"])
def test_scanned_layers_give_the_unrolled_loss_and_gradients(policy):
    """One compiled body under lax.scan over the stacked weights: the same numbers as the
    Python loop, each layer's gradient back in its own place of the list."""
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, CFG.vocab)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    grad = jax.jit(jax.value_and_grad(step.loss_fn), static_argnums=2)
    loss, grads = grad(params, batch, dataclasses.replace(CFG, remat=policy))
    scanned = dataclasses.replace(CFG, remat=policy, scan_layers=True)
    scan_loss, scan_grads = grad(params, batch, scanned)
    assert float(scan_loss) == pytest.approx(float(loss), rel=1e-6)
    assert jax.tree.structure(scan_grads) == jax.tree.structure(grads)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(scan_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert "while" in grad.lower(params, batch, scanned).as_text()


def test_a_bad_policy_is_one_line():
    with pytest.raises(UsageError, match="--remat all: none, dots, block, minimal, "):
        ModelConfig(remat="all")


def test_a_checkpoint_resumes_under_another_policy():
    """remat, scan and accum change what the step recomputes or holds, never the weights nor
    the update: no part of what a checkpoint must match to continue a run."""
    train = PRESETS["tiny"].train
    assert identity(dataclasses.replace(CFG, remat="block"), train) == identity(CFG, train)
    assert identity(dataclasses.replace(CFG, scan_layers=True), train) == identity(CFG, train)
    assert identity(CFG, dataclasses.replace(train, accum=4)) == identity(CFG, train)
    assert identity(dataclasses.replace(CFG, layers=3), train) != identity(CFG, train)


def test_remat_saves_memory_where_the_schedule_rebuilds_in_the_backward():
    """The tiny preset's step compiled here, unrolled and scanned. Remat saves memory
    only if the rebuilt forward runs in the backward: XLA's CPU backend in JAX 0.10
    schedules an unrolled step's rebuilding during the forward (then the plan is none's),
    JAX 0.12's in the backward; a scanned step's sits in the backward loop's body,
    whatever the version."""
    cfg, train = PRESETS["tiny"].model, PRESETS["tiny"].train
    optimizer = step.make_optimizer(train, train.steps)
    state = jax.eval_shape(lambda: step.init_state(jax.random.key(0), cfg=cfg, optimizer=optimizer))
    tokens = jax.ShapeDtypeStruct((train.batch, cfg.seq), jnp.int32)
    planned, early = {}, {}
    for policy, scan in (("none", False), ("block", False), ("none", True), ("block", True)):
        fn = step.make_train_step(
            dataclasses.replace(cfg, remat=policy, scan_layers=scan), optimizer
        )
        compiled = fn.lower(state, {"inputs": tokens, "targets": tokens}).compile()
        planned[policy, scan] = compiled.memory_analysis().temp_size_in_bytes
        early[policy, scan] = recompute_runs_in_forward(compiled.as_text())
    assert not early["none", False] and not early["none", True]  # nothing is rebuilt
    same = planned["block", False] >= 0.99 * planned["none", False]
    assert same == early["block", False], (planned, early)
    assert not early["block", True] and planned["block", True] < 0.6 * planned["none", True]


def test_the_gpu_plans_less_under_block_remat_and_rebuilds_in_the_backward():
    """The tiny preset's step through s2_train.py --target h100:1 --remat: XLA's GPU
    schedule rebuilds in the backward, so block plans less. (dots sits between the two
    on the GPU: gpt2-bytes' 8.68, 6.95 and 2.62 GB, roofline/README.md.)"""
    need("gpu")
    target, devices = programs.devices_for("h100:1")
    rows = {}
    for policy in ("none", "block"):
        argv = ["--preset", "tiny", "--target", "h100:1", "--remat", policy]
        run = resolve(train_flags(argv), platform="gpu")
        assert run.model.remat == policy
        rows[policy] = measure_lever(run, Lever(policy), target=target, devices=devices)
    assert rows["none"].xla_bytes > rows["block"].xla_bytes, rows
    assert rows["block"].recompute_in_forward is False


def random_batch(rows, seq, vocab, seed=1):
    tokens = jax.random.randint(jax.random.key(seed), (rows, seq + 1), 0, vocab)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


def test_four_microbatches_give_one_batch_s_loss_and_gradient():
    params = init_params(CFG, jax.random.key(0))
    batch = random_batch(8, CFG.seq, CFG.vocab)
    loss, grads = jax.jit(jax.value_and_grad(step.loss_fn), static_argnums=2)(params, batch, CFG)
    accumulated = jax.jit(step.accumulate, static_argnums=(2, 3))
    micro_loss, micro_grads = accumulated(params, batch, CFG, 4)
    assert float(micro_loss) == pytest.approx(float(loss), rel=1e-6)
    # Summation order alone: float32's epsilon (1.2e-7) times the 128 terms the
    # embedding's rows sum at most, against the largest gradient of each weight.
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(micro_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=128 * 1.2e-7 * float(np.abs(a).max()))


def test_s2_with_accum_logs_the_losses_of_one_batch(tmp_path, capsys):
    """s2_train.py --accum 2 on the tiny preset, over 8 devices: the same losses at every
    logged step as without, to float rounding; --accum 3 does not divide its batch of 16:
    one line. XLA's plan of the step it compiled holds less with two microbatches."""
    losses, memory = {}, {}
    for accum in (1, 2):
        metrics, summary = tmp_path / f"metrics{accum}.jsonl", tmp_path / f"summary{accum}.json"
        argv = ["--preset", "tiny", "--steps", "4", "--log-every", "2", "--sample-bytes", "0"]
        argv += ["--run-dir", str(tmp_path), "--metrics-out", str(metrics)]
        argv += ["--summary-out", str(summary)]
        code, err = s2_in_process([*argv, "--accum", str(accum)], capsys)
        assert code in (0, None), err
        losses[accum] = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
        memory[accum] = json.loads(summary.read_text())["memory_bytes_per_device"]
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-5)
    assert memory[2] < memory[1], memory
    code, err = s2_in_process(["--preset", "tiny", "--accum", "3"], capsys)
    assert code == 2 and "--accum 3 must divide --batch 16" in err and "\n" not in err.strip()


def test_a_microbatch_s_activations_are_all_the_compiled_step_holds():
    """The cpu preset, batch 64, on this CPU: XLA's plan with 4 microbatches is at least
    the napkin's and at most 15% above it, and well under one batch's."""
    cfg, preset_train = PRESETS["cpu"].model, PRESETS["cpu"].train
    planned = {}
    for accum in (1, 4):
        train = dataclasses.replace(preset_train, batch=64, accum=accum)
        optimizer = step.make_optimizer(train, train.steps)
        state = jax.eval_shape(
            lambda o=optimizer: step.init_state(jax.random.key(0), cfg=cfg, optimizer=o)
        )
        tokens = jax.ShapeDtypeStruct((64, cfg.seq), jnp.int32)
        fn = step.make_train_step(cfg, optimizer, accum=accum)
        m = fn.lower(state, {"inputs": tokens, "targets": tokens}).compile().memory_analysis()
        planned[accum] = (
            m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes
        )  # fmt: skip
    napkin = plan_memory(cfg, find_chip("h100"), batch_tokens=64 * cfg.seq, accum=4)
    assert planned[4] <= napkin.per_chip["total"] <= 1.15 * planned[4], (planned, napkin.per_chip)
    assert planned[4] < planned[1] / 2

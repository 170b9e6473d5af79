"""The training step and loop: jit changes nothing but speed, the loop
compiles once and never waits on the device between log lines, and the
tiny preset learns."""

import functools

import jax
import numpy as np
import pytest

from sessions import data
from sessions.config import PRESETS, TrainConfig
from sessions.loop import TrainingDiverged, train_loop
from sessions.prefetch import Synchronous
from sessions.train import init_state, make_optimizer, make_train_step

DEVICE = jax.devices()[0]


def setup(cfg, tc, steps):
    optimizer = make_optimizer(tc, steps)
    state = jax.device_put(
        init_state(jax.random.key(tc.seed), cfg=cfg, optimizer=optimizer), DEVICE
    )
    train, _ = data.split(data.default_corpus(), cfg.seq)
    make_batch = functools.partial(data.get_batch, train, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
    return optimizer, state, make_batch


def run_loop(step_fn, state, make_batch, steps, log_every, **kw):
    place = functools.partial(jax.device_put, device=DEVICE)
    return train_loop(
        step_fn,
        state,
        Synchronous(make_batch, place),
        start=0,
        steps=steps,
        log_every=log_every,
        tokens_per_step=1,
        flops_per_step=1,
        peak_flops=1,
        n_devices=1,
        log=lambda line: None,
        **kw,
    )


def test_jitted_step_equals_eager_step(cfg):
    tc = TrainConfig(batch=2)
    optimizer, state, make_batch = setup(cfg, tc, 10)
    batch = jax.device_put(make_batch(0), DEVICE)
    eager_state, eager_metrics = make_train_step(cfg, optimizer, jit=False)(state, batch)
    # The jitted step donates its input state, so give it a copy.
    copy = jax.tree.map(lambda x: x.copy(), state)
    jit_state, jit_metrics = make_train_step(cfg, optimizer, jit=True)(copy, batch)
    np.testing.assert_allclose(jit_metrics["loss"], eager_metrics["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(jit_state), jax.tree.leaves(eager_state)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class CompileCounter:
    """Counts XLA backend compilations through JAX's monitoring events."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def test_loop_compiles_the_step_once_and_never_syncs_between_logs(cfg):
    tc = TrainConfig(batch=2)
    optimizer, state, make_batch = setup(cfg, tc, 12)
    step_fn = make_train_step(cfg, optimizer, jit=True)
    counter = CompileCounter()
    before = counter.count
    # The loop runs non-log steps under transfer_guard_device_to_host("disallow"):
    # any float(loss) between log steps would raise here.
    _, history, _ = run_loop(step_fn, state, make_batch, steps=12, log_every=4)
    assert [r["step"] for r in history] == [4, 8, 12]
    assert counter.count - before == 1


class RecordedLoss:
    """A loss that notes each time the host reads it."""

    def __init__(self, value, step, reads):
        self.value, self.step, self.reads = value, step, reads

    def __float__(self):
        self.reads.append(self.step)
        return float(self.value)


def test_the_loop_reads_the_loss_only_on_log_steps(cfg):
    """On a CPU, device memory is host memory, so JAX's device-to-host guard
    (which the loop sets, and which fires on GPU and TPU) cannot see a read.
    Here each read is recorded instead."""
    tc = TrainConfig(batch=2)
    optimizer, state, make_batch = setup(cfg, tc, 10)
    jitted = make_train_step(cfg, optimizer, jit=True)
    reads, calls = [], []

    def recording_step(state, batch):
        calls.append(len(calls) + 1)
        state, metrics = jitted(state, batch)
        return state, {"loss": RecordedLoss(metrics["loss"], len(calls), reads)}

    run_loop(recording_step, state, make_batch, steps=10, log_every=4)
    assert calls == list(range(1, 11))
    assert reads == [4, 8, 10]


def test_nan_loss_stops_the_run(cfg):
    tc = TrainConfig(batch=2)
    optimizer, state, make_batch = setup(cfg, tc, 2)
    state["params"]["final_norm"] = state["params"]["final_norm"] * np.nan
    step_fn = make_train_step(cfg, optimizer, jit=True)
    with pytest.raises(TrainingDiverged, match="step 2"):
        run_loop(step_fn, state, make_batch, steps=4, log_every=2)


def test_tiny_preset_learns_well_below_the_unigram_baseline():
    preset = PRESETS["tiny"]
    cfg, tc = preset.model, preset.train
    optimizer, state, make_batch = setup(cfg, tc, tc.steps)
    step_fn = make_train_step(cfg, optimizer, jit=True)
    _, history, _ = run_loop(step_fn, state, make_batch, steps=tc.steps, log_every=10)
    unigram = data.unigram_entropy(data.split(data.default_corpus(), cfg.seq)[0])
    # Mean of the last two logged losses: one batch of a tiny preset is noisy.
    final = np.mean([r["loss"] for r in history[-2:]])
    assert history[0]["loss"] > unigram
    assert final < unigram - 0.3, (final, unigram)

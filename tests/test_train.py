"""The training step and loop: jit changes nothing but speed, the loop
compiles once and never waits on the device between log lines, and the
tiny preset learns."""

import functools
import json
import os
import runpy
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import TINY_STEPS

from sessions.errors import TrainingDiverged
from sessions.model import init_params
from sessions.model.config import PRESETS, TrainConfig
from sessions.run import preemption
from sessions.run.report import summarize, summary_lines
from sessions.shard.sharding import batch_sharding, make_mesh
from sessions.train import data
from sessions.train import meter as meter_module
from sessions.train import step as step_module
from sessions.train.meter import Meter, format_record
from sessions.train.step import (
    abstract_batch,
    compile_ahead,
    init_state,
    loss_fn,
    make_optimizer,
    make_train_step,
)

S2_TRAIN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sessions", "s2_train.py"
)

DEVICE = jax.devices()[0]


def setup(cfg, tc, steps):
    optimizer = make_optimizer(tc, steps)
    state = jax.device_put(
        init_state(jax.random.key(tc.seed), cfg=cfg, optimizer=optimizer), DEVICE
    )
    train, _ = data.split(data.default_corpus(), cfg.seq)
    make_batch = functools.partial(data.get_batch, train, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
    return optimizer, state, make_batch


def run_s2(argv, monkeypatch):
    """sessions/s2_train.py run in this process as its command line runs it
    (8 simulated devices): its exit status."""
    monkeypatch.setattr(sys, "argv", [S2_TRAIN, *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(S2_TRAIN, run_name="__main__")
    return exit_.value.code


TINY = ["--preset", "tiny", "--sample-bytes", "0"]
STEPS = ["--steps", str(TINY_STEPS)]  # the suite's: one compiled step (tests/helpers.py)


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


def test_a_step_compiled_ahead_never_compiles_again(cfg):
    """s2_train.py compiles the step from shapes before the loop
    (step_module.compile_ahead); twelve steps then compile nothing more, and run
    under the loop's device-to-host guard."""
    tc = TrainConfig(batch=2)
    optimizer, state, make_batch = setup(cfg, tc, 12)
    mesh = make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=[DEVICE])
    with jax.set_mesh(mesh):
        rows = batch_sharding(mesh)
        step_fn = compile_ahead(
            make_train_step(cfg, optimizer), state, abstract_batch(2, cfg.seq, rows), log=print
        )
        counter = CompileCounter()
        before = counter.count
        for step in range(12):
            batch = jax.device_put(make_batch(step), rows)
            with jax.transfer_guard_device_to_host("disallow"):
                state, metrics = step_fn(state, batch)
        assert np.isfinite(float(metrics["loss"]))
    assert counter.count == before


class RecordedLoss:
    """A loss that notes each time the host reads it."""

    def __init__(self, value, step, reads):
        self.value, self.step, self.reads = value, step, reads

    def __float__(self):
        self.reads.append(self.step)
        return float(self.value)


class RecordingStep:
    """The compiled step, its loss handed back as a RecordedLoss; everything
    else the script asks of the compiled program (its memory plan) passes through."""

    def __init__(self, compiled, calls, reads):
        self.compiled, self.calls, self.reads = compiled, calls, reads

    def __call__(self, state, batch):
        self.calls.append(len(self.calls) + 1)
        state, metrics = self.compiled(state, batch)
        return state, {"loss": RecordedLoss(metrics["loss"], len(self.calls), self.reads)}

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def test_the_loop_reads_the_loss_only_on_log_steps(monkeypatch, tmp_path):
    """s2_train.py's loop, with every step's loss noting when the host reads it.
    On a CPU, device memory is host memory, so JAX's device-to-host guard (which
    the loop sets, and which fires on GPU and TPU) cannot see a read; here each
    read is recorded instead. The step compiled ahead (step_module.compile_ahead) is
    the one wrapped: the loop every course run takes.

    It once ran op by op (--no-jit) over the 8 devices, and under load aborted
    now and then: XLA:CPU runs each op's 8 device programs on one thread pool,
    and with hundreds of ops in flight an all-gather waited on a device that never
    came ("Termination timeout ... of 40 seconds exceeded ... only 7 of them
    arrived", rendezvous.cc, then SIGABRT). pytest's faulthandler prints the
    Python stack of such an abort; -s shows XLA's own line too."""
    reads, calls = [], []
    real = step_module.compile_ahead
    monkeypatch.setattr(
        step_module, "compile_ahead", lambda *a, **k: RecordingStep(real(*a, **k), calls, reads)
    )
    argv = [*TINY, *STEPS, "--log-every", "3", "--run-dir", str(tmp_path)]
    assert run_s2(argv, monkeypatch) == 0
    assert calls == [1, 2, 3, 4]
    assert reads == [3, 4]  # the log step, and the last, which is not one


def test_a_log_line_is_in_the_file_before_its_step_is_saved(monkeypatch, tmp_path):
    """A run killed right after a checkpoint resumes after that step, so the
    metrics line of a checkpointed log step must already be written when
    s2_train.py's loop saves it."""
    metrics, seen = tmp_path / "metrics.jsonl", {}
    real = preemption.SaveHook

    class Watching(real):
        def __call__(self, step, state):
            seen[step + 1] = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
            return super().__call__(step, state)

    monkeypatch.setattr(preemption, "SaveHook", Watching)
    argv = [*TINY, *STEPS, "--log-every", "2", "--checkpoint-every", "2"]
    argv += ["--run-dir", str(tmp_path), "--metrics-out", str(metrics)]
    assert run_s2(argv, monkeypatch) == 0
    assert seen == {1: [], 2: [2], 3: [2], 4: [2, 4]}


def test_a_nan_loss_stops_the_run_at_its_log_step():
    meter = Meter(
        start=0,
        steps=4,
        log_every=2,
        tokens_per_step=1,
        flops_per_step=1,
        peak_flops=1,
        n_devices=1,
        log=lambda line: None,
    )
    meter.record(2, 1.0)
    with pytest.raises(TrainingDiverged, match="step 4"):
        meter.record(4, float("nan"))


def test_tiny_preset_learns_well_below_the_unigram_baseline():
    preset = PRESETS["tiny"]
    cfg, tc = preset.model, preset.train
    optimizer, state, make_batch = setup(cfg, tc, tc.steps)
    # Before any update (the loop donates the state), not at the first log
    # step: how far ten steps get depends on the corpus, which differs by
    # Python release (3.12's docs took step 10 below the baseline already).
    # One compiled forward pass: op by op, each op would be compiled on its own.
    untrained = float(jax.jit(loss_fn, static_argnums=2)(state["params"], make_batch(0), cfg))
    step_fn = make_train_step(cfg, optimizer, jit=True)
    history = []
    for step in range(tc.steps):
        state, metrics = step_fn(state, jax.device_put(make_batch(step), DEVICE))
        if (step + 1) % 10 == 0:
            history.append({"loss": float(metrics["loss"])})
    unigram = data.unigram_entropy(data.split(data.default_corpus(), cfg.seq)[0])
    # Mean of the last two logged losses: one batch of a tiny preset is noisy.
    final = np.mean([r["loss"] for r in history[-2:]])
    # Untrained, the model guesses near uniformly, about ln(256) + 1/2 = 6.0 nats
    # (transformer.py), far above the byte frequencies of any English text (3.2-3.3).
    assert untrained > unigram + 1, (untrained, unigram)
    assert final < unigram - 0.3, (final, unigram)


class Clock:
    """A stand-in for the loop's `time`: it moves only when a test moves it."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


def test_the_meter_s_numbers_by_hand(monkeypatch):
    """Nine steps of 0.5 s of fake time, driven as s2_train.py's loop drives the
    Meter; saves (7 s, handed to `pause`) and validation (3 s, between a log
    step's record and the restart) must not count. Then, by hand: 1,024
    tokens / 0.5 s = 2,048 tokens/s; 3e9 FLOPs / 0.5 s over 2 devices = 0.003
    TFLOP/s per device; over a peak of 1e10 per device, MFU 0.3."""
    clock = Clock()
    monkeypatch.setattr(meter_module, "time", clock)
    meter = Meter(
        start=0,
        steps=9,
        log_every=4,
        tokens_per_step=1024,
        flops_per_step=3e9,
        peak_flops=1e10,
        n_devices=2,
        log=lambda line: None,
    )
    for step in range(9):
        clock.now += 0.5  # the step
        done = step + 1
        if meter.is_log_step(done):
            record = meter.record(done, 2.0)
            clock.now += 3.0  # validation
            record["val_loss"] = 1.5
            meter.write(record)
        if done in (3, 4):  # a save between logs, and one right after a log
            clock.now += 7.0
            meter.pause(7.0)
        if meter.is_log_step(done):
            meter.restart(done)
    assert [r["step"] for r in meter.history] == [4, 8, 9]
    for r in meter.history:
        assert r["step_time_s"] == pytest.approx(0.5)
        assert r["tokens_per_sec"] == pytest.approx(2048)
        assert r["tflops_per_device"] == pytest.approx(0.003)
        assert r["mfu"] == pytest.approx(0.3)
    assert meter.train_seconds == pytest.approx(9 * 0.5)
    line = format_record(meter.history[0])
    assert "2,048 tok/s" in line and "0.003 TFLOP/s/device" in line and "MFU  30.0%" in line


def test_the_summary_by_hand():
    """A run resumed at step 2 that timed 6 steps in 3 s: 0.5 s a step."""
    history = [{"step": 4, "loss": 3.0, "val_loss": 2.3}, {"step": 8, "loss": 2.5, "val_loss": 2.4}]
    s = summarize(
        history,
        train_seconds=3.0,
        tokens_per_step=1024,
        flops_per_step=3e9,
        peak=(1e10, "a datasheet"),
        n_devices=2,
        unigram=3.3,
        first_step=2,
        memory=(3 * 2**20, "a plan"),
    )
    assert s["steps"] == 8
    assert s["step_time_s"] == pytest.approx(0.5)
    assert s["tokens_per_sec"] == pytest.approx(2048)
    assert s["tflops_per_device"] == pytest.approx(0.003)
    assert s["mfu"] == pytest.approx(0.3)
    assert (s["train_loss"], s["val_loss"]) == (2.5, 2.4)
    assert (s["best_val_loss"], s["best_val_step"]) == (2.3, 4)  # the last is not the best
    text = "\n".join(summary_lines(s))
    assert "val loss    2.400 nats/byte (best 2.300 at step 4)" in text
    assert "2,048 tokens/s, 500.0 ms/step, 0.003 TFLOP/s per device" in text
    assert "MFU         30.0% of 0.010 TFLOP/s per device (a datasheet)" in text
    assert "memory      3.0 MiB per device (a plan)" in text


def logged(losses, val):
    """Meter records as s2_train.py's loop writes them: {step: loss}, and val_loss
    at the steps in `val`."""
    history = [
        meter_module.make_record(step, loss, 0.1, 1024, 1e9, 1e10, 1)
        for step, loss in losses.items()
    ]
    for r in history:
        if r["step"] in val:
            r["val_loss"] = val[r["step"]]
    return history


def summary_of(history, corpus, passes=None):
    s = summarize(
        history,
        train_seconds=1.0,
        tokens_per_step=1024,
        flops_per_step=1e9,
        peak=(1e10, "a datasheet"),
        n_devices=1,
        unigram=3.15,
        first_step=0,
        corpus=corpus,
        passes=passes,
    )
    return json.loads(json.dumps(s))  # what --summary-out writes


def test_the_final_gap_by_hand():
    """The last validation loss less the mean of the train losses logged at its step
    and the log step before: the H100's 2,000-step course run
    (docs/h100-run/accelerator-check/s2.log) ends 1.011 - (0.641 + 0.621) / 2 = 0.380
    nats/byte, past 0.1, and the summary says it memorized."""
    h100 = {1500: 0.723, 1600: 0.696, 1700: 0.669, 1800: 0.665, 1900: 0.641, 2000: 0.621}
    stdlib = "stdlib (CPython 3.12.3 source, 393 files, 8.0 MB; whole files held out)"
    s = summary_of(logged(h100, {1500: 1.005, 2000: 1.011}), stdlib)
    assert s["val_gap"] == pytest.approx(0.380)
    assert (s["val_gap_train_loss"], s["val_gap_train_steps"]) == (
        pytest.approx(0.631),
        [1900, 2000],
    )
    text = "\n".join(summary_lines(s))
    assert (
        "  val - train +0.380 nats/byte (train loss 0.631, the mean at steps 1,900 and 2,000)"
        in text
    )
    (warning,) = [line for line in summary_lines(s) if "warning" in line]
    assert "begun to memorize" in warning and "past a gap of 0.1 nats/byte" in warning
    assert "fewer --steps" in warning and "--data PATH" in warning
    assert "--data stdlib" not in warning  # it is on the stdlib already
    on_docs = summary_lines(summary_of(logged(h100, {2000: 1.011}), "docs (pydoc_data.topics)"))
    assert "--data stdlib" in next(line for line in on_docs if "warning" in line)

    # The last validation counts, not the first; 2.40 - (2.35 + 2.33) / 2 = 0.06: no warning.
    s = summary_of(logged({20: 2.9, 30: 2.35, 40: 2.33, 50: 2.3}, {20: 3.5, 40: 2.4}), stdlib)
    assert s["val_gap"] == pytest.approx(0.06)
    assert (s["val_gap_train_loss"], s["val_gap_train_steps"]) == (pytest.approx(2.34), [30, 40])
    lines = summary_lines(s)
    assert "  val - train +0.060 nats/byte (train loss 2.340, the mean at steps 30 and 40)" in lines
    assert not [line for line in lines if "warning" in line]
    # Validated once, the gap alone decides: 0.06 is within noise.
    s = summary_of(logged({30: 2.35, 40: 2.33}, {40: 2.4}), stdlib)
    assert s["val_earlier"] is None and not s["memorizing"]
    assert not [line for line in summary_lines(s) if "warning" in line]

    # One logged step, validated: its own loss. No validation: no gap.
    s = summary_of(logged({10: 2.5}, {10: 2.45}), stdlib)
    assert s["val_gap"] == pytest.approx(-0.05) and s["val_gap_train_steps"] == [10]
    assert "  val - train -0.050 nats/byte (train loss 2.500, step 10)" in summary_lines(s)
    s = summary_of(logged({10: 2.5, 20: 2.4}, {}), stdlib)
    assert (s["val_gap"], s["val_gap_train_loss"], s["val_gap_train_steps"]) == (None, None, [])
    assert not [line for line in summary_lines(s) if "val - train" in line]


def test_memorizing_is_a_gap_outgrowing_validation_by_hand():
    """Past 0.1, the gap says memorizing only if it grew, since the evaluation a third
    of the run back, by more than validation fell. Python 3.13's default run, when the
    docs held out their last tenth (docs/data.md): 1.411 - (1.166 + 1.172) / 2 = +0.242
    at step 600, against 1.538 - (1.378 + 1.392) / 2 = +0.153 at step 400; the gap grew
    0.089 while validation fell 0.127: a model still learning, no warning."""
    py313 = {350: 1.378, 400: 1.392, 450: 1.216, 500: 1.318, 550: 1.166, 600: 1.172}
    s = summary_of(logged(py313, {400: 1.538, 600: 1.411}), "docs (pydoc_data)")
    assert s["val_gap"] == pytest.approx(0.242)
    assert (s["val_earlier"]["step"], s["val_earlier"]["val_loss"]) == (400, 1.538)
    assert s["val_earlier"]["val_gap"] == pytest.approx(0.153)
    assert not s["memorizing"]
    lines = summary_lines(s)
    assert "              since step 400: the gap +0.089, validation -0.127" in lines
    assert not [line for line in lines if "warning" in line]

    # The cpu preset for 1,800 steps on the docs, validated every 100 (docs/results.md,
    # "Passes over the data"). At 1,800: 1.064 - (0.744 + 0.755) / 2 = +0.3145, and at
    # 1,200, a third back: 1.134 - (1.064 + 1.028) / 2 = +0.088. The gap grew 0.2265,
    # validation fell only 0.070: memorizing, though validation still fell.
    docs = {950: 1.041, 1000: 1.034, 1050: 1.036, 1100: 0.972, 1150: 1.064, 1200: 1.028}
    docs |= {1250: 0.958, 1300: 0.987, 1350: 0.915, 1400: 0.93, 1450: 0.839, 1500: 0.924}
    docs |= {1550: 0.851, 1600: 0.845, 1650: 0.778, 1700: 0.824, 1750: 0.744, 1800: 0.755}
    val = {1000: 1.185, 1100: 1.15, 1200: 1.134, 1300: 1.11, 1400: 1.086, 1500: 1.074}
    val |= {1600: 1.066, 1700: 1.06, 1800: 1.064}
    s = summary_of(logged(docs, val), "docs (pydoc_data)")
    assert s["val_gap"] == pytest.approx(0.3145)
    assert s["val_earlier"]["step"] == 1200
    assert s["val_earlier"]["val_gap"] == pytest.approx(0.088)
    assert s["memorizing"]
    (warning,) = [line for line in summary_lines(s) if "warning" in line]
    assert "past a gap of 0.1 nats/byte and growing faster than validation falls" in warning

    # The same run at step 1,500: 1.074 - (0.839 + 0.924) / 2 = +0.1925 against 1,000's
    # 1.185 - (1.041 + 1.034) / 2 = +0.1475: grown 0.045 while validation fell 0.111.
    # (Against the evaluation just before, 1,400's +0.1635, the gap grew 0.029 and
    # validation fell 0.012: over 100 steps the noise of two logged batches decides.)
    at_1500 = summary_of(logged({k: v for k, v in docs.items() if k <= 1500}, val), "docs")
    assert at_1500["val_gap"] == pytest.approx(0.1925)
    assert at_1500["val_earlier"]["step"] == 1000
    assert at_1500["val_earlier"]["val_gap"] == pytest.approx(0.1475)
    assert not at_1500["memorizing"]

    # Seen less than once, the data cannot have been learned by heart: each training
    # batch was new, as validation is. At step 60, 2.75 - (2.62 + 2.58) / 2 = +0.15,
    # grown 0.25 from 2.85 - (3.0 + 2.9) / 2 = -0.10 while validation fell 0.10: a
    # warning after 2 passes, none after 0.15 (the tiny preset's, about).
    short = logged({20: 3.0, 30: 2.9, 50: 2.62, 60: 2.58}, {30: 2.85, 60: 2.75})
    assert summary_of(short, "docs", passes=2)["memorizing"]
    s = summary_of(short, "docs", passes=0.15)
    assert s["val_gap"] == pytest.approx(0.15)
    assert s["val_earlier"]["val_gap"] == pytest.approx(-0.1)
    assert s["passes"] == 0.15 and not s["memorizing"]

    # Within 0.1 no gap warns, even one growing while validation stalls: at step 60
    # 2.01 - (1.96 + 1.94) / 2 = +0.06, grown 0.04 from 2.02 - 2.00 while validation
    # fell 0.01.
    s = summary_of(logged({30: 2.0, 40: 2.0, 50: 1.96, 60: 1.94}, {40: 2.02, 60: 2.01}), "x")
    assert s["val_gap"] == pytest.approx(0.06)
    assert s["val_earlier"]["val_gap"] == pytest.approx(0.02)
    assert not s["memorizing"]


def test_steadiness_in_the_summary_by_hand():
    """Log intervals at 1,000 (the first: compile and warm-up, not counted), then
    500, 400, 500 and 625 tokens/s: 2.0, 2.5, 2.0 and 1.6 ms a token, median 2.0;
    the farthest, 2.5, is 25% off it. Two intervals give no figure."""
    history = logged({10: 3.0, 20: 2.9, 30: 2.8, 40: 2.7, 50: 2.6}, {})
    for r, rate in zip(history, (1000, 500, 400, 500, 625)):
        r["tokens_per_sec"] = rate
    s = summary_of(history, "docs")
    assert s["steadiness"] == pytest.approx(0.25)
    assert "  steadiness  25.0%: the log interval farthest from their median, after the first" in (
        summary_lines(s)
    )
    assert summary_of(history[:2], "docs")["steadiness"] is None


def _adam_moments(opt_state):
    (adam,) = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    ]
    return adam.mu, adam.nu


def test_clipping_bounds_a_huge_gradient(cfg):
    """Clipped to global norm 1, a gradient of norm 1e6 enters Adam's moments
    exactly as the same direction at norm 1 would; a gradient under the clip
    enters as it is. (Adam divides the scale out of the first update, so it is
    the moments that show a missing clip: they would be 1e6 times larger.)"""
    tc = TrainConfig(clip=1.0)
    optimizer = make_optimizer(tc, 10)
    params = init_params(cfg, jax.random.key(0))
    direction = jax.tree.map(lambda w: jnp.ones_like(w), params)
    norm = float(optax.tree.norm(direction))
    unit = jax.tree.map(lambda g: g / norm, direction)

    def moments(norm):
        grads = jax.tree.map(lambda g: norm * g, unit)
        _, state = optimizer.update(grads, optimizer.init(params), params)
        return _adam_moments(state)

    for norm, clipped in [(1e6, 1.0), (0.5, 0.5)]:
        for a, b in zip(jax.tree.leaves(moments(norm)), jax.tree.leaves(moments(clipped))):
            np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=f"gradient norm {norm}")


def test_weight_decay_shrinks_matrices_and_spares_norm_scales(cfg):
    """Zero gradients, so only the decay moves anything. The first update has
    learning rate 0 (warm-up starts there); after one warm-up step the second
    has the peak, 0.1, and decay 0.5 multiplies each matrix by 1 - 0.1 * 0.5."""
    tc = TrainConfig(lr=0.1, warmup=1, weight_decay=0.5)
    optimizer = make_optimizer(tc, 10)
    params = init_params(cfg, jax.random.key(0))
    state = optimizer.init(params)
    new = params
    for _ in range(2):
        zeros = jax.tree.map(jnp.zeros_like, new)
        updates, state = optimizer.update(zeros, state, new)
        new = optax.apply_updates(new, updates)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, before), after in zip(flat, jax.tree.leaves(new)):
        name = jax.tree_util.keystr(path)
        factor = 1.0 if name.endswith("norm']") else 0.95
        np.testing.assert_allclose(after, factor * before, rtol=1e-6, err_msg=name)

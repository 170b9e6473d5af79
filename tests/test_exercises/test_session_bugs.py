"""Find the bug: each fix or diagnosis graded by behaviour (the loss, a
compile count, output shardings, what the host waited for), never by time."""

import functools
import pathlib
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

from sessions.model import init_params
from sessions.model.attention import einsum_attention
from sessions.model.config import ModelConfig, TrainConfig
from sessions.shard.sharding import make_mesh, tree_shardings
from sessions.train import data
from sessions.train.step import init_state, make_optimizer, make_train_step

from .deadlines import take
from .expect import expect

inputs_from_targets = exercise("bug_zero_inputs.inputs_from_targets")
train_loop = exercise("bug_host_sync.train_loop")
count_compiles = exercise("bug_recompile.count_compiles")
make_sgd_step = exercise("bug_recompile.make_sgd_step")
make_sharded_init = exercise("bug_device_put_init.make_sharded_init")
workers_needed = exercise("bug_slow_loader.workers_needed")
parallel_loader = exercise("bug_slow_loader.parallel_loader")
xla_flops = exercise("bug_attention_flops.xla_flops")
attention_flops = exercise("bug_attention_flops.attention_flops")
lookup = exercise("bug_bf16_scatter.lookup")
scatter_dtypes = exercise("bug_bf16_scatter.scatter_dtypes")


class Compiles:
    """Counts XLA compiles while active (the test's own count, not the student's)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __enter__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def _listen(self, event, duration, **kwargs):
        self.count += event == self.EVENT

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


# Inputs built by shifting an all-zero array.


@pytest.mark.exercise("bug_zero_inputs.inputs_from_targets")
def test_inputs_are_the_targets_shifted_right():
    targets = np.arange(1, 13, dtype=np.int32).reshape(2, 6)
    inputs = np.asarray(inputs_from_targets(targets))
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1], err_msg="inputs[:, 1:]")
    np.testing.assert_array_equal(inputs[:, 0], 0, err_msg="inputs[:, 0]")


@pytest.mark.exercise("bug_zero_inputs.inputs_from_targets")
def test_with_the_fixed_inputs_the_loss_falls_below_unigram(record_property):
    """Session 1's model, fed the previous byte, beats the unigram entropy in 30 steps."""
    cfg = ModelConfig(
        embed=32, ff=64, heads=1, head_dim=8, layers=1, seq=32, attention=False, positions=False
    )
    tc = TrainConfig(steps=30, batch=16, lr=2e-2, warmup=3)
    tokens, _ = data.split(data.load_corpus(), cfg.seq)
    optimizer = make_optimizer(tc, tc.steps)
    state = init_state(jax.random.key(0), cfg=cfg, optimizer=optimizer)
    step_fn = make_train_step(cfg, optimizer)
    losses = []
    for step in range(tc.steps):
        targets = data.get_batch(tokens, step, batch=tc.batch, seq=cfg.seq, seed=0)["targets"]
        inputs = np.asarray(inputs_from_targets(targets), dtype=np.int32)
        state, metrics = step_fn(state, {"inputs": inputs, "targets": targets})
        losses.append(metrics["loss"])
    final = float(np.mean(jax.device_get(losses)[-5:]))
    unigram = data.unigram_entropy(tokens)
    record_property("measured", f"loss {final:.2f} after {tc.steps} steps, unigram {unigram:.2f}")
    what = f"the loss after {tc.steps} steps, 0.2 below the unigram entropy {unigram:.3f}"
    expect(final, below=unigram - 0.2, unit="nats/byte", what=what)


# A host sync every step.


def slow_step():
    """A step of a few milliseconds of matmuls: long next to a loop iteration."""

    @jax.jit
    def step(state, batch):
        w = state
        for _ in range(4):
            w = jnp.tanh(w @ w) * 0.5 + batch
        return w, {"loss": jnp.mean(w)}

    return step


@pytest.mark.exercise("bug_host_sync.train_loop")
def test_train_loop_returns_every_loss_in_order():
    step = slow_step()
    state = jnp.eye(64)
    batches = [jnp.float32(i) for i in range(7)]
    expected, s = [], state
    for b in batches:
        s, m = step(s, b)
        expected.append(float(m["loss"]))
    final, losses = train_loop(step, state, iter(batches), log_every=3)
    assert len(losses) == 7, f"{len(losses)} losses for 7 steps"
    np.testing.assert_allclose(losses, expected, rtol=1e-6, err_msg="losses")
    np.testing.assert_allclose(final, s, rtol=1e-6, err_msg="final state")


@pytest.mark.exercise("bug_host_sync.train_loop")
def test_train_loop_dispatches_the_next_step_without_waiting(record_property):
    """At each dispatch, was the previous step already finished? A loop that
    syncs every step always finds it finished; one that does not finds it still
    running (a step takes milliseconds, dispatching the next microseconds).
    Finishing is allowed only after a log step."""
    step, log_every, steps = slow_step(), 4, 12
    state = jax.random.normal(jax.random.key(0), (512, 512)) / 24
    jax.block_until_ready(step(state, jnp.float32(0)))  # compile outside the loop
    outputs, finished_at_dispatch = [], {}

    def watched_step(state, batch):
        if outputs:
            i = len(outputs) - 1
            finished_at_dispatch[i] = all(x.is_ready() for x in jax.tree.leaves(outputs[-1]))
        out = step(state, batch)
        outputs.append(out)
        return out

    train_loop(watched_step, state, iter([jnp.float32(0)] * steps), log_every=log_every)
    checked = {i: done for i, done in finished_at_dispatch.items() if (i + 1) % log_every}
    waited = [i for i, done in checked.items() if done]
    record_property("measured", f"host waited before {len(waited)} of {len(checked)} dispatches")
    assert len(waited) < len(checked) / 2, (
        f"the host waited for steps {waited} before dispatching the next one "
        f"(only every {log_every}th step may wait)"
    )


# Recompiling every call.


def sgd_inputs():
    x = jax.random.normal(jax.random.key(0), (32, 8))
    return jnp.zeros(8), x, x @ jnp.arange(8.0)


@pytest.mark.exercise("bug_recompile.count_compiles")
def test_count_compiles_sees_a_static_argument_recompile():
    w = jnp.zeros(8)
    static = jax.jit(lambda w, lr: w * lr, static_argnums=1)
    traced = jax.jit(lambda w, lr: w * lr)
    three_rates = [(w, 0.1), (w, 0.2), (w, 0.3)]
    expect(count_compiles(static, three_rates), 3, "compiles", "3 rates, lr static")
    expect(count_compiles(traced, three_rates), 1, "compiles", "3 rates, lr traced")
    expect(count_compiles(traced, [(w, 0.4)]), 0, "compiles", "a 4th rate, compiled already")


@pytest.mark.exercise("bug_recompile.make_sgd_step")
def test_the_fixed_step_compiles_once_for_every_learning_rate(record_property):
    w, x, y = sgd_inputs()
    step = make_sgd_step()
    with Compiles() as compiles:
        for i in range(4):
            w = jax.block_until_ready(step(w, x, y, 0.1 / (1 + i)))
    record_property("measured", f"{compiles.count} compile(s) in 4 steps with 4 learning rates")
    expect(compiles.count, 1, "compiles", "4 steps with 4 learning rates")
    # The same arithmetic as the broken step.
    w_ref = jnp.zeros(8)
    for i in range(4):
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w_ref)
        w_ref = w_ref - 0.1 / (1 + i) * grad
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, err_msg="not the broken step's arithmetic")


# Parameters built on one device, then moved.

INIT_CFG = ModelConfig(embed=24, ff=40, heads=4, head_dim=8, layers=2, seq=16)


@pytest.mark.exercise("bug_device_put_init.make_sharded_init")
def test_the_initialisers_outputs_are_born_sharded(key):
    mesh = make_mesh({"data": 1, "fsdp": 2, "tp": 4}, jax.devices()[:8])
    init = make_sharded_init(INIT_CFG, mesh)
    assert hasattr(init, "lower"), "make_sharded_init must return a jax.jit-ed function of the key"
    compiled = init.lower(key).compile()
    expected = tree_shardings(jax.eval_shape(functools.partial(init_params, INIT_CFG), key), mesh)
    got = compiled.output_shardings
    assert jax.tree.structure(got) == jax.tree.structure(expected), (
        f"not the params' tree: {jax.tree.structure(got)}"
    )
    shapes = jax.tree.leaves(jax.eval_shape(functools.partial(init_params, INIT_CFG), key))
    for s, g, e in zip(shapes, jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert g.is_equivalent_to(e, len(s.shape)), f"{s.shape}: born {g}, expected {e.spec}"
    params = init(key)
    for x, want in zip(jax.tree.leaves(params), jax.tree.leaves(init_params(INIT_CFG, key))):
        np.testing.assert_allclose(x, want, atol=1e-6, err_msg="not init_params' values")


# A loader slower than the step.


@pytest.mark.exercise("bug_slow_loader.workers_needed")
def test_workers_needed_by_hand():
    expect(workers_needed(0.020, 0.005), 4, "workers", "20 ms loads, 5 ms steps")
    expect(workers_needed(0.021, 0.005), 5, "workers", "21 ms loads, 5 ms steps")
    expect(workers_needed(0.001, 0.005), 1, "workers", "1 ms loads, 5 ms steps")


@pytest.mark.exercise("bug_slow_loader.parallel_loader")
def test_parallel_loader_loads_workers_batches_at_once_in_order():
    """Each batch waits at a barrier until `workers` loads are running together:
    a loader that is not parallel breaks the barrier."""
    workers, steps = 3, 12
    barrier = threading.Barrier(workers, timeout=5)
    lock, running, most = threading.Lock(), [0], [0]

    def make_batch(step):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            raise AssertionError(f"fewer than {workers} batches were loading at once") from None
        with lock:
            running[0] -= 1
        return step

    taken, error = take(parallel_loader(make_batch, steps, workers), pause_s=0.01)
    if error is not None:
        raise error
    expect(taken, list(range(steps)), "", f"the batches of {steps} steps, in order")
    assert most[0] <= workers + 1, f"{most[0]} loads at once with {workers} workers"


@pytest.mark.exercise("bug_slow_loader.parallel_loader")
def test_parallel_loader_keeps_at_most_workers_in_flight():
    workers, made, taken = 2, [], []
    batches = parallel_loader(lambda step: made.append(step) or step, 20, workers)
    for _ in range(20):
        item, error = take(batches, 1)  # one at a time, each under a deadline
        assert error is None and item, f"after {taken}: {item}, {error!r}"
        taken += item
        time.sleep(0.01)  # a slow consumer: an unbounded loader runs away meanwhile
        assert len(made) <= len(taken) + workers, f"{len(made)} made, {len(taken)} taken"
    expect(taken, list(range(20)), "", "the batches of 20 steps, in order")


# Attention FLOPs counted the wrong way.


@pytest.mark.exercise("bug_attention_flops.xla_flops")
def test_xla_flops_counts_a_matmul():
    a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
    expect(xla_flops(jnp.matmul, a, b), 2 * 8 * 16 * 4, "FLOPs", "[8, 16] @ [16, 4]")


@pytest.mark.exercise("bug_attention_flops.attention_flops")
def test_attention_flops_by_hand_and_against_xla(record_property):
    B, S, T, H, D = 2, 16, 24, 3, 64
    what = f"B={B}, S={S}, T={T}, H={H}, D={D}"
    expect(attention_flops(B, S, T, H, D), 4 * B * S * T * H * D, "FLOPs", what)
    q = jnp.ones((B, S, H, D))
    kv = jnp.ones((B, T, H, D))
    cost = jax.jit(einsum_attention).lower(q, kv, kv).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    record_property(
        "measured", f"attention: counted {attention_flops(B, S, T, H, D):,}, XLA {xla:,.0f}"
    )
    # XLA also counts the softmax: a few FLOPs per score against 4*D.
    got = attention_flops(B, S, T, H, D)
    expect(got, pytest.approx(xla, rel=0.1), "FLOPs", f"{what}: XLA's count, within 10%")


# An embedding whose gradient is summed in bf16.


def skewed_batch(vocab=256, embed=48):
    """A table, tokens with the space byte (32) at 30% of 1,024 positions, and a
    cotangent for the lookup's output, exact in bf16."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (16, 64))
    tokens[rng.random(tokens.shape) < 0.3] = 32
    table = jnp.asarray(rng.standard_normal((vocab, embed)), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal((*tokens.shape, embed)), jnp.bfloat16)
    return table, jnp.asarray(tokens), cotangent


def float64_sum(tokens, cotangent, vocab, embed):
    expected = np.zeros((vocab, embed))
    np.add.at(expected, np.asarray(tokens), np.asarray(cotangent.astype(jnp.float32), np.float64))
    return expected


@pytest.mark.exercise("bug_bf16_scatter.lookup")
def test_the_lookup_sums_its_gradient_in_float32():
    table, tokens, cotangent = skewed_batch()
    x, vjp = jax.vjp(lambda w: lookup(w, tokens, jnp.bfloat16), table)
    assert x.dtype == jnp.bfloat16, f"the lookup is {x.dtype}, expected bfloat16"
    expect(x.shape, (*tokens.shape, table.shape[1]), "", "the lookup's shape [B, S, E]")
    np.testing.assert_array_equal(x, table.astype(jnp.bfloat16)[tokens])
    expected = float64_sum(tokens, cotangent, *table.shape)
    np.testing.assert_allclose(vjp(cotangent)[0], expected, rtol=1e-5, atol=1e-5)


# An f32 sum, and a bf16 sum as XLA's CPU compiler in JAX 0.10 writes it: an f32
# scatter whose combiner rounds each sum to bf16 (later versions keep it in bf16).
WIDENED = pathlib.Path(__file__).parents[1] / "fixtures" / "scatters.hlo.txt"


@pytest.mark.exercise("bug_bf16_scatter.scatter_dtypes")
def test_scatter_dtypes_reads_what_the_compiler_made():
    from solutions.bug_bf16_scatter import broken_embedding_grad

    table, tokens, cotangent = skewed_batch()

    def fixed(table, tokens, cotangent):
        _, vjp = jax.vjp(lambda w: w[tokens].astype(jnp.bfloat16), table)
        return vjp(cotangent)[0]

    def hlo(f):
        return jax.jit(f).lower(table, tokens, cotangent).compile().as_text()

    got = scatter_dtypes(hlo(broken_embedding_grad))
    expect(got, {"bf16"}, "", "broken_embedding_grad's program")
    expect(scatter_dtypes(hlo(fixed)), {"f32"}, "", "the fixed lookup's program")
    expect(scatter_dtypes(hlo(lambda t, i, c: t * 2)), set(), "", "a program without a scatter")
    got = scatter_dtypes(WIDENED.read_text())
    expect(got, {"f32", "bf16"}, "", "tests/fixtures/scatters.hlo.txt")

"""Find the bug: a step that compiles again at every call.

broken_train() runs a few steps of least-squares SGD with a decaying
learning rate. Each step takes as long as the first, because each is a
new program: `lr` is a static argument, so jit treats every new Python
float as a new program and compiles it. (Static arguments are for values
that change the program's shape or control flow, such as a ModelConfig.)

The tool: count the compiles. jax.monitoring reports every XLA compile
("/jax/core/compile/backend_compile_duration"); a jitted function's
_cache_size() counts the programs it holds; JAX_LOG_COMPILES=1 prints them.
"""

import functools

import jax
import jax.numpy as jnp

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@functools.partial(jax.jit, static_argnames="lr")
def broken_sgd_step(w, x, y, lr):
    """One SGD step on mean((x @ w - y)²). w: [E], x: [B, E], y: [B]."""
    grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - lr * grad


def broken_train(steps=5):
    """A few SGD steps with a decaying learning rate; returns w."""
    x = jax.random.normal(jax.random.key(0), (32, 8))
    y = x @ jnp.arange(8.0)
    w = jnp.zeros(8)
    for step in range(steps):
        w = broken_sgd_step(w, x, y, lr=0.1 / (1 + step))
    return w


def count_compiles(fn, calls):
    """How many programs XLA compiles while fn(*args) runs for each args in calls.

    calls: a list of argument tuples. Returns an int: for broken_sgd_step
    with a different lr in each of 3 calls, 3.
    Hint: jax.monitoring.register_event_duration_secs_listener(listener),
    where listener(event, duration, **kwargs) counts event == COMPILE_EVENT;
    jax.monitoring.unregister_event_duration_listener(listener) afterwards
    (in a finally:). Block on each result so every compile has happened.
    """
    raise NotImplementedError


def make_sgd_step():
    """broken_sgd_step fixed: a jitted (w, x, y, lr) -> new w that compiles once.

    Same arithmetic; lr becomes an ordinary (traced) argument, so any float
    value runs the same program.
    Hint: jax.jit with no static arguments.
    """
    raise NotImplementedError

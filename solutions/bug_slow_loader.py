"""Find the bug: a loader slower than the step, which no prefetch depth hides.

broken_run() feeds a quick step (a few milliseconds) from a loader that
needs load_s per batch, through sessions/train/prefetch.py's Prefetcher, 8 batches
deep. It runs at one step per load_s all the same: a prefetcher hides
loading only while loading one batch is faster than one step. A deeper
queue just takes longer to drain; in the steady state the train waits for
the track. The fix is to lay track on several threads at once.

The tool: time a step and time a batch, apart. If load_s > step_s, the
loader sets the pace.
"""

import collections
import concurrent.futures
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from sessions.train.prefetch import Prefetcher


def broken_run(steps=20, load_s=0.02, depth=8):
    """Seconds per step of a quick step fed by a slow loader, prefetched `depth` deep."""

    def make_batch(step):
        time.sleep(load_s)  # reading and decoding from slow storage
        return np.full((8, 64), step, np.float32)

    step_fn = jax.jit(lambda w, x: w + jnp.tanh(x @ x.T).sum())
    w = jnp.zeros(())
    with Prefetcher(make_batch, jax.device_put, depth=depth) as batches:
        w = step_fn(w, next(batches)).block_until_ready()  # compile outside the clock
        start = time.perf_counter()
        for _ in range(steps):
            w = step_fn(w, next(batches))
        w.block_until_ready()
    return (time.perf_counter() - start) / steps


def workers_needed(load_s, step_s):
    """Loader threads needed so batches arrive as fast as steps finish: an int >= 1.

    With n threads loading at once, a batch is ready every load_s / n
    seconds; it must be at most step_s.
    """
    return max(1, math.ceil(load_s / step_s))


def parallel_loader(make_batch, steps, workers):
    """Yield make_batch(0), ..., make_batch(steps - 1) in order, `workers` loading at once.

    At most `workers` batches are in flight (being made or made and not yet
    taken), so memory stays bounded however slow the consumer is.
    Hint: concurrent.futures.ThreadPoolExecutor(workers); keep a
    collections.deque of submitted futures, submit ahead until it holds
    `workers`, then yield the oldest one's .result().
    """
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        in_flight = collections.deque()
        for step in range(steps):
            in_flight.append(pool.submit(make_batch, step))
            if len(in_flight) == workers:
                yield in_flight.popleft().result()
        while in_flight:
            yield in_flight.popleft().result()

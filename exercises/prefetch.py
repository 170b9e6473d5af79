"""Overlapped loading: lay the track faster than the train.

The training step is dispatched asynchronously: it returns while the device
works. If the next batch is then cut and copied in the same thread, the
device waits meanwhile. A background thread that keeps `depth` batches
ready hides the loading whenever one batch loads faster than one step runs
(sessions/train/prefetch.py is the course's full version).
"""

import queue
import threading


def prefetch(make_batch, steps, depth=2):
    """Yield make_batch(0), ..., make_batch(steps - 1) in order, each made on a
    background thread that stays up to `depth` batches ahead of the consumer.

    make_batch: step -> batch (in training: cut the batch, jax.device_put it;
    device_put is asynchronous, so the copy overlaps too). "depth ahead":
    once the consumer has taken n batches, the thread has made at most
    n + depth + 1 (depth waiting, one finished and waiting for room).
    An exception raised by make_batch is raised to the consumer, in order.
    Hint: a generator; a threading.Thread(daemon=True) that puts (ok, value)
    pairs into queue.Queue(maxsize=depth); put() blocks while the queue is
    full, which is what keeps the thread from running further ahead.
    """
    raise NotImplementedError

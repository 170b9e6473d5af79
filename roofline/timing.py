"""The one timing helper: compile excluded, block until ready, repeats,
median and spread.

JAX dispatches work and returns at once; a clock read right after a call
measures the dispatch, not the work. So every timed call ends in
`jax.block_until_ready`, and the first calls (which compile and warm caches)
are run but not counted.
"""

import dataclasses
import statistics
import time

import jax


@dataclasses.dataclass(frozen=True)
class Timing:
    times: tuple  # seconds, one per counted call

    @property
    def median(self):
        return statistics.median(self.times)

    @property
    def best(self):
        return min(self.times)

    @property
    def spread(self):
        """(fastest, slowest) of the counted calls."""
        return min(self.times), max(self.times)

    def __str__(self):
        lo, hi = self.spread
        spread = f"{lo * 1e3:.1f}-{hi * 1e3:.1f}"
        return f"{self.median * 1e3:.1f} ms (median of {len(self.times)}, {spread})"


def time_calls(call, repeats=10, warmup=1):
    """Time `call()` (which returns arrays to wait for) `repeats` times after
    `warmup` uncounted calls. A call may carry state from one call to the next
    through a closure, as a training step with donated state must."""
    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return Timing(tuple(times))


def steadiness(window_seconds):
    """How steady a run is: max |window - median| / median of the windows'
    seconds after the first (which holds compilation or warm-up), each window
    the same number of steps; 0.0 with fewer than two windows after the first.
    A step whose cost follows the values it computes on (an atomic bf16 sum did,
    on an H100) shows here before anywhere else."""
    later = list(window_seconds)[1:]
    if len(later) < 2:
        return 0.0
    middle = statistics.median(later)
    return max(abs(t - middle) for t in later) / middle

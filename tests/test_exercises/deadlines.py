"""Deadlock guards for the tests of threaded exercises (loaders, prefetchers).

A broken loader should fail its test, not hang the whole run. The timeouts
here only bound how long a test waits for something that should happen at
once; they never judge speed.
"""

import threading
import time

import pytest


def wait_until(condition, what, timeout=5):
    """Poll until condition() holds; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s: {what}")
        time.sleep(0.005)


def take(iterator, n=None, timeout=20, pause_s=0.0):
    """Up to n items of iterator (all of them if n is None), taken on a helper
    thread, pausing pause_s after each like a consumer with work of its own.

    Returns (items, error): error is the exception the iterator raised, or None."""
    items, error = [], []

    def run():
        try:
            for item in iterator:
                items.append(item)
                time.sleep(pause_s)
                if n is not None and len(items) == n:
                    return
        except Exception as e:
            error.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"the loader yielded {len(items)} batches, then nothing for {timeout} s")
    return items, (error[0] if error else None)

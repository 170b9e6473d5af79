"""Overlapped data loading: lay the track faster than the train.

A loop that loads each batch only once the previous step is done (session 1:
it reads its loss every step, then loads) leaves the devices idle while the
host reads, cuts and copies the next batch. A background thread that keeps
`depth` batches ready, already on the devices, hides that time whenever
loading one batch is faster than one step: `--no-overlap` turns it off, and
`--data-delay-ms` makes loading slow enough to see the difference.

A subtlety worth a look in the trace: JAX dispatches a jitted step
asynchronously, so a loop that never waits on the device already loads the
next batch while the current step runs, even without this thread. The thread
keeps that overlap when the loop does wait (a loss read for logging, a
checkpoint), and moves the copy to the devices off the dispatching thread.
"""

import queue
import threading


class Prefetcher:
    """Yields place(make_batch(step)) for step = start, start + 1, ... in order,
    produced on a background thread up to `depth` batches ahead.

    events, if a list, records ("load", step) when a batch is ready and
    ("take", step) when the consumer takes it, so a test can see the thread
    run ahead without timing anything.
    """

    _DONE = object()

    def __init__(self, make_batch, place, start=0, depth=2, events=None):
        self._make_batch, self._place = make_batch, place
        self._step = start
        self._events = events
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(start,), daemon=True)
        self._thread.start()

    def _work(self, step):
        try:
            while not self._stop.is_set():
                # device_put is asynchronous too: the copy to the devices
                # proceeds while this thread cuts the next batch.
                batch = self._place(self._make_batch(step))
                if self._events is not None:
                    self._events.append(("load", step))
                while not self._stop.is_set():
                    try:
                        self._queue.put((step, batch), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1
        except Exception as e:
            self._queue.put((None, e))

    def __iter__(self):
        return self

    def __next__(self):
        step, batch = self._queue.get()
        if step is None:
            raise batch
        assert step == self._step, f"prefetcher out of order: {step} != {self._step}"
        self._step += 1
        if self._events is not None:
            self._events.append(("take", step))
        return batch

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Synchronous:
    """The same batches, loaded in the training loop itself (--no-overlap)."""

    def __init__(self, make_batch, place, start=0):
        self._make_batch, self._place, self._step = make_batch, place, start

    def __iter__(self):
        return self

    def __next__(self):
        batch = self._place(self._make_batch(self._step))
        self._step += 1
        return batch

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

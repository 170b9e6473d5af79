"""The engine's one thread: requests come in through a queue, each request's tokens go out
to its HTTP handler's asyncio queue as the steps make them.

The engine is not thread safe, so every call to it (add_request, abort_request, step,
stats) happens on this thread, as JetStream's orchestrator.py owns its engine's queues and
threads, and vLLM's API server hands requests to its engine core. The event loop puts
commands in a queue.SimpleQueue; this thread answers through loop.call_soon_threadsafe into
the request's asyncio.Queue, in order:

    ("added",)                       the engine took the request
    ("tokens", [ids], finished)      the tokens one step made for it
    ("error", status, message, code) it ends without finishing: the engine refused it (400),
                                     the server is stopping (503), the engine failed (500)

Backpressure is counted here: requests accepted and not yet finished, less those the engine
said were running after its last step, are the ones waiting; past max_queue a request is
refused at once (429), never queued without bound.
"""

import asyncio
import contextlib
import dataclasses
import queue
import sys
import threading
import time

IDLE_WAKE_S = 0.5  # an idle thread looks at the clock this often (a stop with nothing to do)


class Refused(Exception):
    """A request turned away before the engine sees it: `status` 429 or 503, and why."""

    def __init__(self, status, message, code):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclasses.dataclass
class InFlight:
    """A request between its handler and the engine: what add_request takes, where its
    events go, and its clock (time.perf_counter(): its arrival and its last token)."""

    request_id: str
    prompt_token_ids: list
    max_tokens: int
    temperature: float
    seed: int | None
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival_s: float
    last_token_s: float | None = None


class Orchestrator:
    """Owns the engine, its thread and the queues; metrics is a ServerMetrics."""

    def __init__(self, engine, metrics, *, max_queue):
        self.engine, self.metrics, self.max_queue = engine, metrics, max_queue
        self.inbox = queue.SimpleQueue()  # put() is safe even from a signal handler
        self.lock = threading.Lock()  # guards the two counts below
        self.unfinished = 0  # accepted by submit, not yet finished, failed or aborted
        self.running = 0  # the engine's stats()["running"] after its last step
        self.closing = False
        self.deadline_s = None  # set by close: past it, the requests left get an error
        self.in_flight = {}  # request_id -> InFlight; the engine thread's alone
        self.outbox = []  # (request, event) to send once the step's counts are published
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)

    def start(self):
        self.thread.start()

    def alive(self):
        return self.thread.is_alive() and not self.closing

    def submit(self, request_id, prompt_token_ids, max_tokens, temperature, seed):
        """The asyncio.Queue of the request's events (called on the event loop), or Refused
        past the queue limit or while the server stops."""
        with self.lock:
            if self.closing:
                raise Refused(503, "the server is shutting down", "shutting_down")
            if self.unfinished - self.running >= self.max_queue:
                raise Refused(
                    429, f"{self.max_queue} requests are waiting already; retry later", "queue_full"
                )
            self.unfinished += 1
        loop = asyncio.get_running_loop()
        request = InFlight(
            request_id,
            prompt_token_ids,
            max_tokens,
            temperature,
            seed,
            asyncio.Queue(),
            loop,
            time.perf_counter(),
        )
        self.inbox.put(("add", request))
        return request.events

    def abort(self, request_id):
        """Free the request's slot and pages (its client went away); unknown ids are ignored."""
        self.inbox.put(("abort", request_id))

    def close(self, grace_s):
        """Refuse new requests; those in flight have grace_s to finish, then get an error.
        Safe from a signal handler: it takes no lock (the handler may interrupt a holder)."""
        self.closing = True
        if self.deadline_s is None:
            self.deadline_s = time.perf_counter() + grace_s
        self.inbox.put(("wake",))

    def join(self, timeout_s):
        self.thread.join(timeout_s)

    # Everything below runs on the engine's thread.

    def run(self):
        try:
            self.loop()
        except Exception as e:  # the engine broke past a step: every client hears, none hangs
            print(f"error: the engine's thread stopped: {e!r}", file=sys.stderr)
            self.closing = True  # submit refuses from now on (503), /health says 503
            with contextlib.suppress(queue.Empty):
                while True:  # requests handed over but never added
                    command = self.inbox.get_nowait()
                    if command[0] == "add":
                        self.in_flight[command[1].request_id] = command[1]
            for request in self.in_flight.values():
                self.send(request, ("error", 500, f"the engine failed: {e!r}", "engine_error"))
            self.flush()

    def loop(self):
        while True:
            busy = self.engine.has_unfinished_requests()
            ended = self.take_commands(block=not busy)
            if self.deadline_s is not None and (
                not self.in_flight or time.perf_counter() >= self.deadline_s
            ):
                ended += self.fail_all(503, "the server is shutting down", "shutting_down")
                self.publish(ended)
                return self.flush()
            if self.engine.has_unfinished_requests():
                try:
                    outputs = self.engine.step()
                except Exception as e:  # an engine bug: fail what it held, serve on
                    print(f"error: the engine's step failed: {e!r}", file=sys.stderr)
                    ended += self.fail_all(500, f"the engine failed: {e!r}", "engine_error")
                    outputs = []
                ended += self.deliver(outputs)
            self.publish(ended)
            self.flush()

    def take_commands(self, block):
        """Add and abort what the handlers sent; the requests that ended here."""
        ended = 0
        try:
            command = self.inbox.get(timeout=IDLE_WAKE_S) if block else self.inbox.get_nowait()
            while True:
                if command[0] == "add":
                    ended += self.add(command[1])
                elif command[0] == "abort" and command[1] in self.in_flight:
                    self.engine.abort_request(command[1])
                    del self.in_flight[command[1]]
                    ended += 1
                command = self.inbox.get_nowait()
        except queue.Empty:
            return ended

    def add(self, request):
        """1 if the engine refused the request (it ended here), else 0."""
        try:
            self.engine.add_request(
                request.request_id,
                request.prompt_token_ids,
                request.max_tokens,
                temperature=request.temperature,
                seed=request.seed,
            )
        except ValueError as e:  # sessions.errors.UsageError among them: bad input
            self.send(request, ("error", 400, str(e), "invalid_value"))
            return 1
        except Exception as e:
            self.send(request, ("error", 500, f"the engine failed: {e!r}", "engine_error"))
            return 1
        self.in_flight[request.request_id] = request
        self.metrics.prompt_tokens.inc(len(request.prompt_token_ids))
        self.send(request, ("added",))
        return 0

    def deliver(self, outputs):
        """Send each request its tokens from one step, timing them; the requests finished."""
        now_s, ended = time.perf_counter(), 0
        for request_id, token_ids, finished in outputs:
            request = self.in_flight.get(request_id)
            if request is None:  # aborted between the step and now
                continue
            self.metrics.generation_tokens.inc(len(token_ids))
            if token_ids and request.last_token_s is None:  # from arrival: queueing included
                self.metrics.ttft.observe(now_s - request.arrival_s)
            elif token_ids:  # a step's tokens share its time: each gets an equal part
                for _ in token_ids:
                    self.metrics.tpot.observe((now_s - request.last_token_s) / len(token_ids))
            if token_ids:
                request.last_token_s = now_s
            if finished:
                del self.in_flight[request_id]
                ended += 1
            self.send(request, ("tokens", list(token_ids), finished))
        return ended

    def fail_all(self, status, message, code):
        for request_id, request in list(self.in_flight.items()):
            self.engine.abort_request(request_id)
            self.send(request, ("error", status, message, code))
        ended, self.in_flight = len(self.in_flight), {}
        return ended

    def publish(self, ended):
        """The engine's counts, to the gauges and to submit's backpressure, in one step."""
        stats = self.engine.stats()
        with self.lock:
            self.unfinished -= ended
            self.running = stats["running"]
        self.metrics.engine_stats(stats)

    def send(self, request, event):
        self.outbox.append((request, event))

    def flush(self):
        """Send the events of this turn, after publish: a client that has its token sees the
        metrics of the step that made it."""
        for request, event in self.outbox:
            with contextlib.suppress(RuntimeError):  # its event loop closed: the server is gone
                request.loop.call_soon_threadsafe(request.events.put_nowait, event)
        self.outbox = []

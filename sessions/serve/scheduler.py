"""The scheduler: which requests run in a step, and how many tokens of each, on the host.

Iteration-level scheduling (Orca, OSDI '22): a request joins or leaves the batch at any
step, not when the whole batch ends. Each step (Sarathi-Serve's stall-free batching):

  1. decodes first: every decoding request, one token each, in its slot. One that
     crosses into a new page gets it; when the pool is dry the NEWEST running request
     is preempted by recompute (vLLM's default): its pages go back, and it returns to
     the FRONT of the queue with its prompt and what it has produced so far, to be
     prefilled again, all of it, when readmitted;
  2. admission, first come first served: while a slot is free and the request's pages
     (prompt and output so far) can be given all or nothing with `keep` pages still
     free (the watermark, so that a new request is not preempted at once). None in a
     step that preempted (vLLM's chunked-prefill scheduler admits no prefill then).
     "static" admits only when every slot is free, and then up to `slots` at once;
  3. prefill chunks, FCFS, of at most prefill_chunk tokens, fill what the decodes left
     of the token budget. A request's last chunk gives its first (next) token.

Only max_tokens stops a request (a byte model has no end-of-text token), so the host
knows every length without reading a token: the schedule never waits on the device.
The decode rows' inputs are numpy arrays [R] kept here and updated row by row.
"""

import dataclasses
from typing import NamedTuple

import numpy as np

from sessions.serve.pages import PagePool


@dataclasses.dataclass(eq=False)
class Request:
    """A request: its tokens (prompt, then output), and where its cache stands."""

    request_id: str
    prompt_len: int
    tokens: list  # the prompt's tokens, then each output token as it comes
    max_tokens: int
    temperature: float
    seed: int
    arrival: int  # order of add_request: older requests are served first, preempted last
    slot: int | None = None
    pages: list = dataclasses.field(default_factory=list)
    cached: int = 0  # tokens whose keys and values are in the pool: positions 0..cached-1
    made: int = 0  # output tokens planned (produced counts those read back)
    prefill_to: int = 0  # at admission, every token it has then: prefilled in chunks

    @property
    def produced(self):
        return len(self.tokens) - self.prompt_len

    @property
    def prefilling(self):
        return self.slot is not None and self.cached < self.prefill_to

    @property
    def decoding(self):
        """Prefilled; every token but the last is in the cache: a step feeds the last."""
        return self.slot is not None and self.cached >= self.prefill_to


class Chunk(NamedTuple):
    """A prefill chunk: request.tokens[start:start + count] into slot's pages; the
    last (final) gives its output token number out_index."""

    request: Request
    slot: int
    start: int
    count: int
    final: bool
    out_index: int
    table: np.ndarray  # int [1, P]: the slot's page table as the chunk writes it


class Plan(NamedTuple):
    """What one step runs: decode rows and prefill chunks."""

    decode: list  # (request, slot): one token each, at the position its row holds
    chunks: list  # Chunks
    preempted: list  # requests sent back to the queue
    rows: tuple  # the decode call's table, position, live, seed, out_index, temperature


class Scheduler:
    """Requests waiting and running; the page pool; the decode rows' inputs."""

    def __init__(self, slots, page_size, pages, seq, policy, prefill_chunk, token_budget, keep):
        self.slots, self.policy, self.keep = slots, policy, keep
        self.prefill_chunk, self.token_budget = prefill_chunk, token_budget
        self.pool = PagePool(pages, page_size)
        self.columns = self.pool.pages_for(seq)  # P: pages of a whole context
        self.waiting, self.running = [], {}  # waiting FCFS; running by slot
        self.free_slots = list(range(slots - 1, -1, -1))  # the lowest slot first
        self.preemptions, self.batch_open = 0, True
        # The decode rows' inputs, a row a slot (paged_cache.paged_step's arguments).
        self.table = np.full((slots, self.columns), self.pool.padding, np.int32)
        self.position = np.zeros(slots, np.int32)
        self.live = np.zeros(slots, np.int32)
        self.seed = np.zeros(slots, np.uint32)
        self.out_index = np.zeros(slots, np.int32)
        self.temperature = np.zeros(slots, np.float32)

    def add(self, request):
        self.waiting.append(request)

    def _give_pages(self, request, n, keep):
        pages = self.pool.allocate(n, keep)
        if pages is None:
            return False
        first = len(request.pages)
        self.table[request.slot, first : first + n] = pages
        request.pages.extend(pages)
        return True

    def release(self, request):
        """A request's slot and pages back, at once (finished, aborted or preempted)."""
        if request.slot is not None:
            self.pool.release(request.pages)
            self.table[request.slot] = self.pool.padding
            self.live[request.slot] = 0
            del self.running[request.slot]
            self.free_slots.append(request.slot)
            self.free_slots.sort(reverse=True)
        request.slot, request.pages, request.cached, request.prefill_to = None, [], 0, 0

    def remove(self, request_id):
        """The request of this id out of the queue or its slot; False if unknown."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return True
        for request in list(self.running.values()):
            if request.request_id == request_id:
                self.release(request)
                return True
        return False

    def _preempt_newest(self):
        victim = max(self.running.values(), key=lambda r: r.arrival)
        self.release(victim)
        self.waiting.insert(0, victim)  # the front: it arrived before every waiter
        self.preemptions += 1
        return victim

    def _admissible(self, request):
        """A free slot, and the pages for all its tokens with the watermark kept (none
        kept when nothing runs: the watermark guards running requests, and a request
        that fits the pool must be able to start alone)."""
        if not self.free_slots or request.produced < request.made:  # tokens still to read
            return False
        keep = self.keep if self.running else 0
        return self.pool.can_allocate(self.pool.pages_for(len(request.tokens)), keep)

    def schedule(self):
        """The next step's plan; pages given, preemptions done, requests admitted, and
        each request advanced as if the step had run (its tokens come later: commit)."""
        preempted = []
        decode = sorted((r for r in self.running.values() if r.decoding), key=lambda r: r.arrival)
        for request in decode:  # oldest first: a victim is newer, not yet given its page
            if request.slot is None:
                continue  # preempted for an older request's page
            if request.cached // self.pool.page_size >= len(request.pages):
                while not self._give_pages(request, 1, 0):
                    preempted.append(self._preempt_newest())
                    if request.slot is None:
                        break
        decode = [(r, r.slot) for r in decode if r.slot is not None]
        self.live[:] = 0
        for request, s in decode:
            self.position[s], self.live[s], self.out_index[s] = request.cached, 1, request.made
        if self.policy == "static" and not self.running:
            self.batch_open = True
        while not preempted and self.batch_open and self.waiting:
            if not self._admissible(self.waiting[0]):
                break
            self._admit(self.waiting.pop(0))
        if self.policy == "static" and self.running:
            self.batch_open = False
        chunks, budget = [], self.token_budget - len(decode)
        prefilling = (r for r in self.running.values() if r.prefilling)
        for request in sorted(prefilling, key=lambda r: r.arrival):
            if budget <= 0:
                break
            count = min(self.prefill_chunk, budget, request.prefill_to - request.cached)
            final = request.cached + count == request.prefill_to
            chunk = (request.slot, request.cached, count, final, request.made)
            chunks.append(Chunk(request, *chunk, self.table[[request.slot]]))
            budget -= count
        # Copies, taken before _advance releases a finishing request's row.
        rows = (self.table, self.position, self.live, self.seed, self.out_index, self.temperature)
        return self._advance(Plan(decode, chunks, preempted, tuple(a.copy() for a in rows)))

    def _advance(self, plan):
        """Each planned request moved on by its step: its cache, the tokens it was
        promised; one whose last token is planned leaves its slot now (its pages are
        written and read by calls already queued, before any later owner's)."""
        for request, _ in plan.decode:
            request.cached += 1
            request.made += 1
        for chunk in plan.chunks:
            chunk.request.cached = chunk.start + chunk.count
            chunk.request.made += chunk.final
        for request in [r for r, _ in plan.decode] + [c.request for c in plan.chunks if c.final]:
            if request.made == request.max_tokens:
                self.release(request)
        return plan

    def _admit(self, request):
        request.slot, request.prefill_to = self.free_slots.pop(), len(request.tokens)
        self.running[request.slot] = request
        s = request.slot
        self.seed[s], self.temperature[s] = request.seed, request.temperature
        self._give_pages(request, self.pool.pages_for(len(request.tokens)), 0)

    @staticmethod
    def commit(request, token):
        """request's next token, once read; True if that was its last."""
        request.tokens.append(int(token))
        return request.produced == request.max_tokens

    def has_work(self):
        return bool(self.waiting or self.running)

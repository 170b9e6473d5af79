"""The engine: requests in, tokens out, a step at a time, with vLLM's LLMEngine face.

    engine = Engine(params, cfg, slots=4, page_size=8, pages=40)
    engine.add_request("a", prompt_token_ids=[...], max_tokens=20)
    while engine.has_unfinished_requests():
        for request_id, new_token_ids, finished in engine.step():
            ...

A step is the scheduler's plan (sessions/serve/scheduler.py) run on the device: one call
of the paged step (sessions/serve/paged_cache.py) for every decoding slot at once, R =
slots rows of one token, then one call a prefill chunk, R = 1 row of prefill_chunk
tokens. Each shape compiles once. The calls are queued without waiting (JAX dispatches
asynchronously), and step() queues the NEXT step before it reads this one's tokens: only
max_tokens stops a request, so the scheduler plans a step without them, and a decode
takes each slot's latest token from the device (paged_cache.slot_step). The device then
never waits for the host to read, plan and dispatch between two steps
(sessions/serve/host_share.py measures what is left).

As the scaling book's inference chapter lays an engine out (prefill, insert into a
slot, one generate over all slots, an orchestrator), and JetStream's engine_api.py names
it; here prefill and insert are one thing, a prefill chunk written straight into the
slot's pages.
"""

import math
import numbers

import jax.numpy as jnp
import numpy as np

from sessions.errors import UsageError
from sessions.inference.kv_cache import check_lengths
from sessions.inference.layout import decode_weights
from sessions.serve.paged_cache import init_pool, pack_rows, slot_step
from sessions.serve.scheduler import Request, Scheduler

POLICIES = ("continuous", "static")
# A near-tie: a greedy token whose top two logits are this close may differ from
# generate()'s under another batch shape's sums (vllm#11658). The course's own threshold.
NEAR_TIE = {"float32": 1e-3, "bfloat16": 1e-2}
# The free pages kept back from admission, as a fraction of the pool: vLLM's default
# watermark (1% of the blocks), rounded up to at least one page, so that a running
# request crossing into its next page finds one rather than preempting a newcomer.
WATERMARK = 0.01


class Engine:
    """Slots decoding as one compiled step, over a paged KV cache.

    slots: decode rows of the step; page_size: N tokens a page; pages: the pool a
    request can be given (one padding page more is kept, counted in neither
    pages_total nor pages_free); policy: "continuous" admits a request whenever a slot
    and its pages are free, "static" only when every slot is free, and then up to
    `slots`; prefill_chunk: the most prompt tokens of one request a step; token_budget:
    the most tokens a step (decodes first, then prefill chunks; default slots +
    prefill_chunk); watermark: the fraction of the pool admission leaves free."""

    def __init__(
        self,
        params,
        cfg,
        *,
        slots,
        page_size,
        pages,
        policy="continuous",
        prefill_chunk=32,
        token_budget=None,
        watermark=WATERMARK,
    ):
        token_budget = slots + prefill_chunk if token_budget is None else token_budget
        if policy not in POLICIES:
            raise UsageError(f"policy {policy!r}: continuous or static")
        for name, value in (("slots", slots), ("page_size", page_size), ("pages", pages)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, not {value}")
        if prefill_chunk < 1 or token_budget < slots + 1:
            raise UsageError(
                f"prefill_chunk ({prefill_chunk}) must be >= 1 and token_budget "
                f"({token_budget}) more than the {slots} slots' decodes"
            )
        if not 0 <= watermark < 1:
            raise UsageError(f"watermark is a fraction of the pool, in [0, 1), not {watermark}")
        self.cfg, self.slots = cfg, slots
        self.prefill_chunk, self.token_budget = prefill_chunk, token_budget
        keep = math.ceil(round(watermark * pages, 9))  # 1% of 40 pages: 1
        self.scheduler = Scheduler(
            slots, page_size, pages, cfg.seq, policy, prefill_chunk, token_budget, keep
        )
        self.weights = decode_weights(params, cfg)
        self.pool = init_pool(cfg, pages, page_size)
        self.last = jnp.zeros(slots, jnp.int32)  # each slot's latest token, on the device
        self.all_rows = np.arange(slots, dtype=np.int32)
        self.no_tokens = jnp.zeros((slots, 1), jnp.int32)  # a decode's: taken from last
        self.pending = None  # the step queued ahead (step())
        self.requests = {}  # by id: waiting or running
        self.arrivals = 0
        self.near_ties = 0
        self.near_tie = NEAR_TIE.get(str(cfg.dtype), NEAR_TIE["bfloat16"])
        self.tokens_this_step = 0

    def pages_needed(self, prompt_len, max_tokens):
        """Pages a request holds at most: its prompt and every output token but the
        last, which is returned, never fed back (ceil((P + G - 1) / N))."""
        return self.scheduler.pool.pages_for(prompt_len + max_tokens - 1)

    def add_request(self, request_id, prompt_token_ids, max_tokens, temperature=0.0, seed=None):
        """Queue a request; UsageError (one line) for one the engine could never serve."""
        prompt = [int(t) for t in prompt_token_ids]
        if request_id in self.requests:
            raise UsageError(f"request {request_id!r} is already queued or running")
        if not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
            raise UsageError(f"max_tokens must be a whole number, at least 1, not {max_tokens}")
        max_tokens = int(max_tokens)
        check_lengths(self.cfg, len(prompt), max_tokens)  # not empty, fits the context
        if min(prompt) < 0 or max(prompt) >= self.cfg.vocab:
            raise UsageError(f"prompt tokens must lie in 0..{self.cfg.vocab - 1}")
        if not temperature >= 0:
            raise UsageError(f"temperature must be 0 (greedy) or positive, not {temperature}")
        need, total = self.pages_needed(len(prompt), max_tokens), self.scheduler.pool.total
        if need > total:
            raise UsageError(
                f"request {request_id!r} needs {need} pages of {self.scheduler.pool.page_size} "
                f"tokens, more than the pool's {total}"
            )
        seed = self.arrivals if seed is None else seed  # reproducible runs
        request = Request(
            request_id, len(prompt), prompt, max_tokens, float(temperature),
            int(seed) % 2**32, self.arrivals,
        )  # fmt: skip
        self.arrivals += 1
        self.requests[request_id] = request
        self.scheduler.add(request)

    def abort_request(self, request_id):
        """Drop a request, queued or running: its slot and pages are free at once. It
        never appears in a step's outputs again. An unknown id is ignored (vLLM's too)."""
        if self.requests.pop(request_id, None) is not None:
            self.scheduler.remove(request_id)

    def has_unfinished_requests(self):
        return bool(self.requests)

    def _call(self, rows, tokens=None):
        """One slot_step queued: rows from pack_rows (a fresh array: on a CPU a numpy
        argument may be aliased by a queued call); tokens None for a decode."""
        from_last = tokens is None
        tokens = self.no_tokens if from_last else tokens
        out, self.pool, self.last = slot_step(
            self.weights, self.pool, self.last, rows, tokens, self.cfg, from_last
        )
        return out

    def _dispatch(self):
        """The scheduler's next plan, queued on the device: one call for every decoding
        slot (rows not live write nothing), one a prefill chunk. -> (plan, results),
        the results still on the device; None when there is nothing to run."""
        sched = self.scheduler
        plan = sched.schedule()
        if not plan.decode and not plan.chunks:
            return None
        decoded = None
        if plan.decode:
            table, position, live, seed, out_index, temperature = plan.rows
            rows = (table, position, live, self.all_rows, seed, out_index, temperature)
            decoded = self._call(pack_rows(*rows))
        prefilled = []
        for chunk in plan.chunks:
            tokens = np.zeros((1, self.prefill_chunk), np.int32)
            tokens[0, : chunk.count] = chunk.request.tokens[chunk.start : chunk.start + chunk.count]
            i = [chunk.slot]
            rows = (chunk.table, [chunk.start], [chunk.count], i, sched.seed[i])
            rows += ([chunk.out_index], sched.temperature[i])
            result = self._call(pack_rows(*rows), tokens)
            if chunk.final:
                prefilled.append((chunk.request, result))
        return plan, decoded, prefilled

    def step(self):
        """One step -> [(request_id, [token], finished)] for each request that got a
        token in it: every decoding slot, and each request whose prefill ended. A
        request preempted in this step, still prefilling, or aborted, is not listed.

        The next step is queued before this one's tokens are read (the schedule needs
        no token: only max_tokens stops a request), so the device never waits for the
        host's reading, scheduling and dispatching between two steps. A request added
        after a step therefore starts one step later than it could."""
        pending = self.pending if self.pending is not None else self._dispatch()
        self.pending = self._dispatch() if pending is not None else None
        if pending is None:
            self.tokens_this_step = 0
            return []
        plan, decoded, prefilled = pending
        self.tokens_this_step = len(plan.decode) + sum(c.count for c in plan.chunks)
        got = []  # (request, token, gap)
        if decoded is not None:
            out = np.asarray(decoded)  # [slots, 2]: token, gap
            got += [(r, out[slot, 0], out[slot, 1]) for r, slot in plan.decode]
        for request, result in prefilled:
            out = np.asarray(result)
            got.append((request, out[0, 0], out[0, 1]))
        outputs = []
        for request, token, gap in got:
            if self.requests.get(request.request_id) is not request:
                continue  # aborted after its step was queued
            if request.temperature == 0 and gap < self.near_tie:
                self.near_ties += 1
            finished = self.scheduler.commit(request, token)
            if finished:
                del self.requests[request.request_id]
            outputs.append((request.request_id, [int(token)], finished))
        return outputs

    def stats(self):
        """The pool and the queues as scheduled (the step queued ahead included):
        pages_total, pages_free, pages_used, running, waiting, preemptions; tokens_held
        (tokens in the cache), tokens_this_step (live tokens in the step step() last
        returned), near_ties (greedy tokens so far whose top two logits were within
        the dtype's NEAR_TIE)."""
        sched = self.scheduler
        return {
            "pages_total": sched.pool.total,
            "pages_free": sched.pool.free,
            "pages_used": sched.pool.used,
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "preemptions": sched.preemptions,
            "tokens_held": sum(r.cached for r in sched.running.values()),
            "tokens_this_step": self.tokens_this_step,
            "near_ties": self.near_ties,
        }


def warm_up(engine, context):
    """Requests through the engine before the clock starts (or a server listens), so that
    its two step shapes compile now, not in the first request's time to its first token:
    a prompt of nearly the whole `context` (its prefill in more than one chunk, if the engine
    chunks it) and a short one beside it (a prefill beside a decode)."""
    engine.add_request("warm-up-long", [ord(" ")] * max(context - 2, 1), 2)
    engine.add_request("warm-up-short", [ord(" ")], 2)
    while engine.has_unfinished_requests():
        engine.step()

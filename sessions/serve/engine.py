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
asynchronously): the host builds the prefill chunks while the device decodes, and reads
the tokens back once, at the end of the step.

As the scaling book's inference chapter lays an engine out (prefill, insert into a
slot, one generate over all slots, an orchestrator), and JetStream's engine_api.py names
it; here prefill and insert are one thing, a prefill chunk written straight into the
slot's pages.
"""

import math

import jax
import numpy as np

from sessions.errors import UsageError
from sessions.inference.kv_cache import check_lengths
from sessions.inference.layout import decode_weights
from sessions.serve.paged_cache import init_pool, paged_step
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
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise UsageError(f"max_tokens must be at least 1, not {max_tokens}")
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
        return self.scheduler.has_work()

    def _call(self, table, tokens, start, count, seeds, out_index, temperature):
        # Copies: on a CPU a numpy argument may be aliased, not copied, by the call, and
        # the scheduler rewrites these arrays in place while a queued call may still run.
        args = [np.array(a) for a in (table, tokens, start, count, seeds, out_index, temperature)]
        token, gap, self.pool = paged_step(self.weights, self.pool, *args, self.cfg)
        return token, gap

    def step(self):
        """One step -> [(request_id, [token], finished)] for each request that got a
        token in it: every decoding slot, and each request whose prefill ended. A
        request preempted in this step, or still prefilling, is not listed."""
        sched = self.scheduler
        plan = sched.schedule()
        decoded = None
        if plan.decode:  # one call for every slot; rows not live write nothing
            s = sched
            decoded = self._call(
                s.table, s.token, s.position, s.live, s.seed, s.out_index, s.temperature
            )
        prefilled = []
        for request, start, count in plan.chunks:
            tokens = np.zeros((1, self.prefill_chunk), np.int32)
            tokens[0, :count] = request.tokens[start : start + count]
            last = start + count == len(request.tokens)
            result = self._call(
                sched.table[request.slot][None], tokens, np.array([start], np.int32),
                np.array([count], np.int32), sched.seed[request.slot][None],
                np.array([request.produced], np.int32),
                sched.temperature[request.slot][None],
            )  # fmt: skip
            if last:
                prefilled.append((request, result))
        self.tokens_this_step = len(plan.decode) + sum(c for _, _, c in plan.chunks)
        got = []  # (request, token, gap), read back once the step's calls are queued
        if decoded is not None:
            token, gap = jax.device_get(decoded)
            got += [(r, token[r.slot], gap[r.slot]) for r in plan.decode]
        for request, (token, gap) in prefilled:
            token, gap = jax.device_get((token, gap))
            got.append((request, token[0], gap[0]))
        outputs = []
        for request, token, gap in got:
            if request.temperature == 0 and gap < self.near_tie:
                self.near_ties += 1
            finished = sched.commit(request, token)
            if finished:
                del self.requests[request.request_id]
            outputs.append((request.request_id, [int(token)], finished))
        return outputs

    def stats(self):
        """The pool and the queues now: pages_total, pages_free, pages_used, running,
        waiting, preemptions; tokens_held (tokens in the cache), tokens_this_step
        (live tokens in the last step), near_ties (greedy tokens so far whose top two
        logits were within the dtype's NEAR_TIE)."""
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

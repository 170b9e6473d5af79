"""Replaying a request stream through an engine in real time, and what each request and
each step saw: the measurements sessions/serve/latency.py reduces.

The loop, one thread, as a benchmark client and an orchestrator together:

    add every request whose arrival time has passed (engine.add_request)
    if the engine has unfinished requests: engine.step(), stamp each new token
    else: sleep until the next arrival (the engine is idle: nothing arrived yet)

Time is seconds from the loop's start, on `clock` (time.perf_counter by default; tests
pass a fake clock and a fake `sleep`). A request is never added before its arrival, and
is added at the first loop turn after it: at once when the engine is idle, else after
the step running when it arrived (so its time to the first token counts that wait).

Per request (a plain dict, the record sessions/serve/latency.py and the HTTP client share):
    request_id, arrival_s, added_s (when the engine was handed it), prompt_len, max_tokens,
    output_len (tokens received), token_times_s (one time a token: the end of the step
    that made it), finished.

Per step (a plain dict):
    start_s, step_s    when engine.step() was called, and how long it took to return
    host_s             the host's gap before this step: from the previous step's return to
                       this call (reading its outputs, stats, adding arrivals), plus the
                       engine's own host time inside step() if its stats report it as
                       "host_s". The engine reads its tokens back before step() returns, so in
                       that gap the device has nothing queued: host_s is the time the device
                       waits on the host. An engine that dispatches step n+1 before returning
                       step n's tokens hides some of it: host_s is then an upper bound. A
                       step after an idle sleep (nothing to run) has host_s 0.
    span_s             the time this step's in_flight stands for: to the next step's call, or
                       to this step's return when the loop then slept (nothing in flight)
    in_flight          requests added and not finished when the step was called (queued
                       ones included: running + waiting)
    running, waiting   the engine's counts after the step
    tokens             live tokens the step computed: stats' tokens_this_step (decodes plus
                       prefill tokens, live rows only), else the new tokens it returned
    kv_utilisation     tokens held / (pages in use × page size), None with no page in use
    kv_utilisation_reserved   tokens held / (running × S): what a cache reserving each running
                       request's whole context S (session 3's contiguous cache) would hold
    preemptions        the engine's count, cumulative
"""

import time
from typing import NamedTuple


class ReplayLog(NamedTuple):
    """What replay saw: a record a request and a record a step (the dicts above)."""

    requests: list  # in arrival order
    steps: list
    preemptions: int  # during the run: the engine's count at the end less at the start


def _pages_used(stats):
    if "pages_used" in stats:
        return stats["pages_used"]
    return stats["pages_total"] - stats["pages_free"]


def _kv(stats, page_size, context):
    """(kv_utilisation, kv_utilisation_reserved) after a step; None where unknown or empty."""
    held = stats.get("tokens_held")
    if held is None or page_size is None:
        return None, None
    used = _pages_used(stats)
    paged = held / (used * page_size) if used else None
    running = stats["running"]
    reserved = held / (running * context) if running and context else None
    return paged, reserved


def replay(engine, requests, *, page_size=None, context=None, clock=None, sleep=None):
    """Run `requests` ([workload.Arrival], any order) through `engine` in real time.

    page_size: tokens a page (N); context: the model's S (cfg.seq); both only for the KV
    figures. Returns a ReplayLog: the per-request and per-step dicts the module docstring
    lists, and the preemptions during the run.
    """
    clock = clock or time.perf_counter
    sleep = sleep or time.sleep
    pending = sorted(requests, key=lambda r: r.arrival_s)
    records = {
        r.request_id: {
            "request_id": r.request_id,
            "arrival_s": r.arrival_s,
            "added_s": None,
            "prompt_len": len(r.prompt_token_ids),
            "max_tokens": r.max_tokens,
            "output_len": 0,
            "token_times_s": [],
            "finished": False,
        }
        for r in pending
    }
    preemptions_before = engine.stats()["preemptions"]
    steps = []
    in_flight = 0
    last_return = None  # when the last step returned, None after an idle sleep
    start = clock()
    nxt = 0
    while True:
        now = clock() - start
        while nxt < len(pending) and pending[nxt].arrival_s <= now:
            r = pending[nxt]
            engine.add_request(
                r.request_id,
                list(r.prompt_token_ids),
                r.max_tokens,
                temperature=r.temperature,
                seed=r.seed,
            )
            records[r.request_id]["added_s"] = now
            in_flight += 1
            nxt += 1
        if engine.has_unfinished_requests():
            called = clock() - start
            if steps and last_return is not None:
                steps[-1]["span_s"] = called - steps[-1]["start_s"]
            outputs = engine.step()
            returned = clock() - start
            tokens_out = 0
            for request_id, new_token_ids, finished in outputs:
                record = records[request_id]
                record["token_times_s"].extend([returned] * len(new_token_ids))
                record["output_len"] += len(new_token_ids)
                tokens_out += len(new_token_ids)
                if finished:
                    record["finished"] = True
            stats = engine.stats()
            paged, reserved = _kv(stats, page_size, context)
            host_gap = called - last_return if last_return is not None else 0.0
            steps.append(
                {
                    "start_s": called,
                    "step_s": returned - called,
                    "host_s": host_gap + stats.get("host_s", 0.0),
                    "span_s": returned - called,
                    "in_flight": in_flight,
                    "running": stats["running"],
                    "waiting": stats["waiting"],
                    "tokens": stats.get("tokens_this_step", tokens_out),
                    "kv_utilisation": paged,
                    "kv_utilisation_reserved": reserved,
                    "preemptions": stats["preemptions"],
                }
            )
            in_flight -= sum(1 for _, _, finished in outputs if finished)
            last_return = returned
        elif nxt < len(pending):
            sleep(max(0.0, pending[nxt].arrival_s - (clock() - start)))
            last_return = None
        else:
            break
    preemptions = engine.stats()["preemptions"] - preemptions_before
    return ReplayLog([records[r.request_id] for r in pending], steps, preemptions)

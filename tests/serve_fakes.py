"""A stand-in for the session-7 engine (sessions.serve.Engine's API over no model), and a
launcher that serves it over HTTP: the server's tests need an engine whose tokens they can
predict and whose steps they can slow down, which no model gives.

    python tests/serve_fakes.py --port 8001 --step-ms 20 --max-queue 1 --slots 1

EchoEngine's token i for a request is its prompt's byte i mod S: a prompt of UTF-8 text
comes back as that text, its characters' bytes split across steps; a prompt of FAIL makes
its steps raise, as an engine's bug would.
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sessions.serve.server import serve  # after the repository is on the path

FAIL = b"fail the step"  # a prompt that makes the step that runs it raise


class EchoEngine:
    """The engine's API: FCFS into `slots`; a request holds the pages of its whole context
    (prompt + max_tokens) from its admission (all or nothing) to its end; each step sleeps
    step_s, then makes one token for each running request (the first in the step that
    admits it, as a prefill does)."""

    def __init__(self, *, slots, page_size, pages, step_s):
        self.slots, self.page_size, self.pages, self.step_s = slots, page_size, pages, step_s
        self.waiting, self.running = [], {}  # request_id -> [prompt, max_tokens, made, pages]
        self.pages_free = pages

    def add_request(self, request_id, prompt_token_ids, max_tokens, temperature=0.0, seed=None):
        if request_id in self.running or any(r[0] == request_id for r in self.waiting):
            raise ValueError(f"request {request_id} is in the engine already")
        if not prompt_token_ids or max_tokens < 1:
            raise ValueError("an empty prompt, or max_tokens < 1")
        needed = math.ceil((len(prompt_token_ids) + max_tokens) / self.page_size)
        if needed > self.pages:
            raise ValueError(f"needs {needed} pages; the pool has {self.pages}")
        self.waiting.append((request_id, list(prompt_token_ids), max_tokens, needed))

    def abort_request(self, request_id):
        self.waiting = [r for r in self.waiting if r[0] != request_id]
        if request_id in self.running:
            self.pages_free += self.running.pop(request_id)[3]

    def step(self):
        time.sleep(self.step_s)
        while self.waiting and len(self.running) < self.slots:
            request_id, prompt, max_tokens, needed = self.waiting[0]
            if needed > self.pages_free:
                break
            self.waiting.pop(0)
            self.pages_free -= needed
            self.running[request_id] = [prompt, max_tokens, 0, needed]
        if any(bytes(request[0]) == FAIL for request in self.running.values()):
            raise RuntimeError("a planted failure of the engine's step")
        outputs = []
        for request_id, request in list(self.running.items()):
            prompt, max_tokens, made, needed = request
            request[2] = made + 1
            finished = made + 1 == max_tokens
            outputs.append((request_id, [prompt[made % len(prompt)]], finished))
            if finished:
                self.pages_free += self.running.pop(request_id)[3]
        return outputs

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def stats(self):
        return {
            "pages_total": self.pages,
            "pages_free": self.pages_free,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "preemptions": 0,
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description="serve EchoEngine over HTTP (tests only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--pages", type=int, default=1024)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--grace-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    engine = EchoEngine(
        slots=args.slots, page_size=args.page_size, pages=args.pages, step_s=args.step_ms / 1000
    )
    serve(
        engine,
        args.host,
        args.port,
        model_name="echo",
        context=args.context,
        max_queue=args.max_queue,
        grace_s=args.grace_s,
        banner=lambda url: f"serving {url}",
    )


if __name__ == "__main__":
    main()

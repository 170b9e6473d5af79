"""The serving loop (session 7): many requests at once, arriving when they like, each with
its own prompt and length. Built on session 3's decode: slots decoding as one compiled step
(continuous batching, Orca), a KV cache handed out in pages (vLLM), prefills chunked beside
the decodes (Sarathi-Serve), an engine with vLLM's LLMEngine face, measured under load, and
put behind OpenAI's API.

    pages.py               the page pool: a free list, allocation all or nothing
    paged_cache.py         the paged KV cache and the one step that decodes and prefills through it
    scheduler.py           which requests run a step: decodes, admission, prefill chunks, preemption
    engine.py              the engine: add_request, step, abort_request, stats
    host_share.py          the host's share of a decode step, measured
    workload.py            the request stream: gamma arrivals, lengths, prompts of real text
    replay.py              a stream run through an engine in real time: each token's time, each step
    latency.py             TTFT, TPOT, ITL, E2E, throughput and goodput, from plain records
    server.py              the engine behind OpenAI's API (FastAPI, uvicorn), /metrics
    orchestrator.py        the engine's one thread, between the handlers and the engine
    completion_request.py  a completion request, checked before the engine sees it
    metrics.py             the server's Prometheus metrics, vLLM's names

    from sessions.serve import Engine
"""

from sessions.serve.engine import Engine

__all__ = ["Engine"]

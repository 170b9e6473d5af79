"""Serving: many requests at once, arriving when they like, each with its own prompt and
length. Session 7 builds it on session 3's decode: slots decoding as one compiled step
(continuous batching, Orca), a KV cache handed out in pages (vLLM), prefills chunked
beside the decodes (Sarathi-Serve), and an engine with vLLM's LLMEngine face.

    pages.py        the page pool: a free list, allocation all or nothing
    paged_cache.py  the paged KV cache and the one step that decodes and prefills through it
    scheduler.py    which requests run a step: decodes, admission, prefill chunks, preemption
    engine.py       the engine: add_request, step, abort_request, stats
    host_share.py   the host's share of a decode step, measured

    from sessions.serve import Engine
"""

from sessions.serve.engine import Engine

__all__ = ["Engine"]

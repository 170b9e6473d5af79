"""The serving loop (session 7): many users at once. Requests arrive at random times; an
engine runs its slots as one compiled step, admits each new request as a slot frees
(continuous batching) and keeps the KV cache in pages; a server puts it behind OpenAI's API.

    workload.py            the request stream: gamma arrivals, lengths, prompts of real text
    replay.py              a stream run through an engine in real time: each token's time, each step
    latency.py             TTFT, TPOT, ITL, E2E, throughput and goodput, from plain records
    server.py              the engine behind OpenAI's API (FastAPI, uvicorn), /metrics
    orchestrator.py        the engine's one thread, between the handlers and the engine
    completion_request.py  a completion request, checked before the engine sees it
    metrics.py             the server's Prometheus metrics, vLLM's names
"""

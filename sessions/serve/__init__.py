"""Serving: many users at once. Requests arrive at random times; an engine runs its slots
as one compiled step, admits each new request as a slot frees (continuous batching) and
keeps the KV cache in pages. Session 7 builds it and measures it under load.

    workload.py     the request stream: gamma arrivals, lengths, prompts of real text
    replay.py       a stream run through an engine in real time: each token's time, each step
    latency.py      TTFT, TPOT, ITL, E2E, throughput and goodput, from plain records
"""

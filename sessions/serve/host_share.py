"""The engine's step, measured: the host's share of a decode step, the paged step's device
work beside session 3's contiguous step, and a prefill chunk's.

The device waits on the host when the host's work between two steps (reading the tokens,
the scheduler's plan, the arguments) is not hidden behind the device's. Measured here as
the engine's decode step against the same compiled call run back to back, with nothing
between (the device's work alone): the difference is the time the device sat idle.

sessions/s7_engine.py prints them beside the napkin's (roofline/plan/batching.py). The
contiguous step is session 3's decode loop (sessions/inference/kv_cache.py) at the same
batch and context, timed a step at a time inside its compiled loop of STEPS.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from roofline.timing import time_calls
from sessions.inference import kv_cache
from sessions.model.transformer import init_params
from sessions.serve.engine import Engine
from sessions.serve.paged_cache import pack_rows, slot_step


def decoding_engine(params, cfg, slots, page_size, prompt_len=16, seed=0, prefill_chunk=32):
    """An engine whose `slots` requests are all decoding, with room for cfg.seq tokens."""
    pages = slots * -(-cfg.seq // page_size)
    engine = Engine(
        params, cfg, slots=slots, page_size=page_size, pages=pages, prefill_chunk=prefill_chunk
    )
    rng = np.random.default_rng(seed)
    for i in range(slots):
        prompt = rng.integers(0, cfg.vocab, prompt_len).tolist()
        engine.add_request(i, prompt, cfg.seq - prompt_len)
    while (
        engine.stats()["running"] < slots
        or engine.scheduler.waiting
        or any(r.prefilling for r in engine.scheduler.running.values())
    ):
        engine.step()
    return engine


def host_share(cfg, slots=8, page_size=16, prefill_chunk=32, steps=20, rounds=4):
    """{"step_s", "device_s", "host_s", "host_fraction", "host_cpu_s", "chunk_s",
    "contiguous_s"}: the engine's decode step, the device's work alone (the same call
    back to back), their difference, as a fraction of the step; the CPU time of the
    host's own thread a step; one prefill chunk's device work; session 3's contiguous
    decode step at the same batch and context. Medians of `rounds` rounds, the engine
    and the device alone timed in turn, as other work on the machine comes and goes.
    On a CPU the "device" is the same cores: host work that the queued step hides
    still takes cycles from XLA's threads. Random weights: the time is the shapes'."""
    params = init_params(cfg, jax.random.key(0))
    engine = decoding_engine(params, cfg, slots, page_size, 8, prefill_chunk=prefill_chunk)
    engine.step()  # warm
    s = engine.scheduler
    measured = []
    for _ in range(rounds):
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            engine.step()
        step_s = (time.perf_counter() - start) / steps
        host_cpu_s = (time.thread_time() - cpu) / steps  # the Python thread's own work
        # The step the engine queued last, again and again: its pool and tokens only.
        rows = (s.table, s.position, s.live, engine.all_rows, s.seed, s.out_index)
        rows = jax.device_put(pack_rows(*rows, s.temperature))
        pool, last = engine.pool, engine.last
        start = time.perf_counter()
        for _ in range(steps):
            out, pool, last = slot_step(
                engine.weights, pool, last, rows, engine.no_tokens, cfg, True
            )
        jax.block_until_ready((out, pool))
        device_s = (time.perf_counter() - start) / steps
        engine.pool, engine.last = pool, last
        measured.append((step_s, device_s, host_cpu_s))
    step_s, device_s, host_cpu_s = (float(np.median(m)) for m in zip(*measured))
    host_s = max(step_s - device_s, 0.0)
    # One prefill chunk, written over slot 0's first pages (the engine is not used again).
    C = engine.prefill_chunk
    rows = jax.device_put(pack_rows(s.table[:1], [0], [C], [0], s.seed[:1], [0], [0.0]))
    state, tokens = [engine.pool, engine.last], jnp.zeros((1, C), jnp.int32)

    def chunk():
        out, state[0], state[1] = slot_step(engine.weights, *state, rows, tokens, cfg, False)
        return out

    chunk_s = time_calls(chunk, repeats=steps).median
    # Session 3's decode: the same batch, a contiguous cache of the whole context.
    prompts = jnp.zeros((slots, 8), jnp.int32)
    logits, cache = kv_cache.prefill(params, prompts, cfg)
    held = jnp.pad(prompts, ((0, 0), (0, cfg.seq - 8)))
    n = kv_cache.STEPS
    decode = kv_cache.repeatable_decode(
        engine.weights, cache, held, logits, 8, n, jax.random.key(0), cfg
    )
    contiguous_s = time_calls(decode, repeats=rounds).median / n
    return {
        "step_s": step_s,
        "device_s": device_s,
        "host_s": host_s,
        "host_fraction": host_s / step_s,
        "host_cpu_s": host_cpu_s,
        "chunk_s": chunk_s,
        "contiguous_s": contiguous_s,
    }

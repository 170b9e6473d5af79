"""The host's share of a decode step: what the engine's step costs beyond the device's work.

The device waits on the host when the host's work between two steps (reading the tokens,
the scheduler's plan, the arguments) is not hidden behind the device's. Measured here as
the engine's decode step against the same compiled call run back to back, with nothing
between (the device's work alone): the difference is the time the device sat idle.

    PYTHONPATH=. python -c "from sessions.serve.host_share import main; main()"
"""

import time

import jax
import numpy as np

from sessions.model.config import PRESETS
from sessions.model.transformer import init_params
from sessions.serve.engine import Engine
from sessions.serve.paged_cache import pack_rows, slot_step


def decoding_engine(cfg, slots, page_size, prompt_len=16, seed=0):
    """An engine whose `slots` requests are all decoding, with room for cfg.seq tokens."""
    params = init_params(cfg, jax.random.key(seed))
    pages = slots * -(-cfg.seq // page_size)
    engine = Engine(params, cfg, slots=slots, page_size=page_size, pages=pages)
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


def host_share(cfg, slots=8, page_size=16, steps=20, rounds=4):
    """{"step_s", "device_s", "host_s", "host_fraction", "host_cpu_s"}: the engine's
    decode step, the device's work alone (the same call back to back), their
    difference, as a fraction of the step; and the CPU time of the host's own thread
    a step. Medians of `rounds` rounds, the two timed in turn, as other work on the
    machine comes and goes. On a CPU the "device" is the same cores: host work that
    the queued step hides still takes cycles from XLA's threads."""
    engine = decoding_engine(cfg, slots, page_size, prompt_len=8)
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
    return {
        "step_s": step_s,
        "device_s": device_s,
        "host_s": host_s,
        "host_fraction": host_s / step_s,
        "host_cpu_s": host_cpu_s,
    }


def main():
    cfg = PRESETS["cpu"].model
    result = host_share(cfg)
    print(
        f"cpu preset, 8 slots: engine step {result['step_s'] * 1e3:.2f} ms, device alone "
        f"{result['device_s'] * 1e3:.2f} ms, host {result['host_s'] * 1e3:.2f} ms "
        f"({result['host_fraction']:.0%} of a step); the host thread's CPU time "
        f"{result['host_cpu_s'] * 1e3:.2f} ms a step"
    )

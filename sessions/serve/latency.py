"""What a serving run measured: latency percentiles, throughput and goodput, from plain records.

The definitions are vLLM's benchmark_serving's (benchmarks/benchmark_serving.py), so that a
figure here means what it means there:

    TTFT   first token's time - arrival: queueing included
    TPOT   (E2E - TTFT) / (output - 1), per request with output > 1
    ITL    every gap between a request's consecutive token times (chunks, over HTTP)
    E2E    last token's time - arrival
    each as {p50, p90, p99} in seconds: numpy's percentile, its default (linear)
           interpolation, as vLLM takes np.percentile; None where there is no sample
    duration   first arrival to last token, over every request in the run
    output_tokens_per_s, requests_per_s   completed requests' output tokens, and their
           number, over the duration
    goodput    requests a second that meet every SLO given (TTFT <= slo_ttft and
           TPOT <= slo_tpot; a one-token request's TPOT counts as 0, as vLLM counts it);
           None when no SLO is given

A request record is a dict with arrival_s, token_times_s (seconds, one a token or a
streamed chunk), prompt_len, output_len (tokens received) and, optionally, finished
(True unless it says otherwise): what sessions/serve/replay.py and an HTTP client both
write. Only completed requests (finished, with a token) enter the latencies. Step
records (replay.py's) add what only the engine sees:

    in_flight_mean       time-weighted over the duration: each step's in-flight count
                         (requests added and not finished, queued ones included) for its
                         span; idle time counts 0. Without steps (an HTTP client) it is
                         the sum of the requests' E2E over the duration, which by Little's
                         law equals requests_per_s × mean E2E over the same window
    tokens_per_step_mean live tokens a step, each step once
    kv_utilisation_mean, kv_utilisation_reserved
                         a step's tokens held over its pages' capacity, and over running ×
                         S (reserving each running request's whole context), each step
                         with a page in use once
"""

import numpy as np

PERCENTILES = (50, 90, 99)
RUN_KEYS = (
    "policy",
    "rate",
    "requests",
    "completed",
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "in_flight_mean",
    "tokens_per_step_mean",
    "kv_utilisation_mean",
    "kv_utilisation_reserved",
    "preemptions",
    "goodput",
)


def latency_percentiles(values):
    """{p50, p90, p99} of values (seconds), numpy's linear interpolation; Nones if empty."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {f"p{q}": None for q in PERCENTILES}
    return {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}


def completed_requests(records):
    """The records that finished with at least one token."""
    return [r for r in records if r.get("finished", True) and r["token_times_s"]]


def request_latencies(records):
    """Per completed request, seconds: {"ttft" [n], "e2e" [n], "tpot" [n] (0 where output
    is 1 token, as vLLM's goodput counts it), "itl" [every gap]} as float arrays."""
    done = completed_requests(records)
    ttft = np.array([r["token_times_s"][0] - r["arrival_s"] for r in done])
    e2e = np.array([r["token_times_s"][-1] - r["arrival_s"] for r in done])
    outputs = np.array([r["output_len"] for r in done])
    tpot = np.where(outputs > 1, (e2e - ttft) / np.maximum(outputs - 1, 1), 0.0)
    itl = [np.diff(np.asarray(r["token_times_s"], dtype=np.float64)) for r in done]
    return {
        "ttft": ttft,
        "e2e": e2e,
        "tpot": tpot,
        "output": outputs,
        "itl": np.concatenate(itl) if itl else np.zeros(0),
    }


def run_duration(records):
    """Seconds from the first arrival to the last token, over every request that got one."""
    served = [r for r in records if r["token_times_s"]]
    if not served:
        return 0.0
    return max(r["token_times_s"][-1] for r in served) - min(r["arrival_s"] for r in records)


def _per_second(count, duration):
    return count / duration if duration > 0 else None


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def meets_slos(latencies, slo_ttft=None, slo_tpot=None):
    """bool [n]: which completed requests meet every SLO given (seconds)."""
    ok = np.ones(len(latencies["ttft"]), dtype=bool)
    if slo_ttft is not None:
        ok &= latencies["ttft"] <= slo_ttft
    if slo_tpot is not None:
        ok &= latencies["tpot"] <= slo_tpot
    return ok


def run_summary(
    records, steps=None, *, policy, rate, preemptions=None, slo_ttft=None, slo_tpot=None
):
    """One run's figures: a dict with exactly RUN_KEYS (the issue's runs[...] entry).

    records: the request dicts (above); steps: replay.py's step dicts, or None for a client
    that sees no steps (then tokens_per_step_mean and the KV figures are None); preemptions:
    the engine's count during the run, or None when unknown."""
    lat = request_latencies(records)
    duration = run_duration(records)
    multi = lat["output"] > 1  # TPOT is defined from two tokens on
    if steps:
        in_flight = sum(s["in_flight"] * s["span_s"] for s in steps)
    else:
        in_flight = float(lat["e2e"].sum())
    paged = [s for s in steps or () if s["kv_utilisation"] is not None]
    goodput = None
    if slo_ttft is not None or slo_tpot is not None:
        goodput = _per_second(int(meets_slos(lat, slo_ttft, slo_tpot).sum()), duration)
    return {
        "policy": policy,
        "rate": rate,
        "requests": len(records),
        "completed": len(lat["ttft"]),
        "output_tokens_per_s": _per_second(int(lat["output"].sum()), duration),
        "requests_per_s": _per_second(len(lat["ttft"]), duration),
        "ttft_s": latency_percentiles(lat["ttft"]),
        "tpot_s": latency_percentiles(lat["tpot"][multi]),
        "itl_s": latency_percentiles(lat["itl"]),
        "e2e_s": latency_percentiles(lat["e2e"]),
        "in_flight_mean": _per_second(in_flight, duration),
        "tokens_per_step_mean": _mean([s["tokens"] for s in steps]) if steps else None,
        "kv_utilisation_mean": _mean([s["kv_utilisation"] for s in paged]),
        "kv_utilisation_reserved": _mean([s["kv_utilisation_reserved"] for s in paged]),
        "preemptions": preemptions,
        "goodput": goodput,
    }


def host_wait(steps):
    """How long the device waits on the host (replay.py's host_s) beside the step:
    {"step_s", "host_s"} as {p50, p90, p99}, and "host_fraction", the host's gaps over
    the steps' time, sum(host_s) / sum(step_s); None without steps."""
    step_s = [s["step_s"] for s in steps]
    host_s = [s["host_s"] for s in steps]
    return {
        "step_s": latency_percentiles(step_s),
        "host_s": latency_percentiles(host_s),
        "host_fraction": sum(host_s) / sum(step_s) if steps and sum(step_s) > 0 else None,
    }

"""Load any OpenAI-compatible server as vLLM's benchmark_serving.py does: streamed
completions sent at gamma-distributed times, each chunk's arrival timed, then TTFT, TPOT,
ITL and E2E (p50, p90, p99), output tokens and requests a second, and goodput under SLOs.

    python sessions/s7_engine.py --serve --random-params --preset tiny &
    python scripts/bench_serving.py --url http://127.0.0.1:8000 --requests 64 --rate 8
    python scripts/bench_serving.py --url http://127.0.0.1:8000 --requests 96 --rate 1000 \\
        --output-len exponential:32 --slo-ttft 0.5 --slo-tpot 0.05 --summary-out bench.json

Prompts go as lists of byte token ids, which every OpenAI-compatible server takes (vLLM's
random dataset sends ids too), so a prompt is exactly its length in our byte model. Each
request asks for stream_options.include_usage, so its output length is the server's count;
a chunk is a token's arrival (ITL is between chunks, as vLLM times it).
"""

import asyncio
import json
import math
import sys
import time

import httpx

from sessions.errors import UsageError, run_main
from sessions.run.cli import (
    ArgumentParser,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
)
from sessions.serve.latency import run_summary
from sessions.serve.workload import make_requests


async def one_request(client, model, start_s, arrival_s, prompt, max_tokens):
    """Send one streamed completion at arrival_s (seconds after start_s); its record:
    {arrival_s, token_times_s, prompt_len, output_len, ok, finished, error}, times in seconds
    from start_s. `prompt` is text or byte token ids."""
    await asyncio.sleep(max(0.0, start_s + arrival_s - time.perf_counter()))
    sent_s = time.perf_counter() - start_s
    prompt_len = len(prompt.encode()) if isinstance(prompt, str) else len(prompt)
    record = {
        "arrival_s": sent_s,
        "token_times_s": [],
        "prompt_len": prompt_len,
        "output_len": 0,
        "ok": False,
        "finished": False,
        "error": None,
    }
    body = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                record["error"] = f"{response.status_code}: {(await response.aread())[:200]!r}"
                return record
            async for line in response.aiter_lines():
                now_s = time.perf_counter() - start_s
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    record["error"] = chunk["error"].get("message", str(chunk["error"]))
                    return record
                if chunk.get("choices"):
                    record["token_times_s"].append(now_s)
                    chunks += 1
                if chunk.get("usage"):
                    record["output_len"] = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        record["error"] = f"{type(e).__name__}: {e}"
        return record
    record["output_len"] = record["output_len"] or chunks  # a server without usage: chunks
    record["ok"] = record["finished"] = True
    return record


async def drive(url, model, requests, timeout_s=600.0):
    """[record] of `requests`, [(arrival_s, prompt text or token ids, max_tokens)], each sent
    at its arrival over one connection pool with no cap (an open-loop load, as vLLM's)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        start_s = time.perf_counter()
        sends = [one_request(client, model, start_s, *r) for r in requests]
        return await asyncio.gather(*sends)


def served_model(url, model):
    """(model id, its context or None) from the server's /v1/models; `model` if given."""
    try:
        listed = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise UsageError(f"--url {url}: no OpenAI-compatible /v1/models there ({e})") from None
    chosen = next((m for m in listed if m["id"] == model), None) if model else listed[0]
    if chosen is None:
        raise UsageError(f"--model {model}: the server serves {[m['id'] for m in listed]}")
    return chosen["id"], chosen.get("max_model_len")


def table_lines(summary, failed):
    """The run as vLLM's benchmark prints it, in milliseconds."""
    lines = [
        f"requests: {summary['completed']} of {summary['requests']} completed"
        + (f" ({failed[0]} failed: {failed[1]})" if failed[0] else ""),
        f"output tokens/s: {summary['output_tokens_per_s']:.1f}   requests/s: "
        f"{summary['requests_per_s']:.2f}",
    ]
    if summary["goodput"] is not None:
        lines.append(f"goodput (requests/s within the SLOs): {summary['goodput']:.2f}")
    lines.append(f"{'ms':<6}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2e"):
        row = [summary[f"{name}_s"][f"p{q}"] for q in (50, 90, 99)]
        lines.append(
            f"{name.upper():<6}"
            + "".join(f"{'-':>10}" if v is None else f"{v * 1e3:>10.2f}" for v in row)
        )
    return lines


def bench_flags(argv=None):
    parser = ArgumentParser(prog="bench_serving.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="default: the first the server lists")
    parser.add_argument("--requests", type=non_negative_int, default=64)
    parser.add_argument("--rate", type=positive_float, default=math.inf, help="requests/s")
    parser.add_argument("--burstiness", type=positive_float, default=1.0, help="1: Poisson")
    parser.add_argument(
        "--prompt-len", default="uniform:1,64", help="fixed:N, uniform:LO,HI, exponential:MEAN"
    )
    parser.add_argument("--output-len", default="uniform:1,64", help="as --prompt-len")
    parser.add_argument("--lengths-file", help="JSONL of prompt_len, output_len (both DISTs')")
    parser.add_argument("--context", type=positive_int, help="default: the server's")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--slo-ttft", type=positive_float, help="seconds")
    parser.add_argument("--slo-tpot", type=positive_float, help="seconds")
    parser.add_argument("--summary-out", type=output_file, help="the run as JSON")
    args = parser.parse_args(argv)
    if args.requests < 1:
        raise UsageError("--requests must be at least 1")
    return args


def main(argv=None):
    args = bench_flags(argv)
    url = args.url.rstrip("/")
    model, context = served_model(url, args.model)
    context = int(args.context or context or 0)
    if not context:
        raise UsageError(f"{url} does not say its context (max_model_len): pass --context")
    stream = make_requests(
        args.requests,
        args.rate,
        context=context,
        burstiness=args.burstiness,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        lengths_file=args.lengths_file,
        seed=args.seed,
    )
    sends = [(r.arrival_s, r.prompt_token_ids, r.max_tokens) for r in stream]
    print(f"{len(sends)} requests to {model} at {url}, {args.rate} a second", flush=True)
    records = asyncio.run(drive(url, model, sends))
    summary = run_summary(
        records, policy="server", rate=args.rate, slo_ttft=args.slo_ttft, slo_tpot=args.slo_tpot
    )
    errors = [r["error"] for r in records if not r["ok"]]
    for line in table_lines(summary, (len(errors), errors[0] if errors else None)):
        print(line)
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump({"url": url, "model": model, "runs": [summary]}, f, indent=2)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(run_main(main))

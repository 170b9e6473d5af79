"""Session 7: the serving loop. Requests arrive at random, each with its own prompt and
length; an engine decodes a fixed number of slots as one compiled step, admits a new
request the step a slot frees (continuous batching, Orca), keeps the keys and values in
pages of one pool (a paged KV cache, vLLM), and answers each request with the tokens
generate() gives it alone. Every measured figure stands beside its napkin.

    python sessions/s7_engine.py --random-params              # the story: a few minutes
    python sessions/s2_train.py --checkpoint-every 200 && python sessions/s7_engine.py
    python sessions/s7_engine.py --random-params --policy both --requests 96 --rate 1000
    python sessions/s7_engine.py --random-params --rates 10,20,40       # the curve only
    python sessions/s7_engine.py --serve --random-params      # OpenAI's API, for curl or openai
    python sessions/s7_engine.py --target h100:1              # the paged step, compiled for it
"""

import dataclasses
import json
import math
import os
import sys

import jax
import numpy as np

from roofline import decode_cost
from roofline.flops import model_line
from roofline.hardware import local_roofs
from roofline.plan import batching
from sessions.errors import UsageError, run_main
from sessions.inference import generate
from sessions.plan import engine_on_target, programs
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.cli import make_folder, serving_config
from sessions.run.engine_flags import engine_flags, pool_pages
from sessions.run.engine_report import (
    comparison_lines,
    little_lines,
    napkin_lines,
    pages_lines,
    step_lines,
)
from sessions.run.load_report import latency_throughput_chart, runs_table_lines
from sessions.run.serving import inference_config, load_params
from sessions.serve import Engine
from sessions.serve.engine import warm_up
from sessions.serve.host_share import host_share
from sessions.serve.latency import host_wait, request_latencies, run_summary
from sessions.serve.replay import replay
from sessions.serve.workload import make_requests
from sessions.shard import sharding

SATURATION = 1000.0  # requests a second: the whole stream arrives within a few steps
CURVE = (0.25, 0.5, 0.75, 1.0, 1.5)  # the curve's rates, as fractions of the measured capacity
CHECKED = 4  # requests whose greedy tokens are checked against generate() alone
REPEATS = 3  # runs of each policy on the one stream, in turn: the median is reported


def make_engine(params, cfg, args, pages, policy="continuous"):
    return Engine(params, cfg, pages=pages, policy=policy, **args.engine)


def run_stream(params, cfg, args, pages, policy, requests, rate):
    """One run: the stream through a fresh engine in real time -> (its run dict, the log)."""
    engine = make_engine(params, cfg, args, pages, policy)
    log = replay(engine, requests, page_size=args.page_size, context=cfg.seq)
    slos = {"slo_ttft": args.slo_ttft, "slo_tpot": args.slo_tpot}
    run = run_summary(
        log.requests, log.steps, policy=policy, rate=rate, preemptions=log.preemptions, **slos
    )
    e2e = request_latencies(log.requests)["e2e"]
    run["e2e_mean_s"] = float(np.mean(e2e)) if len(e2e) else None
    return run | {"near_ties": engine.stats()["near_ties"]}, log


def stream(cfg, args, rate):
    """The request stream at `rate`: the same requests at every rate, only their times scaled."""
    return make_requests(args.requests, rate, context=cfg.seq, **args.stream)


def same_tokens(params, cfg, args, pages, requests):
    """(requests whose greedy tokens equal generate()'s for each alone, checked): the first
    CHECKED requests, all at once through one engine, each slot a different neighbour."""
    engine = make_engine(params, cfg, args, pages)
    got = {r.request_id: [] for r in requests[:CHECKED]}
    for r in requests[:CHECKED]:
        engine.add_request(r.request_id, list(r.prompt_token_ids), r.max_tokens)
    while engine.has_unfinished_requests():
        for request_id, tokens, _ in engine.step():
            got[request_id] += tokens
    equal = 0
    for r in requests[:CHECKED]:
        alone = generate(params, cfg, np.array([r.prompt_token_ids]), r.max_tokens)
        equal += got[r.request_id] == np.asarray(alone)[0, len(r.prompt_token_ids) :].tolist()
    return equal, min(CHECKED, len(requests))


def main(argv=None):
    args = engine_flags(argv)
    if args.target:  # the engine's two steps compiled for a chip this machine lacks; exit
        target, devices = programs.devices_for(args.target)
        serving = serving_config(args, platform=target.chip.platform)
        planned = engine_on_target.plan_engine(serving, args.engine, args.pages, target, devices)
        return programs.write_plan(planned, args.hlo_out, args.summary_out)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    serving = serving_config(args)
    cfg, meta = inference_config(serving)  # a checkpoint's shapes, or the flags' (random)
    one_device = sharding.make_mesh(sharding.parse_mesh(None, 1), jax.devices()[:1])
    params, source = load_params(serving.checkpoint_dir, args.seed, cfg, meta, one_device)
    reserved_pages = args.slots * math.ceil(cfg.seq / args.page_size)
    pages = pool_pages(args.pages, args.slots, args.page_size, cfg.seq)  # 3/4 reserved_pages
    if args.serve:
        from sessions.serve.server import serve  # FastAPI and uvicorn: only a server needs them

        engine = make_engine(params, cfg, args, pages)
        print(f"session 7 | {source} | {args.slots} slots, {pages} pages of {args.page_size}")
        name = f"hpllm-{serving.preset}"
        return serve(
            engine, args.host, args.port, model_name=name, context=cfg.seq,
            max_queue=args.max_queue, grace_s=args.grace_s,
        )  # fmt: skip
    rate = args.rate or (max(args.rates) if args.rates else SATURATION)
    requests = stream(cfg, args, rate)
    engine = make_engine(params, cfg, args, pages)  # its two steps compile here, once
    longest = max(requests, key=lambda r: len(r.prompt_token_ids) + r.max_tokens)
    need = engine.pages_needed(len(longest.prompt_token_ids), longest.max_tokens)
    if need > pages:  # it would wait forever for pages the pool does not have
        raise UsageError(
            f"--pages {pages}: the stream's longest request ({len(longest.prompt_token_ids)} + "
            f"{longest.max_tokens} tokens) needs {need} pages of {args.page_size}"
        )
    warm_up(engine, cfg.seq)
    make_folder(args.run_dir, "--run-dir")
    print(f"session 7 | 1 x {jax.devices()[0].device_kind} | {source}")
    print(f"model: {model_line(cfg, length='T')} | {cfg.dtype} | preset {serving.preset}")
    print(
        f"engine: {args.slots} slots | {pages} pages of {args.page_size} tokens "
        f"({reserved_pages} would reserve every slot a whole context) | prefill chunks of "
        f"{args.prefill_chunk} | {engine.token_budget} tokens a step"
    )
    prompts = [len(r.prompt_token_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    print(
        f"stream: {len(requests)} requests | prompts {min(prompts)}-{max(prompts)} "
        f"(mean {np.mean(prompts):.1f}) | outputs {min(outputs)}-{max(outputs)} "
        f"(mean {np.mean(outputs):.1f}) tokens | burstiness {args.burstiness:g}"
    )

    # 1. The napkin first. A static batch holds its slots until its longest request ends,
    # E[max of B] steps for B·E[G] tokens; continuous batching refills a slot the step it
    # frees. A request holds the pages of what it has written, the last one part full.
    roofs = local_roofs(cfg.dtype, stream="read", devices=1)
    floor = decode_cost.decode_step_cost(
        cfg, args.slots, peak_flops=roofs.peak_flops, bandwidth=roofs.bandwidth
    )
    paged_napkin = batching.paged_step_cost(
        cfg, args.slots, peak_flops=roofs.peak_flops, bandwidth=roofs.bandwidth
    )
    held = [p + g - 1 for p, g in zip(prompts, outputs)]  # the last token is never written
    predicted = {
        "continuous_over_static": batching.continuous_over_static(args.slots, outputs),
        "sequences_paged": batching.sequences_paged(pages, args.page_size, held),
        "sequences_reserved": batching.sequences_reserved(pages * args.page_size, cfg.seq),
        "kv_utilisation_paged": batching.kv_utilisation_paged(held, args.page_size),
        "kv_utilisation_reserved": batching.kv_utilisation_reserved(held, cfg.seq),
        "decode_step_floor_s": floor.step_s,
        "paged_over_contiguous": paged_napkin.ratio,
        # No rate above this: every step at the roofline's floor, prefill done elsewhere.
        "knee_roofline_requests_per_s": batching.knee_rate(
            args.slots, floor.step_s, np.mean(outputs) - 1
        ),
    }
    print()
    for line in napkin_lines(predicted, args.slots, args.page_size, cfg.seq):
        print(line)

    # 2. The step: the paged step beside session 3's contiguous one, and the host's share
    # of it (the engine queues the next step before it reads this one's tokens). A prompt
    # costs whole chunks (a chunk's shape is fixed); each stalls every slot.
    share = host_share(cfg, args.slots, args.page_size, args.prefill_chunk)
    prefill_s = share["chunk_s"] * np.mean([math.ceil(p / args.prefill_chunk) for p in prompts])
    knee = batching.knee_rate(args.slots, share["step_s"], np.mean(outputs) - 1, prefill_s)
    predicted["knee_requests_per_s"] = knee
    print()
    for line in step_lines(share, predicted, knee, args.slots):
        print(line)

    # 3. Static against continuous, one stream, arriving at `rate`.
    policies = ["static", "continuous"] if args.policy == "both" else [args.policy]
    tried = {policy: [] for policy in policies}
    for _ in range(REPEATS):  # in turn, so that the machine's other work falls on both
        for policy in policies:
            tried[policy].append(run_stream(params, cfg, args, pages, policy, requests, rate))
    runs = {}
    for policy in policies:  # each policy's median run by output tokens/s
        ranked = sorted(tried[policy], key=lambda t: t[0]["output_tokens_per_s"])
        runs[policy, rate], log = ranked[len(ranked) // 2]
    print(f"\nmeasured: one stream of {len(requests)} requests at {rate:g} requests/s")
    for line in runs_table_lines([runs[p, rate] for p in policies]):
        print(line)
    if args.policy == "both":
        with_prefill = batching.continuous_over_static_with_prefill(
            args.slots, share["step_s"], prefill_s, outputs
        )
        predicted["continuous_over_static_with_prefill"] = with_prefill
        static, continuous = runs["static", rate], runs["continuous", rate]
        for line in comparison_lines(static, continuous, predicted, with_prefill):
            print(line)
    same = same_tokens(params, cfg, args, pages, requests)
    for line in pages_lines(runs[policies[-1], rate], host_wait(log.steps), *same):
        print(line)

    # 4. The curve: latency against throughput as the rate grows past the knee; Little's
    # law (in flight = throughput x mean latency) holds at every rate.
    capacity = runs[policies[-1], rate]["requests_per_s"]
    curve = args.rates or ([] if args.rate else [round(f * capacity, 1) for f in CURVE])
    for r in curve:
        for policy in policies:
            runs[policy, r], _ = run_stream(
                params, cfg, args, pages, policy, stream(cfg, args, r), r
            )
    if curve:
        along = [runs[p, r] for r in curve for p in policies]
        print("\nmeasured: the curve")
        for line in runs_table_lines(along) + little_lines(along, knee):
            print(line)
        chart = os.path.join(args.run_dir, "curve.png")
        print(f"  the curve: {latency_throughput_chart(along, chart)}")

    if args.summary_out:
        summary = {
            "runs": list(runs.values()),
            "predicted": predicted,
            "measured_step": share,
            "model": dataclasses.asdict(cfg),
            "source": source,
        }
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

"""s7_engine.py's plumbing: its flags (the model's, as s3_infer.py takes them, and the
engine's, the request stream's and the server's), checked once, on one line each."""

import argparse
import math

from sessions.errors import UsageError
from sessions.run.cli import infer_flags, infer_parser, positive_float, positive_int

POLICIES = ("continuous", "static", "both")


def port(text):
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (any free one) to 65535, not '{text}'")
    return value


def rate_list(text):
    """--rates 2,4,8 -> [2.0, 4.0, 8.0], each a positive number of requests a second."""
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise UsageError(f"--rates {text}: positive numbers, e.g. 2,4,8") from None
    if not rates or not all(r > 0 and math.isfinite(r) for r in rates):
        raise UsageError(f"--rates {text}: positive numbers, e.g. 2,4,8")
    return rates


def engine_flags(argv=None):
    """s7_engine.py's flags, parsed and checked."""
    parser = infer_parser("s7_engine.py", "Session 7: the serving loop.")
    engine = parser.add_argument_group("the engine")
    engine.add_argument("--slots", type=positive_int, default=8, help="decode rows of one step")
    engine.add_argument("--page-size", type=positive_int, default=8, help="tokens a KV page")
    engine.add_argument(
        "--pages",
        type=positive_int,
        help="KV pages in the pool (default: three quarters of what reserving a whole "
        "context for every slot takes)",
    )
    engine.add_argument(
        "--prefill-chunk", type=positive_int, default=32, help="prompt tokens a prefill call"
    )
    engine.add_argument(
        "--token-budget",
        type=positive_int,
        help="tokens a step: the decodes, then prefill chunks (default: slots + prefill chunk)",
    )
    engine.add_argument("--policy", default="both", help="continuous, static or both")
    load = parser.add_argument_group("the request stream")
    load.add_argument("--requests", type=positive_int, default=96)
    load.add_argument(
        "--rate", type=positive_float, help="requests a second (default 1000: all at once)"
    )
    load.add_argument("--rates", help="several rates, e.g. 2,4,8: the latency-throughput curve")
    load.add_argument("--burstiness", type=positive_float, default=1.0, help="1: Poisson")
    load.add_argument("--prompt-len", default="uniform:8,48", help="DIST of prompt lengths")
    load.add_argument("--output-len", default="uniform:1,64", help="DIST of output lengths")
    load.add_argument("--lengths-file", help="JSONL of prompt_len and output_len, one a request")
    load.add_argument("--slo-ttft", type=positive_float, default=0.5, help="seconds")
    load.add_argument("--slo-tpot", type=positive_float, default=0.05, help="seconds")
    server = parser.add_argument_group("the server")
    server.add_argument("--serve", action="store_true", help="serve /v1/completions over HTTP")
    server.add_argument("--host", default="127.0.0.1", help="0.0.0.0: every interface")
    server.add_argument("--port", type=port, default=8000, help="0: any free port")
    server.add_argument("--max-queue", type=positive_int, default=64, help="then 429")
    server.add_argument("--grace-s", type=positive_float, default=3.0, help="on SIGTERM")
    parser.set_defaults(run_dir="runs/s7", temperature=0.0)
    args = infer_flags(argv, parser)
    if args.policy not in POLICIES:
        raise UsageError(f"--policy {args.policy}: one of {', '.join(POLICIES)}")
    if args.rate is not None and args.rates is not None:
        raise UsageError("--rate and --rates: give one")
    args.rates = rate_list(args.rates) if args.rates else None
    if args.mesh:
        raise UsageError("--mesh: s7_engine.py serves on one device")
    if args.batches or args.new_tokens:
        raise UsageError("--batches, --new-tokens: s7's batch is --slots, its lengths --output-len")
    if args.decode_impl != "xla":
        raise UsageError("--decode-impl pallas: the engine's paged step is XLA's")
    # The flags as the library takes them: the engine's options, and the stream's.
    args.engine = {
        "slots": args.slots,
        "page_size": args.page_size,
        "prefill_chunk": args.prefill_chunk,
        "token_budget": args.token_budget,
    }
    args.stream = {
        "burstiness": args.burstiness,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "lengths_file": args.lengths_file,
        "seed": args.seed,
        "temperature": args.temperature,
    }
    return args


def pool_pages(pages, slots, page_size, seq):
    """--pages (`pages`), or by default three quarters of what reserving a whole context of
    `seq` for every slot would take (never less than one whole context): a reserving cache
    of this memory serves 6 of 8 slots; paged, all 8 run, sharing what each has written."""
    whole = math.ceil(seq / page_size)
    return pages or max(slots * whole * 3 // 4, whole)

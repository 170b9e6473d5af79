"""Session 7: the serving loop. Many users at once: continuous batching, a paged KV cache,
and our model behind an API that real clients call.

    python sessions/s7_engine.py --serve --random-params --preset tiny      # the HTTP server
    python sessions/s7_engine.py --serve --port 8000      # session 2's checkpoint, served

The session's story (static against continuous, paged against reserved, the curve) is not
written yet; --serve is: OpenAI's /v1/completions, /v1/models, /health and /metrics over
the engine (sessions/serve/server.py).
"""

import argparse
import math
import sys

import jax

from sessions.errors import UsageError, run_main
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.cli import infer_flags, infer_parser, positive_float, positive_int, serving_config
from sessions.run.serving import inference_config, load_params
from sessions.shard import sharding


def port(text):
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (any free one) to 65535, not '{text}'")
    return value


def engine_flags(argv=None):
    parser = infer_parser("s7_engine.py", "Session 7: the serving loop.")
    parser.add_argument("--serve", action="store_true", help="serve the engine over HTTP")
    parser.add_argument("--host", default="127.0.0.1", help="with --serve (0.0.0.0: any)")
    parser.add_argument("--port", type=port, default=8000, help="with --serve (0: any free one)")
    parser.add_argument("--slots", type=positive_int, default=8, help="rows of the decode step")
    parser.add_argument("--page-size", type=positive_int, default=16, help="tokens a KV page")
    parser.add_argument("--pages", type=positive_int, help="the pool (default: slots x context)")
    parser.add_argument("--max-queue", type=positive_int, default=64, help="then 429")
    parser.add_argument("--grace-s", type=positive_float, default=3.0, help="on SIGTERM")
    return infer_flags(argv, parser)


def serve_engine(args):
    """--serve: the model the flags name, in the engine, behind HTTP until SIGTERM."""
    try:
        from sessions.serve import Engine
    except ImportError:
        raise UsageError("the engine is not built yet (sessions.serve.Engine)") from None
    from sessions.serve.server import serve  # FastAPI and uvicorn: only a server needs them

    serving = serving_config(args)
    cfg, meta = inference_config(serving)  # a checkpoint's shapes, or the flags' (random)
    one_device = sharding.make_mesh(sharding.parse_mesh(None, 1), jax.devices()[:1])
    params, source = load_params(serving.checkpoint_dir, args.seed, cfg, meta, one_device)
    pages = args.pages or args.slots * math.ceil(cfg.seq / args.page_size)
    engine = Engine(params, cfg, slots=args.slots, page_size=args.page_size, pages=pages)
    print(f"session 7 | {source} | {args.slots} slots, {pages} pages of {args.page_size}")
    name = f"hpllm-{serving.preset}"
    serve(
        engine,
        args.host,
        args.port,
        model_name=name,
        context=cfg.seq,
        max_queue=args.max_queue,
        grace_s=args.grace_s,
    )


def main(argv=None):
    args = engine_flags(argv)
    check_accelerator_visible()  # a GPU or TPU JAX cannot see: stop, naming what to install
    if args.serve:
        return serve_engine(args)
    raise UsageError("the session's story is not written yet; --serve serves the engine")


if __name__ == "__main__":
    sys.exit(run_main(main))

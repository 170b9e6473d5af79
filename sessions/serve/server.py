"""The engine behind an API real clients call: OpenAI's completions, streamed or whole, the
model list, health and Prometheus' metrics, on FastAPI and uvicorn as vLLM serves its own.

    app = make_app(engine, model_name="hpllm-tiny", context=cfg.seq)   # an ASGI app
    serve(engine, "127.0.0.1", 8000, model_name="hpllm-tiny", context=cfg.seq)  # blocks

Text in is UTF-8, a token a byte (the vocabulary is 256 bytes); text out is decoded
incrementally, so a character whose bytes two steps make comes out whole, once both are
there, and a streamed completion's text is the whole one's. A byte model has no end of text:
max_tokens is the only stop, and every finish_reason is "length". Every request is checked
here before the engine sees it (400, OpenAI's error shape); the engine's one thread is
sessions/serve/orchestrator.py's.
"""

import asyncio
import codecs
import contextlib
import json
import time
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from sessions.errors import UsageError
from sessions.serve.completion_request import BadRequest, parse_completion
from sessions.serve.engine import warm_up
from sessions.serve.metrics import ServerMetrics
from sessions.serve.orchestrator import Orchestrator, Refused

POLL_S = 0.25  # a whole (unstreamed) completion looks this often whether its client left
ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}


def error_response(status, message, code, param=None):
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    kind = ERROR_TYPES.get(status, "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def utf8_decoder():
    """Bytes to text across calls: a character's first bytes wait for its last, and what is
    not UTF-8 becomes U+FFFD (as bytes.decode(errors="replace") does all at once)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def sse(data):
    """One server-sent event, as OpenAI streams them."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def usage(prompt_tokens, completion_tokens):
    total = prompt_tokens + completion_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": total,
    }


def choice(text, finished):
    return {
        "text": text,
        "index": 0,
        "logprobs": None,
        "finish_reason": "length" if finished else None,
    }


async def stream_events(orchestrator, request_id, events, head, completion):
    """The completion as server-sent events: a chunk a step (its text "" where the step's
    byte ends mid-character, so a client times every token), then [DONE]. A client that
    leaves cancels this generator (Starlette listens for the disconnect): `finally` then
    hands the engine the abort, which frees its slot and pages at once."""
    decoder, finished, made = utf8_decoder(), False, 0
    try:
        while not finished:
            event = await events.get()
            if event[0] == "error":  # vLLM's way: the error as an event, then [DONE]
                _, status, message, code = event
                kind = ERROR_TYPES.get(status, "server_error")
                yield sse({"error": {"message": message, "type": kind, "code": code}})
                break
            _, token_ids, finished = event
            made += len(token_ids)
            text = decoder.decode(bytes(token_ids), final=finished)
            yield sse({**head, "choices": [choice(text, finished)]})
        if finished and completion.include_usage:  # OpenAI's stream_options: a last chunk
            prompt_tokens = len(completion.prompt_token_ids)
            yield sse({**head, "choices": [], "usage": usage(prompt_tokens, made)})
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            orchestrator.abort(request_id)


async def whole_completion(orchestrator, request, request_id, events, head, completion):
    """The completion in one response, once finished; its client's leaving aborts it."""
    token_ids, look_s = [], time.monotonic() + POLL_S
    while True:
        try:
            event = await asyncio.wait_for(events.get(), POLL_S)
        except TimeoutError:
            event = None
        if time.monotonic() >= look_s:  # on a clock: tokens may come faster than POLL_S
            look_s = time.monotonic() + POLL_S
            if await request.is_disconnected():
                orchestrator.abort(request_id)
                return Response(status_code=499)  # nginx's "client closed request": unread
        if event is None:
            continue
        if event[0] == "error":
            return error_response(*event[1:])
        token_ids += event[1]
        if event[2]:
            break
    text = utf8_decoder().decode(bytes(token_ids), final=True)
    return {
        **head,
        "choices": [choice(text, True)],
        "usage": usage(len(completion.prompt_token_ids), len(token_ids)),
    }


def make_app(engine, *, model_name, context, max_queue=64, grace_s=3.0):
    """The FastAPI app serving `engine` (sessions.serve.Engine's API) as `model_name`, whose
    context is `context` tokens (cfg.seq); past max_queue waiting requests, 429. Stopping
    (SIGTERM, or the lifespan's end) gives running requests grace_s to finish."""
    metrics = ServerMetrics(model_name)
    orchestrator = Orchestrator(engine, metrics, max_queue=max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        orchestrator.start()
        yield
        orchestrator.close(grace_s)
        await asyncio.to_thread(orchestrator.join, grace_s + 1)

    app = FastAPI(title="hpllm", lifespan=lifespan)
    app.state.orchestrator = orchestrator  # serve's SIGTERM starts the grace period through it
    created = int(time.time())

    @app.exception_handler(HTTPException)  # unknown paths and methods: OpenAI's shape too
    async def http_error(request, e):
        return error_response(e.status_code, str(e.detail), None)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if orchestrator.alive() else 503)

    @app.get("/v1/models")
    async def models():
        model = {"id": model_name, "object": "model", "created": created, "owned_by": "hpllm"}
        return {"object": "list", "data": [{**model, "max_model_len": context}]}

    @app.get("/metrics")
    async def scrape():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            completion = parse_completion(
                await request.body(), context=context, model_name=model_name
            )
        except BadRequest as e:
            return error_response(e.status, e.message, e.code, e.param)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        try:
            events = orchestrator.submit(
                request_id,
                completion.prompt_token_ids,
                completion.max_tokens,
                completion.temperature,
                completion.seed,
            )
        except Refused as e:
            return error_response(e.status, e.message, e.code)
        taken = await events.get()  # ("added",): the engine has it; or why it refused
        if taken[0] == "error":
            return error_response(*taken[1:])
        head = {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
        }
        if completion.stream:
            body = stream_events(orchestrator, request_id, events, head, completion)
            return StreamingResponse(body, media_type="text/event-stream")
        return await whole_completion(orchestrator, request, request_id, events, head, completion)

    return app


def try_it(url, model_name):
    """What to type to talk to the server at `url`: curl, then the openai client."""
    body = json.dumps({"model": model_name, "prompt": "The import statement ", "max_tokens": 32})
    client = f"openai.OpenAI(base_url='{url}/v1', api_key='none')"
    return (
        f"serving {model_name} at {url} (Ctrl-C or SIGTERM stops it); try:\n"
        f"  curl -s {url}/v1/completions -H 'Content-Type: application/json' -d '{body}'\n"
        f'  python -c "import openai; print({client}.completions.create(model='
        f"'{model_name}', prompt='The import statement ', max_tokens=32).choices[0].text)\""
    )


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose SIGTERM (or SIGINT) also starts the engine's grace period, and
    which prints `banner(url)` once it listens."""

    def __init__(self, config, orchestrator, grace_s, banner):
        super().__init__(config)
        self.orchestrator, self.grace_s, self.banner = orchestrator, grace_s, banner

    def handle_exit(self, sig, frame):
        self.orchestrator.close(self.grace_s)
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started and self.banner:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(self.banner(f"http://{host}:{port}"), flush=True)


def serve(engine, host, port, *, model_name, context, max_queue=64, grace_s=3.0, banner=None):
    """Serve `engine` over HTTP on host:port until SIGTERM or SIGINT (make_app's arguments),
    warmed up first; once it listens, print banner(url) (default: try_it's lines). uvicorn
    re-raises SIGTERM once it has shut down (since 0.29), so the process then ends with
    status 143; after SIGINT this returns."""
    try:  # a pool too small for a whole context would refuse clients later: say so now
        warm_up(engine, context)
    except UsageError as e:
        raise UsageError(f"the engine cannot hold a request of the whole context: {e}") from None
    banner = banner or (lambda url: try_it(url, model_name))
    app = make_app(
        engine, model_name=model_name, context=context, max_queue=max_queue, grace_s=grace_s
    )
    # Past the grace, the engine's thread has failed every request and their responses end;
    # uvicorn's own timeout is the backstop for a connection that still hangs on.
    config = uvicorn.Config(
        app, host=host, port=port, access_log=False, timeout_graceful_shutdown=grace_s + 2
    )
    server = GracefulServer(config, app.state.orchestrator, grace_s, banner)
    try:
        server.run()
    except KeyboardInterrupt:  # SIGINT, re-raised by uvicorn once it has shut down: done
        pass
    except SystemExit:  # uvicorn's exit when it cannot listen, its reason logged above
        if server.started:
            raise
        raise UsageError(f"cannot serve on {host}:{port} (uvicorn's line above says why)") from None

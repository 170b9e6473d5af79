"""A completion request as OpenAI's API words it, checked before the engine sees it: every
bad one is a BadRequest (400, or 404 for a model this server does not serve), which the
server answers in OpenAI's error shape at no cost to the engine.

    completion = parse_completion(body, context=cfg.seq, model_name="hpllm-tiny")
"""

import json
import math
from typing import NamedTuple

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
# OpenAI's options this server cannot honour, each with the value that asks nothing.
UNSUPPORTED = {"n": 1, "best_of": 1, "stop": [], "logprobs": None, "echo": False, "suffix": ""}
UNSUPPORTED_WHY = {
    "n": "one completion a request",
    "best_of": "one completion a request",
    "stop": "a byte model stops at max_tokens, its only stop",
    "logprobs": "the engine returns tokens only",
    "echo": "the completion holds the new text only",
    "suffix": "no insertion",
}


class Completion(NamedTuple):
    """A checked completion request: prompt_token_ids int [S] (bytes), the rest OpenAI's."""

    prompt_token_ids: list
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool


class BadRequest(Exception):
    def __init__(self, message, param=None, status=400, code="invalid_value"):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is no number


def parse_completion(body, *, context, model_name):
    """Completion from a request's raw body, or BadRequest: `context` is the model's S, which
    the prompt and max_tokens must fit together."""
    try:
        request = json.loads(body)
    except ValueError:  # UnicodeDecodeError among them
        raise BadRequest("the body is not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    model = request.get("model")
    if model is not None and model != model_name:  # vLLM's answer (404), in its words
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "model_not_found")
    prompt = request.get("prompt")
    if prompt is None:
        raise BadRequest("prompt is required", "prompt")
    if isinstance(prompt, str):
        prompt_token_ids = list(prompt.encode("utf-8"))
    elif isinstance(prompt, list) and all(is_int(t) and 0 <= t < 256 for t in prompt):
        prompt_token_ids = prompt
    else:
        raise BadRequest("prompt must be a string, or a list of byte token ids (0-255)", "prompt")
    if not prompt_token_ids:
        raise BadRequest("prompt is empty", "prompt")
    max_tokens = request.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not is_int(max_tokens) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer, not {max_tokens!r}", "max_tokens")
    if max_tokens >= context:
        raise BadRequest(
            f"max_tokens {max_tokens} is past the model's context of {context} tokens, "
            "which holds the prompt too",
            "max_tokens",
        )
    if len(prompt_token_ids) >= context:
        raise BadRequest(
            f"the prompt's {len(prompt_token_ids)} tokens (bytes) are past the model's context "
            f"of {context}, which holds max_tokens too",
            "prompt",
        )
    if len(prompt_token_ids) + max_tokens > context:
        raise BadRequest(
            f"the prompt's {len(prompt_token_ids)} tokens and max_tokens {max_tokens} are past "
            f"the model's context of {context} tokens",
            "max_tokens",
        )
    temperature = request.get("temperature")
    temperature = 0.0 if temperature is None else temperature  # greedy, the course's default
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise BadRequest("temperature must be a number", "temperature")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise BadRequest(
            f"temperature must be 0 (greedy) or positive, not {temperature}", "temperature"
        )
    seed, stream = request.get("seed"), request.get("stream", False)
    if seed is not None and not (is_int(seed) and 0 <= seed < 2**31):  # a key's int32
        raise BadRequest("seed must be an integer from 0 to 2**31 - 1", "seed")
    if not isinstance(stream, bool | None):
        raise BadRequest("stream must be true or false", "stream")
    options = request.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    include_usage = bool(options.get("include_usage"))
    for name, default in UNSUPPORTED.items():  # asked for, they would be silently ignored
        if request.get(name) not in (None, default):
            raise BadRequest(f"{name} is not supported: {UNSUPPORTED_WHY[name]}", name)
    return Completion(
        prompt_token_ids, max_tokens, float(temperature), seed, bool(stream), include_usage
    )

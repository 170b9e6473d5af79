"""The HTTP server (sessions/serve/server.py) as real clients see it: the official openai
client and curl against a real server process, streaming, bad requests, a full queue,
clients that leave mid-stream, and SIGTERM.

One server process, session 7's engine over the tiny model, serves the tests any engine
must pass (SERVER); a slow one-slot echo engine
(tests/serve_fakes.py), whose requests can be caught mid-stream and whose tokens are known,
serves the rest (SLOW). SIGTERM during a stream gets a process of its own.
"""

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import NamedTuple

import httpx
import openai
import pytest

from tests.helpers import REPO, subprocess_env
from tests.serve_fakes import FAIL

FAKE = [sys.executable, os.path.join(REPO, "tests", "serve_fakes.py")]
# The shared server: session 7's own, the engine over the tiny preset's model (random
# weights), and its context (S: prompt + max_tokens fit in it).
SERVER = [sys.executable, "sessions/s7_engine.py", "--serve", "--random-params", "--preset", "tiny"]
CONTEXT = 64
# One slot, a step of 20 ms, one request may wait: a 2,000-token request runs for 40 s,
# far longer than any test waits for what a disconnect or SIGTERM must end at once.
SLOW = [*FAKE, "--step-ms", "20", "--slots", "1", "--max-queue", "1", "--grace-s", "1"]
LONG = 2000
CLEAN_EXITS = (0, 143, -signal.SIGTERM)  # 143: uvicorn re-raises SIGTERM (Popen: -15)
METRICS = (
    "num_requests_running",
    "num_requests_waiting",
    "kv_pages_used",
    "kv_pages_free",
    "generation_tokens_total",
    "prompt_tokens_total",
    "time_to_first_token_seconds_bucket",
    "time_per_output_token_seconds_bucket",
)
WAIT_S = 10  # the most a test waits for what must happen at once (a run of 40 s says no)
HTTP = httpx.Client(timeout=WAIT_S)  # one client: each new one loads its TLS context (50 ms)


class Server(NamedTuple):
    url: str
    process: subprocess.Popen


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command):
    port = free_port()
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # two minutes at most: the real engine compiles its step first
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}: {process.stderr.read()}")
        with contextlib.suppress(httpx.TransportError):
            if HTTP.get(url + "/health").status_code == 200:
                return Server(url, process)
        time.sleep(0.1)
    process.kill()
    pytest.fail("the server never became healthy")


def stop(server):
    """SIGTERM; (exit status, stderr) once it has exited."""
    server.process.send_signal(signal.SIGTERM)
    _, err = server.process.communicate(timeout=30)
    return server.process.returncode, err


@contextlib.contextmanager
def running(command):
    server = start(command)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            code, err = stop(server)
            assert code in CLEAN_EXITS, err
            assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def server():
    with running(SERVER) as s:
        yield s.url


@pytest.fixture(scope="module")
def echo():
    """The echo engine at the real one's context: it takes whatever the server hands it (a
    negative temperature, a prompt past the context), so what it was handed shows whether
    the server's own check stopped a bad request (the real engine would refuse it too)."""
    with running([*FAKE, "--step-ms", "2", "--context", str(CONTEXT)]) as s:
        yield s.url


@pytest.fixture(scope="module")
def slow():
    with running(SLOW) as s:
        yield s.url


@functools.cache
def client(url, max_retries=2):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=max_retries)


def model_of(url):
    return client(url).models.list().data[0].id


def metric(url, name):
    """The value of hpllm:`name` in a scrape of /metrics (one series: the model's)."""
    text = HTTP.get(url + "/metrics").text
    found = re.search(rf"^hpllm:{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert found, f"hpllm:{name} is not among the metrics"
    return float(found[1])


def settles(url, **expected):
    """True once every metric named has its value (polled), False after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if all(metric(url, name) == value for name, value in expected.items()):
            return True
        time.sleep(0.05)
    return False


def sse_data(lines):
    """The data of each server-sent event among `lines`, in order."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_a_completion_through_the_openai_client_has_openai_s_shape(server):
    done = client(server).completions.create(
        model=model_of(server), prompt="The import ", max_tokens=8
    )
    assert done.object == "text_completion" and done.id and done.created > 0
    assert len(done.choices) == 1
    assert (done.choices[0].index, done.choices[0].finish_reason) == (0, "length")
    assert done.choices[0].logprobs is None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (11, 8)  # bytes
    assert done.usage.total_tokens == 19


def test_a_streamed_completion_is_the_whole_one_s_text(server):
    asked = {"model": model_of(server), "prompt": "def main(argv):\n    ", "max_tokens": 24}
    whole = client(server).completions.create(**asked).choices[0].text
    chunks = list(client(server).completions.create(**asked, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_curl_gets_the_openai_client_s_completion(server):
    asked = {"model": model_of(server), "prompt": "SELECT ", "max_tokens": 6}
    command = ["curl", "-s", f"{server}/v1/completions", "-H", "Content-Type: application/json"]
    out = subprocess.run(
        [*command, "-d", json.dumps(asked)], capture_output=True, text=True, check=True
    ).stdout
    by_curl = json.loads(out)
    assert by_curl["object"] == "text_completion"
    assert (
        by_curl["choices"][0]["text"] == client(server).completions.create(**asked).choices[0].text
    )


def test_the_model_list_and_health(server):
    listed = HTTP.get(server + "/v1/models").json()
    assert listed["object"] == "list" and len(listed["data"]) == 1
    assert listed["data"][0]["object"] == "model" and listed["data"][0]["id"]
    assert HTTP.get(server + "/health").status_code == 200


def test_metrics_carry_vllm_s_names_and_count_the_tokens(server):
    text = HTTP.get(server + "/metrics").text
    for name in METRICS:
        assert re.search(rf"^hpllm:{name}\{{", text, re.MULTILINE), name
    made, read = metric(server, "generation_tokens_total"), metric(server, "prompt_tokens_total")
    client(server).completions.create(model=model_of(server), prompt="abcd", max_tokens=5)
    assert metric(server, "generation_tokens_total") == made + 5
    assert metric(server, "prompt_tokens_total") == read + 4
    assert settles(server, num_requests_running=0, kv_pages_used=0)


BAD = {
    "not JSON": b"{prompt: hello",
    "not UTF-8": b'{"prompt": "\xff\xfe"}',
    "not an object": b'["hello"]',
    "no prompt": {"max_tokens": 4},
    "an empty prompt": {"prompt": "", "max_tokens": 4},
    "a number for a prompt": {"prompt": 5},
    "a token past the bytes": {"prompt": [104, 256]},
    "max_tokens 0": {"prompt": "a", "max_tokens": 0},
    "max_tokens -1": {"prompt": "a", "max_tokens": -1},
    "max_tokens as text": {"prompt": "a", "max_tokens": "5"},
    "max_tokens 2.5": {"prompt": "a", "max_tokens": 2.5},
    "max_tokens true": {"prompt": "a", "max_tokens": True},
    "max_tokens the context": {"prompt": "a", "max_tokens": CONTEXT},
    "a prompt the context long": {"prompt": "a" * CONTEXT, "max_tokens": 1},
    "prompt + max_tokens past the context": {"prompt": "a" * (CONTEXT - 4), "max_tokens": 5},
    "a negative temperature": {"prompt": "a", "temperature": -0.5},
    "temperature as text": {"prompt": "a", "temperature": "hot"},
    "stream as text": {"prompt": "a", "stream": "yes"},
    "a text seed": {"prompt": "a", "seed": "7"},
    "a negative seed": {"prompt": "a", "seed": -1},
    "a stop sequence": {"prompt": "a", "stop": ["\n"]},
    "two completions": {"prompt": "a", "n": 2},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_a_bad_request_gets_400_in_openai_s_shape_and_costs_the_engine_nothing(echo, body):
    read = metric(echo, "prompt_tokens_total")  # what the engine has been handed
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = HTTP.post(echo + "/v1/completions", **sent)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and "code" in error
    assert metric(echo, "prompt_tokens_total") == read
    fits = {"prompt": "a" * (CONTEXT - 4), "max_tokens": 4}  # the context exactly: served
    assert HTTP.post(echo + "/v1/completions", json=fits).status_code == 200


def test_the_real_engine_answers_a_bad_request_with_400_and_serves_on(server):
    bad = {"prompt": "a" * (CONTEXT - 4), "max_tokens": 5}  # one past the context
    assert HTTP.post(server + "/v1/completions", json=bad).status_code == 400
    fits = {"prompt": "a" * (CONTEXT - 4), "max_tokens": 4}
    assert HTTP.post(server + "/v1/completions", json=fits).status_code == 200


def test_a_character_split_across_tokens_comes_out_whole(slow):
    text = "aé€😀"  # 1 + 2 + 3 + 4 bytes, one a token: the echo engine's step makes one
    asked = {"model": "echo", "prompt": text, "max_tokens": len(text.encode())}
    assert client(slow).completions.create(**asked).choices[0].text == text
    with HTTP.stream("POST", slow + "/v1/completions", json={**asked, "stream": True}) as r:
        events = sse_data(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    pieces = [c["choices"][0]["text"] for c in chunks]
    assert len(pieces) == 10  # a chunk a token, "" where a character is not yet whole
    assert pieces == ["a", "", "é", "", "", "€", "", "", "", "😀"]


def test_past_the_queue_limit_a_request_gets_429_at_once(slow):
    asked = {"prompt": "x", "max_tokens": LONG, "stream": True}
    with HTTP.stream("POST", slow + "/v1/completions", json=asked) as first:
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # running: the only slot
        with HTTP.stream("POST", slow + "/v1/completions", json=asked) as second:
            assert second.status_code == 200  # waiting: the queue's one place
            full = HTTP.post(slow + "/v1/completions", json={"prompt": "x"}, timeout=WAIT_S)
            assert full.status_code == 429
            assert full.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                client(slow, max_retries=0).completions.create(model="echo", prompt="x")
    assert settles(slow, num_requests_running=0, num_requests_waiting=0, kv_pages_used=0)


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_pages(slow):
    asked = {"prompt": "x", "max_tokens": LONG, "stream": True}
    with HTTP.stream("POST", slow + "/v1/completions", json=asked) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)
        assert metric(slow, "num_requests_running") == 1
        assert metric(slow, "kv_pages_used") > 0
    assert settles(slow, num_requests_running=0, kv_pages_used=0)


def test_a_client_that_leaves_a_whole_completion_frees_its_slot_and_pages(slow):
    with pytest.raises(httpx.ReadTimeout):  # it hangs up after half a second
        HTTP.post(slow + "/v1/completions", json={"prompt": "x", "max_tokens": LONG}, timeout=0.5)
    assert settles(slow, num_requests_running=0, kv_pages_used=0)


def test_a_step_that_fails_fails_its_request_with_500_and_the_server_serves_on(slow):
    failed = HTTP.post(slow + "/v1/completions", json={"prompt": FAIL.decode(), "max_tokens": 2})
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "engine_error"
    assert HTTP.post(slow + "/v1/completions", json={"prompt": "ok"}).status_code == 200
    assert settles(slow, num_requests_running=0, kv_pages_used=0)


def test_sigterm_during_a_stream_ends_it_with_an_error_and_exits_cleanly():
    server = start(SLOW)
    asked = {"prompt": "x", "max_tokens": LONG, "stream": True}
    with HTTP.stream("POST", server.url + "/v1/completions", json=asked, timeout=WAIT_S) as r:
        lines = r.iter_lines()
        next(lines)
        server.process.send_signal(signal.SIGTERM)
        rest = sse_data(lines)  # the grace (1 s), then the error, then [DONE]
    err = server.process.communicate(timeout=WAIT_S)[1]  # seconds, never a hang
    code = server.process.returncode
    assert code in CLEAN_EXITS, err
    assert "Traceback" not in err, err
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["error"]["code"] == "shutting_down"


def test_bench_serving_drives_the_server_and_counts_every_token(server, tmp_path):
    summary = tmp_path / "bench.json"
    asked = ["--requests", "6", "--rate", "1000", "--prompt-len", "fixed:5"]
    done = subprocess.run(
        [
            sys.executable,
            "scripts/bench_serving.py",
            "--url",
            server,
            *asked,
            "--output-len",
            "fixed:3",
            "--summary-out",
            str(summary),
        ],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(summary.read_text())["runs"][0]
    assert run["requests"] == run["completed"] == 6
    # Both rates are over the same duration: their ratio is the tokens a request, 3.
    assert run["output_tokens_per_s"] / run["requests_per_s"] == pytest.approx(3)
    assert run["ttft_s"]["p50"] <= run["e2e_s"]["p50"]
    assert "TTFT" in done.stdout and "TPOT" in done.stdout

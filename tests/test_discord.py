"""scripts/harness/discord.py and homework.py --post, against a local stand-in for Discord's webhook
endpoint: 204 per message, 429 with retry_after, 400, 404, no answer. Every request has a
timeout, the server thread is joined with one, and each test has a deadline, so no test here
can hang, even on code that sleeps through a retry_after of an hour."""

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO, run_script

from scripts.harness import discord, grading

TOKEN = "s3cr3t-T0KEN_x"  # the part of the URL that must never be printed
FAST = 0.05  # seconds: the retry_after the stand-in asks for
TIMEOUT = 5  # seconds per request in these tests
OK = (204, None, {})
DEADLINE = 20  # seconds per test; they take well under one


class Deadline(Exception):
    """Not an OSError, so no `except OSError` in the code under test can swallow it."""


@pytest.fixture(autouse=True)
def deadline():
    if not hasattr(signal, "setitimer"):  # Windows: the request timeouts still bound each call
        yield
        return

    def expire(*_):
        raise Deadline(f"the test ran past its {DEADLINE} s deadline")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Webhook:
    """Answers POSTs from a script of (status, JSON body or None, headers), then 204s;
    records every POST it got, the refused ones too. ("hang", s) sleeps s before a 204."""

    def __init__(self, answers=()):
        self.answers, self.posts = list(answers), []
        webhook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = TIMEOUT  # a client that stalls cannot hold the server

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                webhook.posts.append((self.path, dict(self.headers), json.loads(body)))
                status, answer, headers = webhook.answers.pop(0) if webhook.answers else OK
                if status == "hang":
                    time.sleep(answer)
                    status, answer, headers = 204, None, {}
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                for name, value in {"Content-Length": len(data), **(headers or {})}.items():
                    self.send_header(name, str(value))
                self.end_headers()
                # The client may give up waiting: the point of "hang".
                with contextlib.suppress(ConnectionError):
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/api/webhooks/123/{TOKEN}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))
        self.thread.start()

    def contents(self):
        return [post["content"] for _, _, post in self.posts]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=TIMEOUT)
        assert not self.thread.is_alive()


@pytest.fixture
def webhook():
    """webhook(answers) -> a running Webhook; all are closed after the test."""
    servers = []

    def start(answers=()):
        servers.append(Webhook(answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def post(url, parts, **kwargs):
    waits = []
    sent = discord.post_parts(url, parts, timeout=TIMEOUT, log=waits.append, **kwargs)
    return sent, waits


PARTS = ["**Homework** (part 1/3)\n✅ a", "**Homework** (part 2/3)\n❌ b", "(part 3/3)\n⬜ c"]
RATE_LIMITED = (429, {"message": "You are being rate limited.", "retry_after": FAST}, {})


def test_each_part_is_one_json_post_in_order(webhook):
    server = webhook([OK, (200, {"id": "9"}, {})])  # 200 and the message: what ?wait=true gets
    assert post(server.url, PARTS) == (3, [])
    assert server.contents() == PARTS
    for path, headers, body in server.posts:
        assert path == f"/api/webhooks/123/{TOKEN}"
        assert headers["Content-Type"] == "application/json"
        assert body["allowed_mentions"] == {"parse": []}, "a quoted @everyone pings no one"
        assert not headers["User-Agent"].startswith("Python-urllib"), "Discord refuses it"


@pytest.mark.parametrize("where", ["body", "header"])
def test_a_429_is_waited_out_and_the_same_part_sent_again(webhook, where):
    answer = RATE_LIMITED if where == "body" else (429, None, {"Retry-After": FAST})
    server = webhook([OK, answer])
    start = time.monotonic()
    sent, waits = post(server.url, PARTS)
    assert sent == 3 and server.contents() == [PARTS[0], PARTS[1], PARTS[1], PARTS[2]]
    assert waits == [f"429 on attempt 1/{discord.TRIES}: waiting {FAST:g} s"]
    assert time.monotonic() - start >= FAST


def test_an_empty_bucket_is_waited_out_before_the_next_part(webhook):
    empty = {"X-RateLimit-Remaining": 0, "X-RateLimit-Reset-After": FAST}
    server = webhook([(204, None, empty)])
    sent, waits = post(server.url, PARTS)
    assert sent == 3 and server.contents() == PARTS
    assert waits == [f"rate limit bucket empty: waiting {FAST:g} s"]


def test_retries_are_bounded(webhook):
    server = webhook([RATE_LIMITED] * 10)
    with pytest.raises(discord.PostError) as e:
        post(server.url, PARTS, tries=3)
    assert server.contents() == [PARTS[0]] * 3
    assert "still rate limited (429) after 3 tries" in str(e.value)
    assert "none of 3 went out" in str(e.value)


def test_a_retry_after_past_the_limit_is_a_failure_not_a_hang(webhook):
    server = webhook([(429, {"retry_after": 3600, "global": True}, {})])
    with pytest.raises(discord.PostError, match="rate limited for 3600 s"):
        post(server.url, PARTS)
    assert len(server.posts) == 1


@pytest.mark.parametrize(
    "status, message",
    [
        (400, "Cannot send an empty message"),
        (401, "Invalid Webhook Token"),
        (404, "Unknown Webhook"),
    ],
)
def test_any_other_answer_stops_and_says_which_parts_went_out(webhook, status, message):
    server = webhook([OK, (status, {"message": message, "code": 50006}, {})])
    with pytest.raises(discord.PostError) as e:
        post(server.url, PARTS)
    assert server.contents() == PARTS[:2], "nothing after the failure"
    line = str(e.value)
    assert f"part 2: Discord answered {status}" in line and f"({message})" in line
    assert line.endswith("part 1 of 3 went out, parts 2-3 did not")
    assert "\n" not in line and TOKEN not in line


def test_a_redirect_is_a_failure_not_followed(webhook):
    server = webhook([(302, None, {"Location": "/elsewhere"})])  # the token would go along
    with pytest.raises(discord.PostError, match="part 1: Discord answered 302"):
        post(server.url, PARTS)
    assert len(server.posts) == 1


def test_no_answer_is_a_failure(webhook):
    server = webhook([("hang", 2, None)])
    with pytest.raises(discord.PostError, match=r"part 1: no answer \(timed out\)"):
        discord.post_parts(server.url, PARTS, timeout=0.3)
    closed = webhook()
    closed.close()  # nothing listens on its port now
    with pytest.raises(discord.PostError, match=r"part 1: no answer .*none of 3 went out"):
        post(closed.url, PARTS)


@pytest.mark.parametrize(
    "url",
    [
        "https://discord.com/api/webhooks/123/tok",
        "https://discordapp.com/api/webhooks/123/tok",
        "https://discord.com/api/v10/webhooks/123/tok?wait=true",
        "http://127.0.0.1:8080/api/webhooks/1/tok",
        "http://localhost/api/webhooks/1/tok",
    ],
)
def test_webhook_urls_are_accepted(url):
    assert discord.check_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://discord.com/api/webhooks/123/tok",  # the token in clear over the network
        "https://discord.com.evil.example/api/webhooks/123/tok",
        "https://discord.com@evil.example/api/webhooks/123/tok",
        "https://evil.example/api/webhooks/123/tok",
        "http://10.0.0.1/api/webhooks/123/tok",
        "https://discord.com/api/channels/123/tok",
        "https://discord.com/api/webhooks/abc/tok",
        "https://discord.com/api/webhooks/123/tok/slack",
        "https://discord.com/api/webhooks/123/tok?x=a b",
        "ftp://127.0.0.1/api/webhooks/1/tok",
        "",
    ],
)
def test_anything_else_is_refused_without_echoing_its_path(url, webhook):
    with pytest.raises(discord.PostError, match="refusing to post") as e:
        discord.post_parts(url, PARTS)
    assert "tok" not in str(e.value) and "\n" not in str(e.value)


def test_the_token_is_masked():
    url = f"https://discord.com/api/webhooks/123/{TOKEN}"
    assert discord.mask(url) == "https://discord.com/api/webhooks/123/***"


def test_a_part_over_2000_characters_is_refused_before_any_is_sent(webhook):
    server = webhook()
    with pytest.raises(discord.PostError, match="part 2 of 3 over 2000 characters; none sent"):
        post(server.url, [PARTS[0], "x" * 1999 + "é✅", PARTS[2]])
    assert server.posts == []


def fake_grading(monkeypatch):
    """homework.py without its pytest run: 60 failing exercises, so several parts."""
    exercises = {}
    for i in range(60):
        session = list(grading.SESSIONS)[i % len(grading.SESSIONS)]
        exercises[f"m.f{i}"] = {
            "status": "fail",
            "why": f"AssertionError: @everyone {i} " + "x" * 80,
            "hint": f"the docstring of m.f{i}, " + "y" * 60,
            "measured": [],
            "session_file": grading.SESSIONS[session][0].removesuffix(".py"),
        }
    machine = {
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": "8",
        "host_cores": "2",
        "jax": "0",
    }
    monkeypatch.setattr(grading, "run_tests", lambda *args: (object(), ""))
    monkeypatch.setattr(grading, "results", lambda root: (machine, exercises))


def test_homework_all_post_delivers_every_part_in_order_through_a_429(webhook, monkeypatch, capsys):
    fake_grading(monkeypatch)
    server = webhook([OK, RATE_LIMITED])
    status, out, err = run_script(
        "scripts/homework.py", ["all", "--post", "--webhook", server.url], capsys
    )
    parts = out.strip().split(f"\n{grading.SEPARATOR}\n")
    assert status == 1, err  # the grade's status: posting went well, the exercises did not
    assert len(parts) >= 3
    assert server.contents() == [parts[0], parts[1], *parts[1:]], "part 2 twice, then the rest"
    assert f"posted {len(parts)} part(s) to http://127.0.0.1:" in err and "/123/***" in err
    assert TOKEN not in out + err


def test_homework_post_failure_is_one_line_and_status_2(webhook, monkeypatch, capsys):
    fake_grading(monkeypatch)
    server = webhook([OK, (404, {"message": "Unknown Webhook", "code": 10015}, {})])
    monkeypatch.setenv("DISCORD_WEBHOOK_URL", server.url)  # the URL from the environment
    status, out, err = run_script("scripts/homework.py", ["all", "--post"], capsys)
    assert status == 2
    assert len(server.posts) == 2
    assert err.count("\n") == 1 and "404" in err and "part 1 of " in err
    assert TOKEN not in out + err


def test_nothing_is_posted_without_post(webhook, monkeypatch, capsys):
    fake_grading(monkeypatch)
    server = webhook()
    monkeypatch.setenv("DISCORD_WEBHOOK_URL", server.url)
    status, _, err = run_script("scripts/homework.py", ["all", "--webhook", server.url], capsys)
    assert status == 1
    assert server.posts == []
    assert "nothing will be posted" in err


def run_homework(*args, env=None):
    """homework.py as a student runs it; these all stop before any grading."""
    environment = {k: v for k, v in os.environ.items() if k != "DISCORD_WEBHOOK_URL"}
    return subprocess.run(
        [sys.executable, os.path.join("scripts", "homework.py"), *args],
        cwd=REPO,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


PLAIN_HTTP = f"http://discord.com/api/webhooks/1/{TOKEN}"


@pytest.mark.parametrize(
    "args, env, says",
    [
        (["--post"], {}, "--post needs --webhook URL or DISCORD_WEBHOOK_URL"),
        (["--post", "--webhook", f"https://evil.example/api/webhooks/1/{TOKEN}"], {}, "refusing"),
        (["--post"], {"DISCORD_WEBHOOK_URL": PLAIN_HTTP}, "refusing to post to http://discord.com"),
    ],
)
def test_a_missing_or_wrong_url_is_one_line_and_status_2_before_grading(args, env, says):
    done = run_homework("all", *args, env=env)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr and TOKEN not in done.stderr

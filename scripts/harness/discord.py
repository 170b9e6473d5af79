"""Post messages to a Discord channel through a webhook, with nothing but urllib.

    from scripts.harness import discord
    url = discord.check_url(text)                 # PostError unless a webhook URL
    discord.post_parts(url, ["part 1", "part 2"])  # in order; PostError says what went out

The webhook API as Discord documents it (docs/resources/webhook, "Execute Webhook", and
docs/topics/rate-limits): one POST of JSON {"content": ...} per message; 204 No Content is
success (200 and the message when the URL asks ?wait=true); 429 means wait `retry_after`
seconds (JSON body; the Retry-After header says the same) and send the same message again.
Anything else is a failure, reported in one line with which messages went out.

The URL's last segment is the webhook's secret token: whoever holds it can post as the
webhook. Nothing this module says contains it; mask() prints a URL without it.
"""

import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request

LIMIT = 2000  # characters per message (UTF-16 code units), Discord's own limit
TRIES = 5  # POSTs of one message while Discord answers 429
MAX_WAIT = 60.0  # seconds; a longer retry_after is reported, not slept through
TIMEOUT = 15.0  # seconds per request
DISCORD_HOSTS = {"discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com"}
LOCAL_HOSTS = {"127.0.0.1", "localhost"}  # tests and local mirrors, plain http
# /api/webhooks/ID/TOKEN; Discord also writes its versioned form, /api/v10/webhooks/...
PATH = re.compile(r"/api(?:/v\d+)?/webhooks/(\d+)/([A-Za-z0-9_-]+)/?")
QUERY = re.compile(r"[A-Za-z0-9_.=&-]*")  # ?wait=true, ?thread_id=N; nothing urllib would choke on
# Discord's edge refuses urllib's default User-Agent; the documented form names the client.
USER_AGENT = "DiscordBot (https://discord.com/developers/docs/resources/webhook, 1.0)"
EXAMPLE = "https://discord.com/api/webhooks/ID/TOKEN"


class PostError(Exception):
    """A one-line reason, fit to print: it never contains the token."""


def check_url(url):
    """`url` if it is a webhook URL this module posts to; PostError otherwise.

    The refusal names only the scheme and host: the rest may be someone's token."""
    url = (url or "").strip()
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is not a number
        host, port = "", None
    discord = parts.scheme == "https" and host in DISCORD_HOSTS and port in (None, 443)
    local = parts.scheme == "http" and host in LOCAL_HOSTS
    plain = parts.username is None and not parts.fragment and QUERY.fullmatch(parts.query)
    if not ((discord or local) and plain and PATH.fullmatch(parts.path)):
        where = f"{parts.scheme}://{host}" if parts.scheme and host else "that URL"
        raise PostError(f"refusing to post to {where}: not a Discord webhook URL ({EXAMPLE})")
    return url


def mask(url):
    """The webhook URL with its token replaced by ***, fit to print."""
    parts = urllib.parse.urlsplit(url)
    found = PATH.fullmatch(parts.path)
    if found is None:
        return f"{parts.scheme}://{parts.hostname}"
    path = parts.path[: found.start(2)] + "***" + parts.path[found.end(2) :]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def post_parts(url, parts, *, tries=TRIES, max_wait=MAX_WAIT, timeout=TIMEOUT, log=None):
    """POST each part as one message, in order, each once it is accepted. Returns the
    number sent; raises PostError saying which parts went out and which did not.
    `log(line)`, if given, hears of each wait."""
    url = check_url(url)
    token = PATH.fullmatch(urllib.parse.urlsplit(url).path).group(2)
    n = len(parts)
    too_long = [i for i, part in enumerate(parts, 1) if len(part.encode("utf-16-le")) > 2 * LIMIT]
    if too_long:  # Discord would refuse it halfway through; refuse it before the first
        raise PostError(f"part {_numbers(too_long)} of {n} over {LIMIT} characters; none sent")
    # A redirect would take the token elsewhere; a proxy has no business with localhost.
    handlers = [_NoRedirect()]
    if urllib.parse.urlsplit(url).hostname in LOCAL_HOSTS:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    for i, content in enumerate(parts):
        try:
            headers = _post_one(opener, url, content, tries, max_wait, timeout, log)
        except PostError as e:
            reason = str(e).replace(token, "***")  # in case an answer echoes the URL
            raise PostError(f"{mask(url)}: part {i + 1}: {reason}; {_progress(i, n)}") from None
        # Discord says ahead of time when the next message would be a 429: wait instead.
        if i + 1 < n and headers.get("X-RateLimit-Remaining") == "0":
            wait = _seconds(headers.get("X-RateLimit-Reset-After"))
            if wait:
                _wait(min(wait, max_wait), log, "rate limit bucket empty")
    return n


def _post_one(opener, url, content, tries, max_wait, timeout, log):
    """One message, retried through 429s; the success's headers."""
    # allowed_mentions: a failure line quoting "@everyone" must not ping the whole server.
    body = json.dumps({"content": content, "allowed_mentions": {"parse": []}}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    for attempt in range(1, tries + 1):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with opener.open(request, timeout=timeout) as response:
                response.read()
                status, answer_headers = response.status, response.headers
        except urllib.error.HTTPError as e:
            answer = _read(e)
            if e.code != 429:
                raise PostError(f"Discord answered {e.code} {e.reason}{_message(answer)}") from None
            wait = _retry_after(answer, e.headers)
            if wait > max_wait:
                raise PostError(f"rate limited for {wait:g} s, longer than {max_wait:g}") from None
            if attempt < tries:
                _wait(wait, log, f"429 on attempt {attempt}/{tries}")
            continue
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)  # URLError wraps the socket's error
            raise PostError(f"no answer ({str(reason) or type(reason).__name__})") from None
        if status in (200, 204):
            return answer_headers
        raise PostError(f"Discord answered {status}, not 204")
    raise PostError(f"still rate limited (429) after {tries} tries")


def _read(error):
    """An HTTPError's body, b"" if it has none or it breaks off."""
    try:
        with error:
            return error.read()
    except (OSError, http.client.HTTPException, AttributeError):
        return b""


def _retry_after(answer, headers):
    """Seconds a 429 asks to wait: the body's retry_after, else the Retry-After header."""
    try:
        seconds = _seconds(json.loads(answer).get("retry_after"))
    except (ValueError, AttributeError):  # not JSON, or not an object
        seconds = None
    if seconds is None:
        seconds = _seconds(headers.get("Retry-After"))
    return 1.0 if seconds is None else seconds  # a 429 that says nothing: a short pause


def _seconds(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _wait(seconds, log, why):
    if log is not None:
        log(f"{why}: waiting {seconds:g} s")
    time.sleep(seconds)


def _message(answer):
    """Discord's own reason from an error's JSON body, e.g. ' (Unknown Webhook)'."""
    try:
        message = json.loads(answer).get("message")
    except (ValueError, AttributeError):
        return ""
    return f" ({' '.join(str(message).split())[:120]})" if message else ""


def _numbers(numbers):
    """[1, 2, 3, 5] -> '1-3, 5'."""
    runs = []
    for k in numbers:
        if runs and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _progress(sent, n):
    """Which of n parts went out when part sent + 1 failed."""
    if not sent:
        return f"none of {n} went out"
    went = f"part{'s' * (sent > 1)} {_numbers(range(1, sent + 1))} of {n} went out"
    return f"{went}, part{'s' * (n - sent > 1)} {_numbers(range(sent + 1, n + 1))} did not"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx becomes an HTTPError: a failure, reported

"""The request stream: who arrives when, with how long a prompt, asking for how many tokens.

A stream is a pure function of its seed, as vLLM's benchmark_serving draws one:

    arrivals   the first at 0 s, then gaps ~ Gamma(shape=burstiness, scale=1/(rate·burstiness)):
               a mean gap of 1/rate whatever the burstiness; burstiness 1 is a Poisson process
               (exponential gaps, coefficient of variation 1), larger is more regular (CV
               1/sqrt(burstiness)), smaller burstier. rate=inf sends every request at 0 s.
    lengths    prompt and output lengths in tokens, each from a DIST (below) or, together, from
               a JSONL trace of {"prompt_len": int, "output_len": int} a line (a ShareGPT-style
               trace reduced to its lengths), taken in file order and wrapping around
    prompts    real text: byte tokens (vocabulary 256) sliced at a seeded offset from a corpus,
               by default CPython's bundled docs (sessions/train/data.py)

DIST, the grammar of --prompt-len and --output-len (lengths in tokens, integers):

    fixed:N            every length N
    uniform:LO,HI      uniform on LO..HI, both ends included
    exponential:MEAN   round(Exponential(MEAN)), clipped to [1, what the context leaves]

Prompt + output must fit the model's context (S tokens): a stream that could send a
request that does not fit is refused whole (UsageError), so no request waits forever.
Each part of the stream has its own random stream from the seed, so the same seed at
another rate gives the same requests with every arrival scaled by the rates' ratio.
"""

import dataclasses
import json
import math

import numpy as np

from sessions.errors import UsageError
from sessions.train.data import docs_text

KINDS = ("fixed", "uniform", "exponential")
# One random stream per part of the request, from the seed: numpy's SeedSequence
# entropy [seed, part], so that drawing more of one part moves none of the others.
ARRIVALS, PROMPT_LENS, OUTPUT_LENS, OFFSETS, SEEDS = range(5)


@dataclasses.dataclass(frozen=True)
class Arrival:
    """One request as engine.add_request takes it, and when it arrives (seconds from 0)."""

    request_id: str
    arrival_s: float
    prompt_token_ids: tuple  # ints in [0, 256): byte tokens of real text
    max_tokens: int  # the output length: a byte model's only stop
    temperature: float = 0.0
    seed: int | None = None  # each request's own sampling seed (used when temperature > 0)


@dataclasses.dataclass(frozen=True)
class LengthDist:
    """A parsed DIST: kind, its numbers, and the lengths it can give (hi None: unbounded)."""

    text: str
    kind: str
    numbers: tuple
    lo: int
    hi: int | None

    def sample(self, rng, n, cap):
        """n lengths, int [n]; cap [n] (or a number): the most each may be (exponential's clip)."""
        if self.kind == "fixed":
            return np.full(n, self.numbers[0], dtype=np.int64)
        if self.kind == "uniform":
            lo, hi = self.numbers
            return rng.integers(lo, hi + 1, size=n)
        drawn = np.rint(rng.exponential(self.numbers[0], size=n)).astype(np.int64)
        return np.clip(drawn, 1, cap)


def parse_length_dist(text):
    """A DIST string (the grammar above) as a LengthDist; UsageError on one line if bad."""
    kind, _, rest = str(text).partition(":")
    try:
        numbers = tuple(float(x) for x in rest.split(",")) if rest else ()
    except ValueError:
        numbers = None
    arity = {"fixed": 1, "uniform": 2, "exponential": 1}.get(kind)
    if arity is None or numbers is None or len(numbers) != arity:
        raise UsageError(
            f"length distribution {text!r}: expected fixed:N, uniform:LO,HI or exponential:MEAN"
        )
    if kind == "exponential":
        if not (math.isfinite(numbers[0]) and numbers[0] > 0):
            raise UsageError(f"length distribution {text!r}: the mean must be positive")
        return LengthDist(text, kind, numbers, 1, None)
    if not all(x.is_integer() and x >= 1 for x in numbers) or numbers[0] > numbers[-1]:
        raise UsageError(
            f"length distribution {text!r}: lengths are whole numbers of tokens, at least 1, "
            "LO <= HI"
        )
    numbers = tuple(int(x) for x in numbers)
    return LengthDist(text, kind, numbers, numbers[0], numbers[-1])


def read_lengths(path):
    """A JSONL trace's [(prompt_len, output_len)], one a line; UsageError naming the bad line."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"lengths file {path}: {e.strerror}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pair = (row["prompt_len"], row["output_len"])
        except (ValueError, TypeError, KeyError):
            pair = None
        if pair is None or not all(isinstance(x, int) and x >= 1 for x in pair):
            raise UsageError(
                f'{path}:{number}: expected {{"prompt_len": int >= 1, "output_len": int >= 1}}'
            )
        pairs.append(pair)
    if not pairs:
        raise UsageError(f"lengths file {path} holds no lengths")
    return pairs


def arrival_times(n, rate, burstiness=1.0, seed=0):
    """n arrival times in seconds, float [n]: 0, then gamma gaps of mean 1/rate (see above)."""
    if not (rate > 0):  # NaN fails too
        raise UsageError(f"--rate must be a positive number of requests a second, not {rate}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise UsageError(f"--burstiness must be a positive number, not {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng([seed, ARRIVALS])
    # vLLM's benchmark_serving: theta = 1 / (rate * burstiness), gamma(shape=burstiness, theta)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _lengths(n, prompt_len, output_len, context, seed):
    """(prompt lengths [n], output lengths [n]) from two DISTs, refused unless each fits."""
    prompt_dist, output_dist = parse_length_dist(prompt_len), parse_length_dist(output_len)
    # The longest prompt the stream can send, beside the shortest output it leaves room for:
    # an unbounded (exponential) prompt is clipped to what the longest output leaves.
    output_room = output_dist.hi if output_dist.hi is not None else 1
    prompt_most = prompt_dist.hi if prompt_dist.hi is not None else context - output_room
    if prompt_most + output_room > context or prompt_most < prompt_dist.lo:
        outputs = f"{output_room}" if output_dist.hi is not None else "at least 1"
        raise UsageError(
            f"prompts of up to {prompt_most} tokens ({prompt_len}) and outputs of {outputs} "
            f"({output_len}) do not fit the context of {context} tokens"
        )
    prompts = prompt_dist.sample(np.random.default_rng([seed, PROMPT_LENS]), n, prompt_most)
    outputs = output_dist.sample(np.random.default_rng([seed, OUTPUT_LENS]), n, context - prompts)
    return prompts, outputs


def make_requests(
    n,
    rate,
    *,
    context,
    burstiness=1.0,
    prompt_len="uniform:1,64",
    output_len="uniform:1,64",
    lengths_file=None,
    seed=0,
    temperature=0.0,
    text=None,
):
    """The stream: [Arrival] of n requests (all of lengths_file's when n is None), in order of
    arrival, for a model of `context` tokens (cfg.seq). lengths_file, when given, replaces both
    DISTs. text: the corpus the prompts are cut from (str or bytes; the docs by default)."""
    if lengths_file is not None:
        pairs = read_lengths(lengths_file)
        n = len(pairs) if n is None else n
        for number, (p, o) in enumerate(pairs, 1):
            if p + o > context:
                raise UsageError(
                    f"{lengths_file}: line {number}'s prompt_len {p} + output_len {o} does not "
                    f"fit the context of {context} tokens"
                )
    if n is None or n < 1:
        raise UsageError(f"--requests must be at least 1, not {n}")
    if temperature < 0:
        raise UsageError(f"--temperature must be at least 0, not {temperature}")
    if lengths_file is not None:
        prompts, outputs = np.array([pairs[i % len(pairs)] for i in range(n)]).T
    else:
        prompts, outputs = _lengths(n, prompt_len, output_len, context, seed)
    corpus = docs_text() if text is None else text
    corpus = np.frombuffer(corpus.encode() if isinstance(corpus, str) else corpus, np.uint8)
    if len(corpus) < prompts.max():
        raise UsageError(
            f"the text has {len(corpus)} bytes, fewer than a {prompts.max()}-token prompt"
        )
    offsets = np.random.default_rng([seed, OFFSETS]).integers(0, len(corpus) - prompts + 1, size=n)
    seeds = np.random.default_rng([seed, SEEDS]).integers(0, 2**31, size=n)
    arrivals = arrival_times(n, rate, burstiness, seed)
    return [
        Arrival(
            request_id=f"r{i}",
            arrival_s=float(arrivals[i]),
            prompt_token_ids=tuple(int(t) for t in corpus[offsets[i] : offsets[i] + prompts[i]]),
            max_tokens=int(outputs[i]),
            temperature=float(temperature),
            seed=int(seeds[i]),
        )
        for i in range(n)
    ]

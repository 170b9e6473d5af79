"""The serving napkin: what continuous batching, Little's law, the slots' knee and a
paged KV cache predict, before anything is measured (session 7's sessions/s7_engine.py prints
each beside its measurement; python -m roofline serve plans published models with it).

Letters: B slots (rows a decode step runs), P prompt tokens, G output tokens (steps a
request spends in a slot), N page size in tokens, T the context a reserved row holds.

Continuous over static at saturation. Counted in decode steps of a constant time, with
prefill free and an endless queue: a static batch of B holds its slots until its longest
request ends, E[max of B] steps, for B·E[G] tokens; continuous batching refills a slot
the step it frees, B tokens every step. Their ratio of tokens a step:

    continuous / static = E[max(G_1..G_B)] / E[G]        G_i i.i.d.
    E[max] = sum over k of P(max >= k) = sum over k >= 1 of (1 - F(k-1)^B)

Uniform on [1, n], large n: E[max] -> n·B/(B+1), E[G] -> n/2: 2B/(B+1) = 16/9 = 1.78 at
B = 8; on [n/2, n]: (1/2 + B/(2(B+1))) / (3/4) = 1.26 at B = 8; exponential (memoryless):
E[max] = E[G]·H_B, H_B = 1 + 1/2 + ... + 1/B = 2.72 at B = 8 (Rényi's representation of
the order statistics). Orca (Yu et al., OSDI '22) is the iteration-level scheduler.

Little's law (Little, 1961): requests in flight = arrival rate x mean time in the system.

The knee: B slots each hold a request for G steps of `step_s`; a prefill run on the same
device, between steps, stalls every slot for prefill_s. At saturation a second holds
rate·(prefill_s + G·step_s/B) seconds of work, so the largest rate carried is

    knee = B / (G·step_s + B·prefill_s)        = B / (G·step_s) with prefill elsewhere

Pages (vLLM, Kwon et al., arXiv 2309.06180): a sequence of n tokens takes ceil(n/N) pages;
a reserving (contiguous) cache gives every row T positions whatever it holds. With
offsets uniform in a page, the last page wastes (N - 1)/2 tokens on average.

Disaggregated serving (jax-ml/scaling-book, "Serving LLaMA 3-70B", inference worked
problems): B·(P + G)/G KV tokens are freed a step (a slot frees every G steps, holding
P + G tokens); prefill servers per generate server = prefill_s·B / (G·step_s), the rate a
generate server takes in (B / (G·step_s)) over the rate one prefill server puts out.
"""

from collections import Counter
from typing import NamedTuple

from roofline import decode_cost


def harmonic(n):
    """H_n = 1 + 1/2 + ... + 1/n (H_0 = 0)."""
    return sum(1.0 / k for k in range(1, n + 1))


def _pmf(lengths, weights=None):
    """(values sorted, probabilities) of a list of lengths, each weighted (None: equally)."""
    if weights is None:
        counts = Counter(int(x) for x in lengths)
        values = sorted(counts)
        total = sum(counts.values())
        return values, [counts[v] / total for v in values]
    pairs = sorted(zip((int(x) for x in lengths), weights))
    total = float(sum(weights))
    if not pairs or total <= 0 or any(w < 0 for _, w in pairs):
        raise ValueError("weights: non-negative, and not all zero")
    return [v for v, _ in pairs], [w / total for _, w in pairs]


def expected_max(batch, lengths, weights=None):
    """E[max of `batch` i.i.d. draws] from the distribution of `lengths` (a pmf when
    `weights` is given; else each listed length equally likely: the empirical one).
    sum over values v_i of v_i · (F(v_i)^B - F(v_{i-1})^B), F the CDF."""
    values, probs = _pmf(lengths, weights)
    total, cdf, below = 0.0, 0.0, 0.0
    for v, p in zip(values, probs):
        cdf += p
        at_most = min(cdf, 1.0) ** batch
        total += v * (at_most - below)
        below = at_most
    return total


def expected_max_uniform(batch, low, high):
    """E[max of `batch` draws uniform on the integers low..high], exactly, by the CDF sum:
    low + sum over k = low..high-1 of (1 - ((k - low + 1) / n)^B), n = high - low + 1."""
    n = high - low + 1
    return low + sum(1 - ((k - low + 1) / n) ** batch for k in range(low, high))


def continuous_over_static(batch, lengths, weights=None):
    """Continuous batching's tokens a step over static's, at saturation: E[max of B] / E[G]
    for output lengths drawn from `lengths` (weighted by `weights`, else empirical)."""
    values, probs = _pmf(lengths, weights)
    mean = sum(v * p for v, p in zip(values, probs))
    return expected_max(batch, values, probs) / mean


def continuous_over_static_uniform(batch, low, high):
    """E[max of B] / E[G] for G uniform on the integers low..high: mean (low + high)/2."""
    return expected_max_uniform(batch, low, high) / ((low + high) / 2)


def continuous_over_static_exponential(batch):
    """E[max of B] / E[G] = H_B for exponential lengths: the gaps between order statistics
    are exponential of mean E[G]/B, E[G]/(B-1), ..., E[G]/1 (Rényi)."""
    return harmonic(batch)


def continuous_over_static_with_prefill(batch, step_s, prefill_s, lengths, weights=None):
    """The same ratio with prefill no longer free: each admission stalls the device for
    prefill_s (one prompt at a time, between steps). Static spends B·prefill + E[max]·step
    on a batch's B·E[G] tokens; continuous spends prefill + E[G]·step/B on each request's
    E[G]. Their ratio of tokens a second:

        (B·prefill + E[max]·step) / (B·prefill + E[G]·step)     -> E[max]/E[G] at prefill 0

    How far a measurement falls short of E[max]/E[G] for this reason alone."""
    values, probs = _pmf(lengths, weights)
    mean = sum(v * p for v, p in zip(values, probs))
    most = expected_max(batch, values, probs)
    return (batch * prefill_s + most * step_s) / (batch * prefill_s + mean * step_s)


def littles_law_in_flight(rate, mean_latency_s):
    """Little's law: requests in the system = rate (requests/s) x mean latency (s)."""
    return rate * mean_latency_s


def knee_rate(slots, step_s, mean_output, prefill_s=0.0):
    """The largest request rate (requests/s) `slots` can carry: B / (G·step_s + B·prefill_s).
    step_s: a decode step's seconds at B = slots; mean_output: decode steps a request holds
    a slot (its output tokens, less one where prefill makes the first); prefill_s: one
    request's prefill on the same device (mean prompt / prefill tokens/s), stalling every
    slot; 0 where prefill is free or elsewhere (disaggregated)."""
    return slots / (mean_output * step_s + slots * prefill_s)


def pages_of(tokens, page_size):
    """Pages a sequence of `tokens` takes: ceil(tokens / N)."""
    return -(-tokens // page_size)


def sequences_reserved(pool_tokens, context):
    """Sequences a reserving cache holds: each keeps the whole `context` (T) positions
    (session 3's contiguous cache, cfg.seq a row), whatever it uses: pool // T."""
    return pool_tokens // context


def sequences_paged(pool_pages, page_size, lengths):
    """How many of `lengths` (each a sequence's tokens, in arrival order) a pool of
    `pool_pages` pages of N tokens holds, each given ceil(length / N) pages."""
    used = 0
    for count, tokens in enumerate(lengths):
        used += pages_of(tokens, page_size)
        if used > pool_pages:
            return count
    return len(lengths)


def kv_utilisation_paged(lengths, page_size):
    """Tokens held / (pages in use x N) for sequences of `lengths` tokens."""
    return sum(lengths) / (page_size * sum(pages_of(n, page_size) for n in lengths))


def kv_utilisation_reserved(lengths, context):
    """Tokens held / (rows x T): what reserving the whole context for each would use."""
    return sum(lengths) / (len(lengths) * context)


def expected_utilisation_paged(mean_tokens, page_size):
    """Paged utilisation expected where a sequence's length falls uniformly within its last
    page: that page wastes (N - 1)/2 tokens on average, so mean / (mean + (N - 1)/2)."""
    return mean_tokens / (mean_tokens + (page_size - 1) / 2)


def kv_tokens_freed_per_step(batch, prompt, output):
    """B·(P + G)/G: B/G sequences finish a step, each freeing its P + G cached tokens."""
    return batch * (prompt + output) / output


def prefill_to_generate(prefill_s, batch, output, step_s):
    """Prefill servers a generate server needs to stay saturated: prefill_s·B / (G·step_s).
    A generate server takes in B / (G·step_s) requests a second; a prefill server of the same
    size puts out 1 / prefill_s. The book: 0.91 s · 32 / (512 · 0.019 s) = 2.99, "P = 3G"."""
    return prefill_s * batch / (output * step_s)


class PagedStep(NamedTuple):
    """A decode step's bytes read and written through a page table, against session 3's
    contiguous cache, and the best case of each (seconds) at `bandwidth`."""

    contiguous: decode_cost.DecodeStep  # W + B·C, read in place
    paged_bytes: int  # W + 3·B·C: the gather reads B·C and writes B·C, attention reads it
    contiguous_s: float
    paged_s: float
    ratio: float  # paged_s / contiguous_s


def paged_step_cost(cfg, batch, *, peak_flops, bandwidth, weights=None, cache=None, chips=1):
    """The paged step's cost over the contiguous one, predicted: XLA's gather of each row's
    pages reads the cache's B·C bytes (decode_cost.kv_cache_bytes at T = cfg.seq, the pages
    a row gathers x N) and writes a [B, T, K, D] copy that attention reads again, so the
    step moves W + 3·B·C bytes for W + B·C. FLOPs are the same; each time is the larger of
    bytes / (chips·bandwidth) and FLOPs / (chips·peak). A paged-attention kernel (Pallas'
    jax.experimental.pallas.ops.tpu.paged_attention) reads the pages in place: 1x again."""
    step = decode_cost.decode_step_cost(
        cfg, batch, peak_flops=peak_flops, bandwidth=bandwidth, weights=weights, cache=cache,
        chips=chips,
    )  # fmt: skip
    paged = step.weight_bytes + 3 * step.cache_bytes
    paged_s = max(paged / (chips * bandwidth), step.compute_s)
    return PagedStep(step, paged, step.step_s, paged_s, paged_s / step.step_s)

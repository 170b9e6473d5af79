"""Serving many users at once, on a napkin: continuous batching, a paged KV cache,
Little's law and the tokens a step frees.

Continuous over static. At saturation (an endless queue, a constant step time,
prefill free), a static batcher runs B requests until the longest is done: E[max of B
lengths] steps for B·E[L] tokens. A continuous batcher gives a freed slot to the next
request at once (Orca's iteration-level scheduling): B tokens every step. Continuous
makes E[max of B] / E[L] times static's tokens a step: about 1.78 at B = 8 for lengths
uniform on [1, N], 1.26 on [N/2, N], 2.72 for exponential lengths.

Pages (vLLM's PagedAttention). Paged, a sequence holds its own tokens in whole pages of
N tokens; reserved, each holds the whole context, however short it turns out. vLLM
measured 20.4-38.2% of the KV memory holding tokens in the systems before it, and under
4% wasted paged.

Little's law: what is in flight = completion rate x mean time in the system, for any
queue in a steady state (queued requests and running ones alike). Read backwards, a
server's measured in-flight and throughput give its mean latency; with the slots as
what is in flight, the largest rate the slots carry (the knee).

The scaling book (inference chapters): B slots each serving a prompt of P tokens and
generating G free, on average, B·(P+G)/G KV tokens a step: 96 for B = 32, P = 8,192,
G = 4,096.
"""

import math


def continuous_over_static(pmf, slots):
    """Continuous batching's tokens a step over static batching's, at saturation, with
    `slots` slots (B) and i.i.d. output lengths drawn from pmf, a dict {length:
    probability} over positive integers: E[max of B lengths] / E[length], a float.
    Hint: E[max] = Σ_{k≥1} P(max ≥ k) = Σ_{k≥1} (1 - F(k-1)^B), with F(k) = P(L ≤ k)
    (the max is below k only when all B lengths are)."""
    raise NotImplementedError


def continuous_over_static_exponential(slots):
    """The same ratio for exponential output lengths (as likely to end at any step,
    whatever they have made), with `slots` slots (B): a float, whatever the mean.
    Hint: the B requests end one at a time; while k of them run, the next ends after
    mean / k on average (the minimum of k exponentials is exponential, k times as fast)."""
    raise NotImplementedError


def pages_for_mix(lengths, page_size):
    """Pages a mix of sequences holds, paged: each sequence's `length` tokens in whole
    pages of page_size (N) tokens, its last page partly empty. An int.
    Hint: 17 tokens in pages of 16 hold 2 pages (math.ceil)."""
    raise NotImplementedError


def sequences_that_fit(lengths, pages, page_size, context):
    """How many of the sequences, admitted in the order given, a pool of `pages` pages of
    page_size tokens holds: (paged, reserved), two ints. Paged, each holds the pages of
    its own length; reserved, each holds the pages of the whole `context`, whatever its
    length. First come, first served: admission stops at the first that does not fit.
    Hint: reserved, each sequence costs the same, math.ceil(context / page_size)."""
    raise NotImplementedError


def kv_utilisation(lengths, page_size, context):
    """The share of the cache set aside for the sequences that holds their tokens:
    (paged, reserved), two floats in (0, 1]. Paged sets aside each sequence's whole
    pages; reserved a whole context a sequence.
    Hint: paged, Σ lengths / (page_size · the pages the mix holds)."""
    raise NotImplementedError


def littles_law_in_flight(rate, mean_latency_s):
    """Requests in flight on average, queued ones included, when `rate` requests a second
    complete and each spends mean_latency_s in the system (arrival to last token).
    Hint: Little's law, L = λ·W."""
    raise NotImplementedError


def implied_latency(in_flight, rate):
    """The mean latency (s) that a measured mean in flight and completion rate (requests
    a second) imply. Hint: Little's law, read backwards."""
    raise NotImplementedError


def knee_rate(slots, step_s, mean_output_tokens):
    """The largest request rate (requests a second) that `slots` slots carry, when each
    decode step takes step_s and makes one token a slot, and a request holds its slot
    for mean_output_tokens steps (prefill free). Past it the queue grows without end.
    Hint: Little's law, with every slot in flight: slots = rate x a request's time."""
    raise NotImplementedError


def kv_tokens_freed_per_step(batch, prompt, generate):
    """KV-cache tokens freed a decode step, on average, by `batch` (B) slots kept full of
    requests that each bring a prompt of P tokens and generate G, then leave.
    Hint: a request holds its slot G steps, so B/G requests finish a step, each freeing
    the cache of every token it held."""
    raise NotImplementedError

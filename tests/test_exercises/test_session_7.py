"""Session 7 (s7_engine), the serving loop: continuous over static batching at
saturation, E[max of B] / E[L], for uniform, two-point and exponential lengths; pages
for a mix of lengths, paged against reserved; Little's law, forwards, backwards and at
the knee; the scaling book's 96 KV tokens freed a step; and two find-the-bugs, a page
allocator that never returns a finished request's last page, and a decode step that
gives every row one position.

Every expected number is worked out by hand in a comment, by enumerating every
outcome, from the maximum's own distribution, or by a schedule computed another way
(a heap of slots), never by the code under test."""

import heapq
import itertools
import math
import random
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

from .expect import expect

continuous_over_static = exercise("serving_napkin.continuous_over_static")
over_static_exponential = exercise("serving_napkin.continuous_over_static_exponential")
pages_for_mix = exercise("serving_napkin.pages_for_mix")
sequences_that_fit = exercise("serving_napkin.sequences_that_fit")
kv_utilisation = exercise("serving_napkin.kv_utilisation")
littles_law_in_flight = exercise("serving_napkin.littles_law_in_flight")
implied_latency = exercise("serving_napkin.implied_latency")
knee_rate = exercise("serving_napkin.knee_rate")
kv_tokens_freed_per_step = exercise("serving_napkin.kv_tokens_freed_per_step")
serve = exercise("bug_page_leak.serve")
leaked_pages = exercise("bug_page_leak.leaked_pages")
decode_step = exercise("bug_shared_position.decode_step")
rows_that_differ = exercise("bug_shared_position.rows_that_differ")


# Continuous over static at saturation: E[max of B] / E[L].


def enumerated_ratio(pmf, slots):
    """E[max] / E[L] by every outcome of `slots` draws, in exact fractions."""
    pmf = {length: Fraction(p) for length, p in pmf.items()}
    expected_max = sum(
        math.prod(pmf[length] for length in draw) * max(draw)
        for draw in itertools.product(pmf, repeat=slots)
    )
    return expected_max / sum(length * p for length, p in pmf.items())


@pytest.mark.exercise("serving_napkin.continuous_over_static")
@pytest.mark.parametrize(
    "pmf, slots, what",
    [
        # max of two of {1, 2, 3}: 1 once in 9, 2 three times, 3 five: 22/9, over 2: 11/9.
        ({1: 1 / 3, 2: 1 / 3, 3: 1 / 3}, 2, "uniform on 1..3, B=2 (11/9 by hand)"),
        # max of three of {1, 4}: 1 only if all three are (1/8): 1/8 + 4·7/8 = 29/8, over 5/2.
        ({1: 0.5, 4: 0.5}, 3, "half 1, half 4, B=3 (29/20 by hand)"),
        ({1: 0.5, 2: 0.25, 5: 0.25}, 3, "1, 2 and 5, B=3"),
        (dict.fromkeys(range(1, 7), 1 / 6), 4, "a die, B=4"),
        ({3: 0.2, 7: 0.8}, 1, "B=1: static is continuous"),
    ],
)
def test_continuous_over_static_by_enumeration(pmf, slots, what):
    want = float(enumerated_ratio(pmf, slots))
    expect(continuous_over_static(pmf, slots), pytest.approx(want, rel=1e-9), "x", what)


def uniform_ratio(low, high, slots):
    """E[max] / E[L] for lengths uniform on low..high, from the maximum's own
    distribution: P(max ≤ k) = ((k - low + 1) / n)^B, so P(max = k) is the difference
    of two of them (integers, exact)."""
    n = high - low + 1
    expected_max = Fraction(
        sum(k * ((k - low + 1) ** slots - (k - low) ** slots) for k in range(low, high + 1)),
        n**slots,
    )
    return float(expected_max / Fraction(low + high, 2))


@pytest.mark.exercise("serving_napkin.continuous_over_static")
def test_uniform_lengths_at_eight_slots(record_property):
    """For large N, E[max of B] of uniform [0, N] is B/(B+1)·N: on [1, N] the ratio
    tends to 2B/(B+1) = 16/9 = 1.78 at B = 8, on [N/2, N] to (1/2 + 4/9)/(3/4) = 34/27
    = 1.26."""
    n = 2000
    whole = continuous_over_static(dict.fromkeys(range(1, n + 1), 1 / n), 8)
    expect(whole, pytest.approx(uniform_ratio(1, n, 8), rel=1e-9), "x", "uniform on 1..2000, B=8")
    expect(whole, pytest.approx(16 / 9, rel=1e-3), "x", "uniform on 1..2000, B=8: about 16/9")
    upper = dict.fromkeys(range(n // 2, n + 1), 1 / (n // 2 + 1))
    half = continuous_over_static(upper, 8)
    want = uniform_ratio(n // 2, n, 8)
    expect(half, pytest.approx(want, rel=1e-9), "x", "uniform on 1000..2000, B=8")
    expect(half, pytest.approx(34 / 27, rel=1e-3), "x", "uniform on 1000..2000, B=8: about 34/27")
    # Slots gain more where lengths spread: B = 32 on 1..2000 tends to 64/33 = 1.94.
    got = continuous_over_static(dict.fromkeys(range(1, n + 1), 1 / n), 32)
    expect(got, pytest.approx(uniform_ratio(1, n, 32), rel=1e-9), "x", "uniform on 1..2000, B=32")
    record_property("measured", f"B=8: {whole:.3f}x on [1, N], {half:.3f}x on [N/2, N]")


@pytest.mark.exercise("serving_napkin.continuous_over_static_exponential")
def test_exponential_lengths_by_hand(record_property):
    # 1 + 1/2 + ... + 1/8 = (840 + 420 + 280 + 210 + 168 + 140 + 120 + 105) / 840 = 761/280.
    got = over_static_exponential(8)
    expect(got, pytest.approx(761 / 280, rel=1e-12), "x", "exponential lengths, B=8 (2.72)")
    expect(over_static_exponential(1), pytest.approx(1.0), "x", "B=1")
    expect(over_static_exponential(2), pytest.approx(1.5), "x", "B=2: 1 + 1/2")
    expect(over_static_exponential(32), above=got, unit="x", what="B=32 against B=8")
    record_property("measured", f"exponential lengths, B=8: {got:.3f}x")


@pytest.mark.exercise("serving_napkin.continuous_over_static")
def test_geometric_lengths_approach_the_exponential_ratio():
    """Geometric lengths (end each step with probability 1/200) are exponential's
    discrete twin: their ratio at B = 8 is within 1% of 761/280. Cut where the tail
    is under 1e-12, and scaled to sum to 1."""
    p, cut = 1 / 200, 6000
    pmf = {k: p * (1 - p) ** (k - 1) for k in range(1, cut + 1)}
    total = sum(pmf.values())
    pmf = {k: q / total for k, q in pmf.items()}
    got = continuous_over_static(pmf, 8)
    expect(got, pytest.approx(761 / 280, rel=1e-2), "x", "geometric lengths of mean 200, B=8")


# Pages: paged against reserved.

MIX = [17, 16, 1, 100]  # 134 tokens; in pages of 16: 2 + 1 + 1 + 7 = 11 pages


@pytest.mark.exercise("serving_napkin.pages_for_mix")
def test_pages_for_a_mix_by_hand():
    expect(pages_for_mix(MIX, 16), 11, "pages", "17, 16, 1, 100 tokens in pages of 16")
    expect(pages_for_mix(MIX, 1), 134, "pages", "the same in pages of 1 token")
    expect(pages_for_mix(MIX, 128), 4, "pages", "the same in pages of 128")
    # vLLM's blocks of 16: 1000 tokens 63 pages (62.5), 2000 125, 15 one.
    expect(pages_for_mix([1000, 2000, 15], 16), 189, "pages", "1000, 2000, 15 in pages of 16")
    expect(pages_for_mix([], 16), 0, "pages", "no sequences")


@pytest.mark.exercise("serving_napkin.sequences_that_fit")
def test_sequences_that_fit_paged_and_reserved_by_hand():
    """Reserving a 128-token context in pages of 16 costs 8 pages a sequence."""
    what = "17, 16, 1, 100 tokens, pages of 16, context 128"
    expect(sequences_that_fit(MIX, 20, 16, 128), (4, 2), "", f"{what}, 20 pages")
    # Paged: 2, 3, 4 pages for the first three; the fourth would make 11 of 10.
    expect(sequences_that_fit(MIX, 10, 16, 128), (3, 1), "", f"{what}, 10 pages")
    expect(sequences_that_fit(MIX, 3, 16, 128), (2, 0), "", f"{what}, 3 pages")
    # First come, first served: 7 pages, then 7 more would make 14 of 8; the third
    # sequence (1 page) waits behind the second.
    got = sequences_that_fit([100, 100, 1], 8, 16, 128)
    expect(got, (1, 1), "", "100, 100, 1 tokens in 8 pages of 16, context 128")
    # 300 tokens in pages of 16 hold 19 pages, a 2048 context 128: 1000 pages hold
    # 52 paged (988 pages), 7 reserved (896).
    got = sequences_that_fit([300] * 60, 1000, 16, 2048)
    expect(got, (52, 7), "", "60 sequences of 300 tokens, 1000 pages of 16, context 2048")
    expect(sequences_that_fit([5] * 3, 1000, 16, 16), (3, 3), "", "3 short sequences, ample room")


@pytest.mark.exercise("serving_napkin.kv_utilisation")
def test_kv_utilisation_paged_and_reserved_by_hand(record_property):
    # 134 tokens in 11 pages of 16 (176 slots of a token), or in 4 contexts of 128 (512).
    mix = kv_utilisation(MIX, 16, 128)
    expect(mix, pytest.approx((134 / 176, 134 / 512), rel=1e-12), "", "17, 16, 1, 100 tokens")
    # Whole pages waste nothing: 4·64 tokens in pages of 16 fill them; a 2048 context
    # holds them at 1/32.
    got = kv_utilisation([64] * 4, 16, 2048)
    expect(got, pytest.approx((1.0, 1 / 32), rel=1e-12), "", "4 sequences of 64 tokens")
    record_property("measured", f"17, 16, 1, 100 tokens: {mix[0]:.0%} paged, {mix[1]:.0%} reserved")


# Little's law.


@pytest.mark.exercise("serving_napkin.littles_law_in_flight")
def test_littles_law_by_hand():
    expect(littles_law_in_flight(10, 2.5), pytest.approx(25.0), "requests", "10 a second, 2.5 s")
    expect(littles_law_in_flight(0.5, 4), pytest.approx(2.0), "requests", "0.5 a second, 4 s")


@pytest.mark.exercise("serving_napkin.littles_law_in_flight")
def test_littles_law_holds_on_a_trace_counted_step_by_step():
    """Arrivals at 0, 1, 1, 3, 4, 6 s, each staying 2, 3, 1, 4, 2, 1 s, the last leaving
    at 7 s: counted at each half second, 1, 3, 1, 2, 2, 2, 2 in flight, 13/7 on
    average. Completions: 6 in 7 s; mean latency 13/6 s. A seeded trace of 300
    requests, counted the same way, likewise."""
    arrivals, latencies = [0, 1, 1, 3, 4, 6], [2, 3, 1, 4, 2, 1]
    rng = random.Random(0)
    for _ in range(300):
        arrivals.append(rng.randrange(1000))
        latencies.append(rng.randrange(1, 40))
    for n in (6, 306):
        arrived, stays = arrivals[:n], latencies[:n]
        end = max(a + w for a, w in zip(arrived, stays))
        counts = [sum(a <= t + 0.5 < a + w for a, w in zip(arrived, stays)) for t in range(end)]
        got = littles_law_in_flight(n / end, sum(stays) / n)
        what = f"{n} requests over {end} s, counted each half second"
        expect(got, pytest.approx(sum(counts) / end, rel=1e-12), "requests", what)


@pytest.mark.exercise("serving_napkin.implied_latency")
def test_implied_latency_by_hand():
    expect(implied_latency(12, 4), pytest.approx(3.0), "s", "12 in flight, 4 requests a second")
    expect(implied_latency(13 / 7, 6 / 7), pytest.approx(13 / 6), "s", "the trace's first 6")


@pytest.mark.exercise("serving_napkin.knee_rate")
def test_the_knee_by_hand():
    # 8 slots, 50 ms a step, 100 tokens: a request holds a slot 5 s; 8 slots, 1.6 a second.
    expect(knee_rate(8, 0.05, 100), pytest.approx(1.6), "requests/s", "8 slots, 50 ms, 100 tokens")
    # The book's 32 slots at 17 ms a step, G = 4096: 69.632 s a request, 0.4596 a second.
    got = knee_rate(32, 0.017, 4096)
    expect(got, pytest.approx(32 / 69.632), "requests/s", "32 slots, 17 ms, 4096 tokens")


@pytest.mark.exercise("serving_napkin.kv_tokens_freed_per_step")
def test_the_books_96_tokens_freed_a_step():
    # 32 slots; 32/4096 requests finish a step, each freeing 8192 + 4096 tokens: 96.
    got = kv_tokens_freed_per_step(32, 8192, 4096)
    expect(got, pytest.approx(96.0), "tokens", "B=32, P=8192, G=4096")
    # 8·150/50 = 24. One row, no prompt: 10 tokens freed every 10 steps, 1 a step.
    expect(kv_tokens_freed_per_step(8, 100, 50), pytest.approx(24.0), "tokens", "B=8, P=100, G=50")
    expect(kv_tokens_freed_per_step(1, 0, 10), pytest.approx(1.0), "tokens", "B=1, P=0, G=10")


# Find the bug: a page never returned.


def steps_of_schedule(lengths, slots):
    """Steps to serve `lengths` first come, first served on `slots` rows when no row ever
    waits for a page: each request takes the row that frees first, the step after its
    last request's last token (a heap of the steps each row is free from)."""
    free_from = [1] * slots
    last = 0
    for length in lengths:
        start = heapq.heappop(free_from)
        last = max(last, start + length - 1)
        heapq.heappush(free_from, start + length)
    return last


@pytest.mark.exercise("bug_page_leak.serve")
def test_a_pool_for_one_request_serves_three_in_turn():
    """One row, pages of 4, a pool of 2 pages: a 5-token request holds both, so three
    run one after another, 15 steps, and hand both pages back each time. (The broken
    one gets 5 // 4 = 1 back from the first, and the second waits forever at its fifth
    token: 9 steps, one finished.)"""
    steps, finished, free, tables = serve([5, 5, 5], 1, 2, 4)
    expect(steps, 15, "steps", "3 requests of 5 tokens, one row, 2 pages of 4")
    expect(list(finished), [0, 1, 2], "", "the requests finished, in order")
    expect(sorted(free), [0, 1], "", "the free list after draining")
    expect(dict(tables), {}, "", "the page tables after draining")


@pytest.mark.exercise("bug_page_leak.serve")
def test_two_rows_serve_a_mix_by_hand():
    """Two rows, pages of 2, a pool of 6 (each row's 6 tokens at most, 3 pages).
    Request 1 (6 tokens) runs steps 1-6; in the other row request 0 (2 tokens) steps
    1-2, request 2 (3) steps 3-5, request 3 (3) steps 6-8: 8 steps, where a static
    batcher would take 6 + 3 = 9. All six pages free after."""
    steps, finished, free, tables = serve([2, 6, 3, 3], 2, 6, 2)
    expect(steps, 8, "steps", "2, 6, 3, 3 tokens on 2 rows")
    expect(list(finished), [0, 2, 1, 3], "", "the requests finished, in order")
    expect(sorted(free), list(range(6)), "", "the free list after draining")
    expect(dict(tables), {}, "", "the page tables after draining")


@pytest.mark.exercise("bug_page_leak.serve")
@pytest.mark.parametrize("slots, page_size", [(3, 4), (4, 16), (1, 3)])
def test_a_long_stream_drains_with_every_page_free(slots, page_size):
    """200 requests of 1 to 40 tokens (seeded), a pool of exactly slots x the pages of
    the longest: no row ever waits, so the steps are the schedule's own."""
    rng = random.Random(100 * slots + page_size)
    lengths = [rng.randint(1, 40) for _ in range(200)]
    pages = slots * math.ceil(40 / page_size)
    steps, finished, free, tables = serve(lengths, slots, pages, page_size)
    what = f"200 requests, {slots} rows, {pages} pages of {page_size}"
    expect(sorted(finished), list(range(200)), "", f"{what}: finished")
    expect(steps, steps_of_schedule(lengths, slots), "steps", what)
    expect(sorted(free), list(range(pages)), "", f"{what}: the free list after draining")
    expect(dict(tables), {}, "", f"{what}: the page tables after draining")


@pytest.mark.exercise("bug_page_leak.leaked_pages")
def test_leaked_pages_by_hand():
    expect(leaked_pages(6, [0, 5], {0: [1, 2], 3: [4]}), [3], "", "6 pages, 3 nowhere")
    expect(leaked_pages(3, [2, 0, 1], {}), [], "", "3 pages, all free")
    expect(leaked_pages(4, [], {7: [3, 0], 8: [1, 2]}), [], "", "4 pages, all held")
    expect(leaked_pages(5, [4], {}), [0, 1, 2, 3], "", "5 pages, one free, none held")


@pytest.mark.exercise("bug_page_leak.leaked_pages")
def test_leaked_pages_finds_what_the_broken_serve_lost():
    """broken_serve hands out the free list's last page first. One row, 2 pages of 4:
    request 0 takes page 1, then page 0 at its fifth token, and gives back 5 // 4 = 1 of
    them, page 1; request 1 takes it and waits at its fifth token. Page 0 is lost.
    Two rows, 6 pages of 2, 2, 6, 3, 3 tokens: request 0 takes 5 and gives it back;
    request 1 takes 4 at step 1; at step 3 request 2 takes 5, request 1 3; at step 5
    request 1 takes 2, request 2 1, and request 2 gives back 3 // 2 = 1 of its two, 5;
    request 1, 6 tokens, gives back all three of its pages at step 6; request 3 takes 5,
    then 2, and gives back 5: pages 1 and 2 are lost."""
    from solutions.bug_page_leak import broken_serve

    steps, finished, free, tables = broken_serve([5, 5, 5], 1, 2, 4)
    expect((steps, finished), (9, [0]), "", "the broken serve, stuck (steps, finished)")
    expect(leaked_pages(2, free, tables), [0], "", "lost by 3 requests of 5 in 2 pages of 4")
    steps, finished, free, tables = broken_serve([2, 6, 3, 3], 2, 6, 2)
    expect(leaked_pages(6, free, tables), [1, 2], "", "lost by 2, 6, 3, 3 tokens in pages of 2")


# Find the bug: one position shared by every row.

B, T, D = 4, 8, 4


def batch(seed=0):
    """Caches [B, T, D] already holding earlier tokens (random: what a row has not
    written yet is some other request's leftovers), and q, k, v [B, D]."""
    keys = jax.random.split(jax.random.key(seed), 5)
    cache_k, cache_v = (jax.random.normal(key, (B, T, D)) for key in keys[:2])
    q, k, v = (jax.random.normal(key, (B, D)) for key in keys[2:])
    return cache_k, cache_v, q, k, v


def attention_of_row(cache_k, cache_v, q, k, v, pos):
    """One row in float64: k, v written at pos, q attending to positions 0..pos."""
    keys = np.array(cache_k, np.float64)
    values = np.array(cache_v, np.float64)
    keys[pos], values[pos] = k, v
    scores = keys[: pos + 1] @ np.asarray(q, np.float64) / np.sqrt(len(q))
    weights = np.exp(scores - scores.max())
    return weights / weights.sum() @ values[: pos + 1], keys, values


@pytest.mark.exercise("bug_shared_position.decode_step")
@pytest.mark.parametrize("positions", [[3, 0, 7, 5], [2, 2, 2, 2]], ids=["staggered", "equal"])
def test_each_row_writes_and_attends_at_its_own_position(positions):
    cache_k, cache_v, q, k, v = batch()
    out, new_k, new_v = decode_step(cache_k, cache_v, q, k, v, jnp.array(positions))
    expect(out.shape, (B, D), "", "the output's shape [B, D]")
    for row, pos in enumerate(positions):
        want, keys, values = attention_of_row(
            cache_k[row], cache_v[row], q[row], k[row], v[row], pos
        )
        np.testing.assert_allclose(out[row], want, atol=1e-5, err_msg=f"row {row} at {pos}")
        np.testing.assert_allclose(new_k[row], keys, atol=1e-6, err_msg=f"row {row}'s keys")
        np.testing.assert_allclose(new_v[row], values, atol=1e-6, err_msg=f"row {row}'s values")


@pytest.mark.exercise("bug_shared_position.decode_step")
def test_rows_admitted_at_different_times_decode_their_own_sequences():
    """Prompts of 1, 4, 2 and 6 tokens already cached; two decode steps later each row's
    last output is attention over its own sequence alone, in float64: the keys and
    values it wrote at each step are where the next step reads them."""
    cache_k, cache_v, _, _, _ = batch(1)
    starts = np.array([1, 4, 2, 6])
    ref_k, ref_v = np.array(cache_k, np.float64), np.array(cache_v, np.float64)
    for step in range(2):
        _, _, q, k, v = batch(10 + step)
        positions = starts + step
        out, cache_k, cache_v = decode_step(cache_k, cache_v, q, k, v, jnp.asarray(positions))
        for row, pos in enumerate(positions):
            want, ref_k[row], ref_v[row] = attention_of_row(
                ref_k[row], ref_v[row], q[row], k[row], v[row], pos
            )
            what = f"step {step}, row {row} at position {pos}"
            np.testing.assert_allclose(out[row], want, atol=1e-5, err_msg=what)


def row_by_row(cache_k, cache_v, q, k, v, positions):
    """A decode step that is right by construction: each row on its own, in float64."""
    rows = [
        attention_of_row(cache_k[b], cache_v[b], q[b], k[b], v[b], int(positions[b]))
        for b in range(len(positions))
    ]
    return tuple(np.stack(parts) for parts in zip(*rows))


@pytest.mark.exercise("bug_shared_position.rows_that_differ")
def test_rows_that_differ_finds_the_rows_away_from_row_0():
    """The broken step at positions 3, 3, 0, 5: rows 2 and 3 are not at row 0's
    position, so they write and read the wrong keys; alone, each row is its own row 0."""
    from solutions.bug_shared_position import broken_decode_step

    cache_k, cache_v, q, k, v = batch(2)
    staggered, equal = jnp.array([3, 3, 0, 5]), jnp.array([4, 4, 4, 4])
    got = rows_that_differ(broken_decode_step, cache_k, cache_v, q, k, v, staggered)
    expect(list(got), [2, 3], "", "the broken step at positions 3, 3, 0, 5")
    got = rows_that_differ(broken_decode_step, cache_k, cache_v, q, k, v, equal)
    expect(list(got), [], "", "the broken step, every row at 4 (static batching hides it)")
    got = rows_that_differ(row_by_row, cache_k, cache_v, q, k, v, staggered)
    expect(list(got), [], "", "a step that is right, row by row, at positions 3, 3, 0, 5")

    def batch_size_leaks(cache_k, cache_v, q, k, v, positions):
        return q * q.shape[0], cache_k, cache_v  # a row's output depends on the batch

    got = rows_that_differ(batch_size_leaks, cache_k, cache_v, q, k, v, staggered)
    expect(list(got), [0, 1, 2, 3], "", "a step whose output is scaled by the batch size")

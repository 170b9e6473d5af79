"""Session 7's load and what it measures: the request stream (gamma arrivals, lengths,
prompts of real text), the real-time replay through an engine, and the statistics, each
held to hand counts. The engine here is a fake on a fake clock, so no test reads the wall
clock: every time below is a sum of fake step times and fake sleeps."""

import json
import math

import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.run.load_report import latency_throughput_chart, runs_table_lines
from sessions.serve.latency import host_wait, latency_percentiles, run_summary
from sessions.serve.replay import replay
from sessions.serve.workload import (
    Arrival,
    arrival_times,
    make_requests,
    parse_length_dist,
    read_lengths,
)

TEXT = "".join(chr(ord("a") + i % 26) for i in range(1000))  # a corpus whose slices we can find
# The issue's runs[...] keys, written out here, not read from the code.
ISSUE_KEYS = {
    "policy", "rate", "requests", "completed", "output_tokens_per_s", "requests_per_s",
    "ttft_s", "tpot_s", "itl_s", "e2e_s", "in_flight_mean", "tokens_per_step_mean",
    "kv_utilisation_mean", "kv_utilisation_reserved", "preemptions", "goodput",
}  # fmt: skip


class FakeClock:
    """Time that moves only when the fake engine steps or the replay sleeps."""

    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds


class FakeEngine:
    """LLMEngine's shape on a fake clock. Each step takes step_s. A request admitted in a
    step is prefilled in it and makes its first token (free prefill), then one a step.
    continuous admits into any free slot each step; static admits up to `slots` only when
    all slots are free. tokens_this_step: a new row's prompt tokens plus one per decoding
    row. tokens_held: prompt + tokens made, a running request; each on whole pages.
    stats() costs stats_s of host time; its "host_s" reports engine_host_s."""

    def __init__(self, clock, *, slots, step_s=1.0, page_size=4, pages=64, policy="continuous",
                 stats_s=0.0, engine_host_s=None, preempt_at_step=None, preemptions=0):  # fmt: skip
        self.clock, self.slots, self.step_s = clock, slots, step_s
        self.page_size, self.pages, self.policy = page_size, pages, policy
        self.stats_s, self.engine_host_s = stats_s, engine_host_s
        self.preempt_at_step, self.preemptions = preempt_at_step, preemptions
        self.waiting, self.running, self.added, self.steps, self.tokens = [], [], {}, 0, 0

    def add_request(self, request_id, prompt_token_ids, max_tokens, temperature=0.0, seed=None):
        self.added[request_id] = self.clock()
        self.waiting.append({"id": request_id, "prompt": len(prompt_token_ids),
                             "max": max_tokens, "made": 0})  # fmt: skip

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def step(self):
        admit = self.slots - len(self.running)
        if self.policy == "static" and self.running:
            admit = 0
        new = self.waiting[:admit]
        self.waiting = self.waiting[admit:]
        self.tokens = sum(r["prompt"] for r in new) + len(self.running)
        self.running += new
        self.steps += 1
        if self.steps == self.preempt_at_step:
            self.preemptions += 1
        self.clock.t += self.step_s
        out = []
        for r in self.running:
            r["made"] += 1
            out.append((r["id"], [r["made"] % 256], r["made"] == r["max"]))
        self.running = [r for r in self.running if r["made"] < r["max"]]
        return out

    def stats(self):
        self.clock.t += self.stats_s
        held = [r["prompt"] + r["made"] for r in self.running]
        used = sum(-(-h // self.page_size) for h in held)
        s = {"pages_total": self.pages, "pages_free": self.pages - used, "running":
             len(self.running), "waiting": len(self.waiting), "preemptions": self.preemptions,
             "tokens_held": sum(held), "pages_used": used, "tokens_this_step": self.tokens}  # fmt: skip
        if self.engine_host_s is not None:
            s["host_s"] = self.engine_host_s
        return s


def request(i, arrival_s, max_tokens, prompt_len=3):
    return Arrival(f"r{i}", arrival_s, tuple(range(prompt_len)), max_tokens)


def run_fake(requests, context=16, **engine):
    clock = FakeClock()
    fake = FakeEngine(clock, **engine)
    log = replay(fake, requests, page_size=fake.page_size, context=context, clock=clock,
                 sleep=clock.sleep)  # fmt: skip
    return fake, clock, log


# -- the stream -----------------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_root_burstiness(burstiness):
    """Gamma(k, 1/(rate k)) gaps: mean 1/rate, CV 1/sqrt(k) (k = 1: exponential, CV 1).
    n gaps: the sample mean's standard error is (1/rate)/sqrt(k n); the sample standard
    deviation's, for the exponential, sigma sqrt(2/n) (fourth moment 9 sigma^4), smaller for
    k > 1. Bounds at 5 standard errors."""
    n, rate = 20_000, 2.0
    gaps = np.diff(arrival_times(n + 1, rate, burstiness, seed=3))
    assert len(gaps) == n and (gaps > 0).all()
    mean_se = (1 / rate) / math.sqrt(burstiness * n)
    assert abs(gaps.mean() - 1 / rate) < 5 * mean_se
    cv = gaps.std() / gaps.mean()
    assert abs(cv - 1 / math.sqrt(burstiness)) < 5 * math.sqrt(2 / n) + 5 * mean_se * rate


def test_the_stream_is_its_seed_and_another_rate_scales_its_arrivals():
    a = make_requests(50, 2.0, context=128, seed=7, text=TEXT)
    assert a == make_requests(50, 2.0, context=128, seed=7, text=TEXT)
    assert a[0].arrival_s == 0.0 and np.all(np.diff([r.arrival_s for r in a]) >= 0)
    other = make_requests(50, 2.0, context=128, seed=8, text=TEXT)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in a]
    faster = make_requests(50, 8.0, context=128, seed=7, text=TEXT)
    assert [r.prompt_token_ids for r in faster] == [r.prompt_token_ids for r in a]
    assert [r.max_tokens for r in faster] == [r.max_tokens for r in a]
    np.testing.assert_allclose([4 * r.arrival_s for r in faster], [r.arrival_s for r in a])
    everyone = make_requests(5, math.inf, context=128, text=TEXT)
    assert [r.arrival_s for r in everyone] == [0.0] * 5


def test_prompts_are_slices_of_the_text_as_byte_tokens():
    for r in make_requests(40, 1.0, context=128, prompt_len="uniform:1,60", text=TEXT):
        assert bytes(r.prompt_token_ids).decode() in TEXT and 1 <= len(r.prompt_token_ids) <= 60
    docs = make_requests(3, 1.0, context=128, prompt_len="fixed:40", output_len="fixed:8")
    assert all(len(r.prompt_token_ids) == 40 and r.max_tokens == 8 for r in docs)


def test_each_dist_samples_within_its_range():
    fixed = make_requests(500, 1.0, context=128, prompt_len="fixed:32", output_len="uniform:1,64",
                          text=TEXT)  # fmt: skip
    assert {len(r.prompt_token_ids) for r in fixed} == {32}
    assert {r.max_tokens for r in fixed} <= set(range(1, 65))
    assert min(r.max_tokens for r in fixed) == 1 and max(r.max_tokens for r in fixed) == 64
    # exponential:24, its clip far away: mean 24 within 5 standard errors (24/sqrt(n))
    n = 4000
    far = make_requests(n, 1.0, context=1024, prompt_len="fixed:4", output_len="exponential:24",
                        text=TEXT)  # fmt: skip
    outputs = np.array([r.max_tokens for r in far])
    assert outputs.min() >= 1 and abs(outputs.mean() - 24) < 5 * 24 / math.sqrt(n)
    # and clipped to what the context leaves: 32 - 16 = 16 tokens at most
    near = make_requests(300, 1.0, context=32, prompt_len="fixed:16", output_len="exponential:24",
                         text=TEXT)  # fmt: skip
    assert max(r.max_tokens for r in near) == 16 and min(r.max_tokens for r in near) >= 1


@pytest.mark.parametrize(
    "text, parsed",
    [("fixed:32", ("fixed", (32,), 32, 32)), ("uniform:1,64", ("uniform", (1, 64), 1, 64)),
     ("exponential:24", ("exponential", (24.0,), 1, None))],
)  # fmt: skip
def test_dist_strings_parse(text, parsed):
    d = parse_length_dist(text)
    assert (d.kind, d.numbers, d.lo, d.hi) == parsed


@pytest.mark.parametrize(
    "text",
    ["normal:3", "fixed", "fixed:0", "fixed:2.5", "fixed:abc", "uniform:5,1", "uniform:3",
     "exponential:-1", "exponential:0", "exponential:nan", "", "uniform:1,2,3"],
)  # fmt: skip
def test_a_bad_dist_is_a_usage_error(text):
    with pytest.raises(UsageError):
        parse_length_dist(text)


def test_lengths_must_fit_the_context_exactly():
    fits = make_requests(20, 1.0, context=128, prompt_len="uniform:1,100", output_len="fixed:28",
                         text=TEXT)  # fmt: skip
    assert max(len(r.prompt_token_ids) + r.max_tokens for r in fits) <= 128
    with pytest.raises(UsageError, match="context of 128"):
        make_requests(20, 1.0, context=128, prompt_len="uniform:1,100", output_len="fixed:29")
    with pytest.raises(UsageError):
        make_requests(20, 1.0, context=16, prompt_len="fixed:16", output_len="exponential:4")


@pytest.mark.parametrize("rate", [-1.0, 0.0, math.nan])
def test_a_rate_that_is_not_positive_is_a_usage_error(rate):
    with pytest.raises(UsageError, match="--rate"):
        make_requests(3, rate, context=128, text=TEXT)


def test_other_bad_stream_inputs_are_usage_errors():
    with pytest.raises(UsageError, match="--burstiness"):
        arrival_times(3, 1.0, burstiness=0.0)
    with pytest.raises(UsageError, match="--requests"):
        make_requests(0, 1.0, context=128, text=TEXT)


def test_a_jsonl_trace_gives_the_lengths_in_order_wrapping(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [{"prompt_len": 5, "output_len": 7}, {"prompt_len": 9, "output_len": 1},
            {"prompt_len": 2, "output_len": 30}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_lengths(path) == [(5, 7), (9, 1), (2, 30)]
    got = make_requests(4, 1.0, context=32, lengths_file=path, text=TEXT)
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in got] == [(5, 7), (9, 1), (2, 30),
                                                                      (5, 7)]  # fmt: skip
    assert len(make_requests(None, 1.0, context=32, lengths_file=path, text=TEXT)) == 3
    with pytest.raises(UsageError, match="line 3"):
        make_requests(3, 1.0, context=31, lengths_file=path, text=TEXT)
    path.write_text('{"prompt_len": 5, "output_len": 7}\n{"prompt_len": 0, "output_len": 2}\n')
    with pytest.raises(UsageError, match=":2:"):
        read_lengths(path)
    path.write_text("not json\n")
    with pytest.raises(UsageError, match=":1:"):
        read_lengths(path)


# -- the statistics on hand-made records --------------------------------------------------------

# Three requests. r1's tokens came late because it waited for a slot: added at 1.5.
#   r0 arrives 0, tokens 1 2 3 4:  TTFT 1,   E2E 4,   TPOT (4-1)/3 = 1,     ITL 1 1 1
#   r1 arrives 1, tokens 3 3.5:    TTFT 2,   E2E 2.5, TPOT (2.5-2)/1 = 0.5, ITL 0.5
#   r2 arrives 2, token 2.5:       TTFT 0.5, E2E 0.5, no TPOT (one token),  no ITL
# duration 0 -> 4 s; 7 tokens: 1.75 tokens/s; 3 requests: 0.75/s.
# Percentiles (linear, between order statistics: position q/100 x (n - 1)):
#   TTFT 0.5 1 2:      p50 1,    p90 1 + 0.8 x 1 = 1.8,     p99 1 + 0.98 x 1 = 1.98
#   TPOT 0.5 1:        p50 0.75, p90 0.5 + 0.9 x 0.5 = 0.95, p99 0.995
#   ITL 0.5 1 1 1:     1, 1, 1
#   E2E 0.5 2.5 4:     p50 2.5,  p90 2.5 + 0.8 x 1.5 = 3.7,  p99 2.5 + 0.98 x 1.5 = 3.97
RECORDS = [
    {"arrival_s": 0.0, "added_s": 0.0, "token_times_s": [1.0, 2.0, 3.0, 4.0], "prompt_len": 3,
     "output_len": 4, "finished": True},
    {"arrival_s": 1.0, "added_s": 1.5, "token_times_s": [3.0, 3.5], "prompt_len": 5,
     "output_len": 2, "finished": True},
    {"arrival_s": 2.0, "added_s": 2.0, "token_times_s": [2.5], "prompt_len": 2, "output_len": 1},
]  # fmt: skip


def test_percentiles_are_numpy_s_linear_by_hand():
    assert latency_percentiles([5, 1, 4, 2, 3]) == pytest.approx(
        {"p50": 3.0, "p90": 4.6, "p99": 4.96}  # 1 + 0.99 x 4, not the largest, 5
    )
    assert latency_percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_latencies_throughput_and_goodput_by_hand():
    s = run_summary(RECORDS, policy="continuous", rate=2.0, preemptions=0,
                    slo_ttft=1.0, slo_tpot=0.6)  # fmt: skip
    assert set(s) == ISSUE_KEYS
    assert (s["requests"], s["completed"]) == (3, 3)
    assert s["ttft_s"] == pytest.approx({"p50": 1.0, "p90": 1.8, "p99": 1.98})
    assert s["tpot_s"] == pytest.approx({"p50": 0.75, "p90": 0.95, "p99": 0.995})
    assert s["itl_s"] == pytest.approx({"p50": 1.0, "p90": 1.0, "p99": 1.0})
    assert s["e2e_s"] == pytest.approx({"p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert s["output_tokens_per_s"] == pytest.approx(7 / 4)
    assert s["requests_per_s"] == pytest.approx(3 / 4)
    # both SLOs: r0 fails TPOT (1 > 0.6), r1 fails TTFT (2 > 1), r2 meets both: 1 in 4 s
    assert s["goodput"] == pytest.approx(1 / 4)
    # one SLO at a time: TTFT <= 2 all three; TPOT <= 0.6 r1 and r2 (one token counts 0)
    assert run_summary(RECORDS, policy="c", rate=1, slo_ttft=2.0)["goodput"] == pytest.approx(0.75)
    assert run_summary(RECORDS, policy="c", rate=1, slo_tpot=0.6)["goodput"] == pytest.approx(0.5)
    assert run_summary(RECORDS, policy="c", rate=1)["goodput"] is None
    # no steps (an HTTP client): in flight is the E2E summed over the duration, 7 / 4
    assert s["in_flight_mean"] == pytest.approx(7 / 4)
    assert s["tokens_per_step_mean"] is None and s["kv_utilisation_mean"] is None


def test_an_unfinished_request_counts_in_requests_not_in_latencies():
    cut = [*RECORDS, {"arrival_s": 3.0, "token_times_s": [3.2], "prompt_len": 2,
                      "output_len": 1, "finished": False}]  # fmt: skip
    s = run_summary(cut, policy="static", rate=1.0)
    assert (s["requests"], s["completed"]) == (4, 3)
    assert s["ttft_s"] == pytest.approx({"p50": 1.0, "p90": 1.8, "p99": 1.98})


# -- the replay through a fake engine -----------------------------------------------------------


def test_a_request_is_added_at_its_arrival_never_before():
    """Step 1 s, 4 slots, 2 tokens each. r0 at 0 runs 0-2. r1 arrives at 0.5, mid-step:
    added at the step's end, 1. r2 at 2.25, during r1's last step (2-3): added at 3, runs
    3-5. Then idle: the replay sleeps 2 s, and r3 is added at its arrival, 7, exactly."""
    reqs = [request(0, 0.0, 2), request(1, 0.5, 2), request(2, 2.25, 2), request(3, 7.0, 2)]
    fake, clock, log = run_fake(reqs, slots=4)
    assert [fake.added[f"r{i}"] for i in range(4)] == [0.0, 1.0, 3.0, 7.0]
    assert all(fake.added[r.request_id] >= r.arrival_s for r in reqs)
    assert clock.sleeps == [2.0]
    times = {r["request_id"]: r["token_times_s"] for r in log.requests}
    assert times == {"r0": [1, 2], "r1": [2, 3], "r2": [4, 5], "r3": [8, 9]}
    assert [r["added_s"] for r in log.requests] == [0.0, 1.0, 3.0, 7.0]
    assert all(r["finished"] and r["output_len"] == 2 for r in log.requests)


def test_queued_requests_count_in_flight_ttft_and_little_s_law_by_hand():
    """One slot, two requests at 0 of 2 and 3 tokens: r0 steps 1-2, r1 steps 3-5.
    In flight: 2, 2, 1, 1, 1 over five 1-s steps: mean 7/5. TTFT r0 1, r1 3 (queued).
    Little: completed/duration x mean E2E = 2/5 x (2 + 5)/2 = 7/5."""
    _, _, log = run_fake([request(0, 0.0, 2), request(1, 0.0, 3)], slots=1)
    assert [s["in_flight"] for s in log.steps] == [2, 2, 1, 1, 1]
    s = run_summary(log.requests, log.steps, policy="continuous", rate=math.inf)
    assert s["in_flight_mean"] == pytest.approx(7 / 5)
    assert s["ttft_s"]["p50"] == pytest.approx(2.0)  # between 1 and 3
    assert s["ttft_s"]["p99"] == pytest.approx(1 + 0.99 * 2)


def test_little_s_law_holds_exactly_on_a_deterministic_fake():
    """Arrivals on step boundaries, service in whole steps: the time-weighted in-flight
    count from the steps equals completion rate x mean E2E from the requests."""
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    reqs = [request(i, float(2 * i // 3), n) for i, n in enumerate(lengths)]
    _, _, log = run_fake(reqs, slots=3)
    s = run_summary(log.requests, log.steps, policy="continuous", rate=1.5)
    mean_e2e = np.mean([r["token_times_s"][-1] - r["arrival_s"] for r in log.requests])
    assert s["completed"] == len(lengths)
    assert s["in_flight_mean"] == pytest.approx(s["requests_per_s"] * mean_e2e)
    assert s["in_flight_mean"] > 1  # requests queue: the slots were not one row each


def test_tokens_a_step_come_from_the_engine_continuous_against_static():
    """Two slots, four requests at 0 (prompt 3) of 1, 4, 4, 1 tokens. Continuous: step 1
    prefills r0 r1 (6), then r2 joins r1 (3 + 1), two decodes, then r3 joins r2 (3 + 1):
    6 4 2 2 4 = 18 in 5 steps. Static: r0 r1 (6), r1 alone three steps (1 1 1), then
    r2 r3 (6), r2 alone (1 1 1): 18 in 8 steps."""
    reqs = [request(i, 0.0, n) for i, n in enumerate([1, 4, 4, 1])]
    _, _, cont = run_fake(reqs, slots=2)
    _, _, static = run_fake(reqs, slots=2, policy="static")
    assert [s["tokens"] for s in cont.steps] == [6, 4, 2, 2, 4]
    assert [s["tokens"] for s in static.steps] == [6, 1, 1, 1, 6, 1, 1, 1]
    summaries = [run_summary(x.requests, x.steps, policy=p, rate=math.inf)
                 for x, p in ((cont, "continuous"), (static, "static"))]  # fmt: skip
    assert [x["tokens_per_step_mean"] for x in summaries] == pytest.approx([18 / 5, 18 / 8])
    assert [x["output_tokens_per_s"] for x in summaries] == pytest.approx([10 / 5, 10 / 8])


def test_kv_utilisation_paged_and_reserved_by_hand():
    """One request, prompt 5, 3 tokens, pages of 4, context 16. After step 1: 6 tokens on
    2 pages, 6/8 paged, 6/16 reserved; step 2: 7/8 and 7/16; after step 3 nothing runs.
    Means over the two steps with pages in use: 0.8125 and 0.40625."""
    _, _, log = run_fake([request(0, 0.0, 3, prompt_len=5)], slots=2, page_size=4)
    assert [s["kv_utilisation"] for s in log.steps] == [0.75, 0.875, None]
    s = run_summary(log.requests, log.steps, policy="continuous", rate=1.0, preemptions=0)
    assert s["kv_utilisation_mean"] == pytest.approx(0.8125)
    assert s["kv_utilisation_reserved"] == pytest.approx(0.40625)


def test_host_time_between_steps_is_measured_and_preemptions_counted_from_the_start():
    """Each stats() costs 0.01 s of host time and the engine reports 0.002 s of its own:
    every step after the first waited 0.012 s on the host; the first, after nothing, 0.002.
    The engine had preempted 3 times before this run and preempts once in it."""
    _, _, log = run_fake([request(0, 0.0, 4)], slots=1, stats_s=0.01, engine_host_s=0.002,
                         preempt_at_step=2, preemptions=3)  # fmt: skip
    assert [s["host_s"] for s in log.steps] == pytest.approx([0.002, 0.012, 0.012, 0.012])
    assert [s["step_s"] for s in log.steps] == pytest.approx([1.0] * 4)
    wait = host_wait(log.steps)
    assert wait["host_fraction"] == pytest.approx(0.038 / 4)
    assert log.preemptions == 1


def test_the_table_has_a_row_a_run_and_the_curve_is_a_png(tmp_path):
    runs = [run_summary(RECORDS, policy=p, rate=r, preemptions=0, slo_ttft=1.0)
            for p in ("continuous", "static") for r in (1.0, math.inf)]  # fmt: skip
    lines = runs_table_lines(runs)
    assert len(lines) == 1 + len(runs) + 1
    assert lines[1].split()[:2] == ["continuous", "1"] and lines[4].split()[:2] == ["static", "all"]
    path = latency_throughput_chart(runs, str(tmp_path / "curve.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

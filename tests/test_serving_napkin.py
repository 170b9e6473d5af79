"""The serving napkin (roofline/plan/batching.py) held to hand counts, and python -m roofline
serve held to the JAX scaling book's LLaMA-3-70B on TPU v5e ("Serving LLaMA 3-70B"): its
JSON, the MLPerf SLO presets, and bad input answered on one line with exit status 2."""

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import REPO, roofline_command

from roofline.hardware import find_chip
from roofline.plan import batching
from sessions.model.config import PUBLISHED

LLAMA3_70B = PUBLISHED["llama3-70b"].model  # L=80 E=8192 F=28672 H=64 K=8 D=128 V=128256


def test_expected_max_of_uniform_on_one_to_three_at_batch_two_by_enumeration():
    """The 9 pairs of {1, 2, 3}: maxima 1 (once), 2 (3 times), 3 (5 times): 22/9."""
    pairs = list(itertools.product([1, 2, 3], repeat=2))
    by_hand = sum(max(p) for p in pairs) / len(pairs)
    assert by_hand == pytest.approx(22 / 9)
    assert batching.expected_max_uniform(2, 1, 3) == pytest.approx(by_hand)
    assert batching.expected_max(2, [1, 2, 3]) == pytest.approx(by_hand)
    # mean 2: continuous makes 22/18 = 1.22x static's tokens a step
    assert batching.continuous_over_static_uniform(2, 1, 3) == pytest.approx(11 / 9)


def test_expected_max_of_a_weighted_pmf_by_enumeration():
    """Lengths 2 w.p. 3/4, 10 w.p. 1/4, B = 3: the max is 2 only if all three are, (3/4)^3 =
    27/64; so E[max] = 2·27/64 + 10·37/64 = 424/64 = 6.625; mean 4: ratio 1.65625."""
    assert batching.expected_max(3, [10, 2], [1, 3]) == pytest.approx(6.625)
    assert batching.continuous_over_static(3, [10, 2], [1, 3]) == pytest.approx(1.65625)
    # the same distribution as a list of observed lengths (the empirical one)
    assert batching.continuous_over_static(3, [2, 2, 10, 2]) == pytest.approx(1.65625)


def test_prefill_that_is_not_free_shrinks_the_ratio():
    """Lengths {1, 3} equally, B = 2: E[max] = 1·1/4 + 3·3/4 = 2.5, E[G] = 2. Steps of 10 ms,
    prefill 20 ms: static spends 2·20 + 2.5·10 = 65 ms a batch for 4 tokens, continuous
    20 + 2·10/2 = 30 ms a request for 2: 65/60 = 1.0833, against 1.25 with prefill free."""
    ratio = batching.continuous_over_static_with_prefill(2, 0.010, 0.020, [1, 3])
    assert ratio == pytest.approx(65 / 60)
    assert batching.continuous_over_static_with_prefill(2, 0.010, 0.0, [1, 3]) == 1.25


def test_continuous_over_static_at_eight_slots_matches_the_issue_s_figures():
    """Uniform on [1, N], large N: 2B/(B+1) = 16/9 = 1.78; on [N/2, N]: (1/2 + 4/9)/(3/4) =
    68/54 = 1.26; exponential: H_8 = 1 + 1/2 + ... + 1/8 = 761/280 = 2.718."""
    N = 20_000
    assert batching.continuous_over_static_uniform(8, 1, N) == pytest.approx(16 / 9, rel=1e-3)
    assert batching.continuous_over_static_uniform(8, N // 2, N) == pytest.approx(68 / 54, rel=1e-3)
    assert batching.continuous_over_static_exponential(8) == pytest.approx(761 / 280)
    assert round(761 / 280, 2) == 2.72


def test_exponential_ratio_is_the_mean_of_the_max_of_draws():
    """H_B against the empirical E[max] of a fine grid of exponential quantiles."""
    n = 20_000
    lengths = [-math.log(1 - (i + 0.5) / n) for i in range(n)]  # quantiles of Exp(1), floats
    empirical = _max_mean(lengths, 4) / (sum(lengths) / n)
    assert batching.continuous_over_static_exponential(4) == pytest.approx(empirical, rel=2e-3)
    assert batching.continuous_over_static_exponential(4) == pytest.approx(25 / 12)


def _max_mean(sorted_values, batch):
    """E[max of `batch` draws] from equally likely sorted values: sum v_i ((i/n)^B - ((i-1)/n)^B)."""
    n = len(sorted_values)
    return sum(v * (((i + 1) / n) ** batch - (i / n) ** batch) for i, v in enumerate(sorted_values))


def test_little_s_law_and_the_knee():
    """2 requests/s for 3 s each: 6 in flight. 8 slots, 10 ms steps, 100 tokens out: a slot
    frees each second, 8 requests/s; with 50 ms of prefill a request stalling all 8:
    8 / (1 + 0.4) = 5.714 requests/s."""
    assert batching.littles_law_in_flight(2.0, 3.0) == pytest.approx(6.0)
    assert batching.knee_rate(8, 0.010, 100) == pytest.approx(8.0)
    assert batching.knee_rate(8, 0.010, 100, prefill_s=0.05) == pytest.approx(8 / 1.4)


def test_pages_paged_against_reserved():
    """Pages of 16: 1 token takes 1 page, 16 one, 17 two. A pool of 10 pages holds lengths
    30 (2), 40 (3), 5 (1), 64 (4): 10 pages, all four; a fifth of 1 token does not fit. Its
    160 tokens reserving T = 64 each: 2 sequences. Utilisation: 139 tokens in 10 pages of
    16 = 0.86875; reserving 4 x 64: 139/256."""
    assert [batching.pages_of(n, 16) for n in (1, 16, 17)] == [1, 1, 2]
    lengths = [30, 40, 5, 64]
    assert batching.sequences_paged(10, 16, lengths) == 4
    assert batching.sequences_paged(10, 16, [*lengths, 1]) == 4
    assert batching.sequences_reserved(160, 64) == 2
    assert batching.kv_utilisation_paged(lengths, 16) == pytest.approx(139 / 160)
    assert batching.kv_utilisation_reserved(lengths, 64) == pytest.approx(139 / 256)
    # Offsets uniform over a page: lengths 100..115 once each, 1,720 tokens; 100..112 take
    # 7 pages, 113..115 take 8: 115 pages, 1,840 slots. Mean 107.5, and the last page wastes
    # (16 - 1)/2 = 7.5 on average: 107.5 / 115, the same.
    lengths = list(range(100, 116))
    assert batching.kv_utilisation_paged(lengths, 16) == pytest.approx(1720 / 1840)
    assert batching.expected_utilisation_paged(107.5, 16) == pytest.approx(1720 / 1840)


def test_the_book_s_kv_tokens_freed_and_prefill_to_generate():
    """The book: 32 · (8192 + 4096) / 4096 = 96 tokens a step; P = 3G from
    0.91 · 32 / (0.019 · 512) = 2.99."""
    assert batching.kv_tokens_freed_per_step(32, 8192, 4096) == 96
    assert batching.prefill_to_generate(0.91, 32, 512, 0.019) == pytest.approx(29.12 / 9.728)
    assert round(batching.prefill_to_generate(0.91, 32, 512, 0.019)) == 3


def test_the_paged_step_reads_the_cache_three_times():
    """LLaMA-3-70B int8 at B = 32, T = 8,192 on 8 v5e: the cache is 32 · 8192 · 168,960 =
    44,291,850,240 bytes; paged, the step moves W + 3x that, W the contiguous step's rest."""
    chip = find_chip("tpu-v5e")
    cfg = dataclasses.replace(LLAMA3_70B, seq=8192)
    roofs = {"peak_flops": chip.peak("bfloat16"), "bandwidth": chip.hbm_bandwidth}
    p = batching.paged_step_cost(cfg, 32, weights="int8", cache="int8", chips=8, **roofs)
    cache = 32 * 8192 * 168_960
    assert p.contiguous.cache_bytes == cache
    assert p.paged_bytes - p.contiguous.bytes == 2 * cache
    assert p.paged_s == pytest.approx(p.paged_bytes / (8 * 819e9))
    assert p.ratio == pytest.approx(p.paged_bytes / p.contiguous.bytes)


BOOK = ["serve", "--preset", "llama3-70b", "--chip", "tpu-v5e", "--weights", "int8"]
BOOK += ["--cache", "int8", "--prompt", "8192", "--output", "4096", "--context", "12288"]


def serve_summary(argv, tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert roofline_command([*argv, "--summary-out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_the_book_s_llama3_70b_on_v5e_as_a_subprocess(tmp_path):
    """The book's worked figures. KV: 2 · K 8 · D 128 · L 80 = 163,840 bytes of int8 values a
    token (160 KiB), and a float32 scale a token and KV head for keys and values, 2 · 80 · 8 ·
    4 = 5,120 more: 168,960. The step at B = 32, P = 8,192 on a 4x2: (KV + params) /
    (8 · 819 GB/s); the book: 112e9 / (8 · 8.1e11) = 17 ms. B·(P + G)/G = 96."""
    out = tmp_path / "book.json"
    argv = [sys.executable, "-m", "roofline", *BOOK, "--chips", "8", "--batch", "32"]
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [*argv, "--summary-out", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    s = json.loads(out.read_text())
    assert s["kv_value_bytes_per_token"] == 2 * 8 * 128 * 80 == 163_840
    assert s["kv_bytes_per_token"] == 163_840 + 2 * 80 * 8 * 4 == 168_960
    assert s["batch"] == 32 and s["kv_tokens_freed_per_step"] == 96
    # bytes by hand: 32 · 8192 · 168,960 of cache; 69,501,714,432 matmul weights of 1 byte
    # (the scales, norms and a row of the embedding add 0.04%)
    cache = 32 * 8192 * 168_960
    by_hand = (cache + 69_501_714_432) / (8 * 819e9)
    assert s["decode_step_s"] == pytest.approx(by_hand, rel=1e-3)
    assert 17e-3 < s["decode_step_s"] < 17.5e-3  # the book's "about 17ms"
    assert s["tokens_per_s_per_chip"] == pytest.approx(32 / s["decode_step_s"] / 8)
    # P + G = 12,288 positions: 32 caches do not fit in 8 x 16 GB beside 70.6 GB (the book:
    # "a tight fit" at 8,192 already); at 8,192 they do: 44.3 + 70.6 <= 128 GB
    assert s["fits"] is False and s["fits_at_prompt"] is True
    for key in ("prefill_s", "requests_per_s_per_replica", "prefill_to_generate", "min_chips"):
        assert key in s
    assert all(line.startswith(("predicted", "assumed")) for line in _napkin(done.stdout))


def _napkin(out):
    """The lines after the heading block (the first blank line)."""
    return out.split("\n\n", 1)[1].strip().splitlines()


def test_the_book_s_prefill_on_sixteen_chips_at_forty_percent(tmp_path, capsys):
    """2 FLOPs a matmul weight a token: 2 · 69,501,714,432 · 8192 over 16 · 197e12 · 0.4 =
    0.903 s; the book: 2 · 70e9 · 8192 / (16 · 1.97e14 · 0.4) = 0.91 s, 70e9 rounded from
    70.55e9 parameters, the 1.05e9 of the embedding table among them. MFU ignored would
    give 0.36 s."""
    s, _ = serve_summary([*BOOK, "--chips", "16", "--batch", "32"], tmp_path, capsys)
    by_hand = 2 * 69_501_714_432 * 8192 / (16 * 197e12 * 0.4)
    assert s["prefill_s"] == pytest.approx(by_hand)
    assert s["prefill_s"] == pytest.approx(0.91, rel=0.01)
    s, _ = serve_summary([*BOOK, "--chips", "16", "--prefill-mfu", "0.8"], tmp_path, capsys)
    assert s["prefill_s"] == pytest.approx(by_hand / 2)


def test_the_book_s_prefill_to_generate_in_bf16(tmp_path, capsys):
    """The book's bf16 setting: a 4x4, P = 8,192, G = 512, prefill 0.91 s, "19ms per decode
    step at batch size 43 (let's call that 32)": 3. Here at B = 32 the step is 17.2 ms (the
    19 ms is B = 43's), so 0.903 · 32 / (512 · 0.0172) = 3.3: about 3."""
    argv = ["serve", "--preset", "llama3-70b", "--chip", "tpu-v5e", "--chips", "16"]
    argv += ["--prompt", "8192", "--output", "512", "--context", "8704", "--batch", "32"]
    s, _ = serve_summary(argv, tmp_path, capsys)
    assert s["kv_bytes_per_token"] == 2 * 8 * 128 * 80 * 2  # bf16, no scales
    by_hand = s["prefill_s"] * 32 / (512 * s["decode_step_s"])
    assert s["prefill_to_generate"] == pytest.approx(by_hand)
    assert 2.5 < s["prefill_to_generate"] < 3.5


@pytest.mark.parametrize(
    "slo, ttft, tpot", [("mlperf-llama2-70b", 2.0, 0.2), ("mlperf-llama3.1-8b", 2.0, 0.1)]
)
def test_mlperf_slos_pick_the_largest_batch_that_meets_them(slo, ttft, tpot, tmp_path, capsys):
    """Without --batch: the largest that fits and whose step is within the TPOT; one more
    slot would miss it or not fit. llama3-8b on one H100."""
    argv = ["serve", "--preset", "llama3-8b", "--chip", "h100", "--prompt", "1024"]
    s, _ = serve_summary([*argv, "--output", "256", "--slo", slo], tmp_path, capsys)
    assert (s["slo_ttft_s"], s["slo_tpot_s"]) == (ttft, tpot)
    B = s["batch"]
    assert s["meets_slos"] and s["fits"] and s["decode_step_s"] <= tpot
    nxt, _ = serve_summary([*argv, "--output", "256", "--batch", str(B + 1)], tmp_path, capsys)
    assert not nxt["fits"] or nxt["decode_step_s"] > tpot
    tight, _ = serve_summary(
        [*argv, "--output", "256", "--slo", slo, "--slo-tpot", "0.005"], tmp_path, capsys
    )
    assert tight["slo_tpot_s"] == 0.005 and tight["batch"] < B


def test_fewest_chips_for_a_rate(tmp_path, capsys):
    """10 requests/s: replicas of N chips each serve B / (G·step + B·prefill)."""
    argv = ["serve", "--preset", "llama3-8b", "--chip", "h100", "--prompt", "1024"]
    s, _ = serve_summary([*argv, "--output", "256", "--rate", "10"], tmp_path, capsys)
    B, step, prefill = s["batch"], s["decode_step_s"], s["prefill_s"]
    replica = B / (256 * step + B * prefill)
    assert s["requests_per_s_per_replica"] == pytest.approx(replica)
    assert s["min_chips_colocated"] == math.ceil(10 / replica)
    generate = math.ceil(10 / (B / (256 * step)))
    assert s["min_chips_disaggregated"] == generate + math.ceil(10 * prefill)
    assert s["min_chips"] == min(s["min_chips_colocated"], s["min_chips_disaggregated"])


BAD = ["serve", "--preset", "llama3-8b", "--chip", "h100", "--prompt", "1024", "--output"]


@pytest.mark.parametrize(
    "argv, says",
    [
        ([*BAD, "256", "--slo", "mlperf-gpt4"], "invalid choice"),
        (["serve", "--preset", "nope", "--chip", "h100", "--prompt", "1", "--output", "1"], "nope"),
        ([*BAD[:4], "tpu-v9", *BAD[5:], "256"], "tpu-v9"),
        ([*BAD, "0"], "positive"),
        ([*BAD, "256", "--rate", "-1"], "positive"),
        ([*BAD, "256", "--prefill-mfu", "1.5"], "fraction"),
        ([*BAD, "8000"], "past the context"),
        ([*BAD, "256", "--chips", "3"], "splits"),
        (["serve", "--preset", "gpt2", "--chip", "h100", "--prompt", "1", "--output", "1",
          "--context", "2048"], "learned position table"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert roofline_command(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err

"""The planner for published models: their presets count what the models report,
a decode step's bytes (GQA, int8 weights, int8 cache), whether it fits, its bound,
the critical batch, the time to the first token and a training run's days, each
against numbers worked by hand here; and `python -m roofline decode / predict`
write them as JSON and answer bad input on one line with exit status 2."""

import dataclasses
import json
import math
import os
import re

import pytest
from helpers import REPO, roofline_command

from roofline import decode_cost
from roofline.flops import param_count
from roofline.hardware import find_chip
from roofline.plan.serving import plan_serving
from sessions.model.config import PRESETS, PUBLISHED

# bf16 dense FLOP/s, bytes/s, bytes: NVIDIA's "80GB" is 80 GiB (roofline/gpus.py)
H100_PEAK, H100_BW, H100_HBM = 989e12, 3.35e12, 80 * 2**30
A100_PEAK = 312e12

LLAMA3_8B = PUBLISHED["llama3-8b"].model  # L=32 E=4096 F=14336 H=32 K=8 D=128 V=128256
# Its matmul weights, by hand. Per layer: wq and wo E·H·D = 4096·4096 = 16,777,216 each;
# wk and wv E·K·D = 4096·1024 = 4,194,304 each; w_in, w_gate, w_out E·F = 4096·14336 =
# 58,720,256 each: 33,554,432 + 8,388,608 + 176,160,768 = 218,103,808; x 32 layers =
# 6,979,321,856; plus the unembedding V·E = 128256·4096 = 525,336,576.
LLAMA3_8B_MATMUL = 7_504_658_432
# Norm scales: 2 per layer and a final one, of E: (2·32 + 1)·4096 = 266,240.
LLAMA3_8B_NORMS = 266_240
# int8 scales of what a step reads, one per output channel: per layer wq H·D 4096, wk and
# wv K·D 1024 each, wo E 4096, w_in and w_gate F 14336 each, w_out E 4096 = 43,008;
# x 32 = 1,376,256; plus the unembedding's V = 128,256.
LLAMA3_8B_SCALES = 1_504_512
# One sequence's KV cache at T = 8,192 in bf16: 2 (k, v) · L 32 · T 8192 · K 8 · D 128 ·
# 2 bytes = 1,073,741,824 (exactly 1 GiB); 131,072 bytes per position.
LLAMA3_8B_CACHE = 1_073_741_824


def summary_of(argv, tmp_path, capsys):
    """Run `python -m roofline ARGV --summary-out FILE` in this process; (JSON, stdout)."""
    out = tmp_path / "summary.json"
    assert roofline_command([*argv, "--summary-out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.parametrize(
    "name, params",
    [
        # Each model's own count (Hugging Face's safetensors total): ours must equal it,
        # GPT-2's less its 102,144 biases and LayerNorm shifts, which our family lacks.
        ("gpt2", 124_439_808 - 102_144),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3.2-1b", 1_235_814_400),
    ],
)
def test_published_presets_count_the_parameters_each_model_reports(name, params):
    assert param_count(PUBLISHED[name].model) == params
    assert PUBLISHED[name].source.startswith("https://huggingface.co/")
    assert PUBLISHED[name].model.dtype == "bfloat16"


def test_one_model_a_name_gpt2_is_published_and_gpt2_bytes_is_the_course_s(tmp_path, capsys):
    """No name is both a course preset and a published model: the planner's gpt2 is GPT-2
    with its 50,257 tokens, its gpt2-bytes the course's model, the same shapes on bytes;
    compare, which reads the course's runs, refuses gpt2 on one line naming gpt2-bytes."""
    assert not set(PRESETS) & set(PUBLISHED)
    assert PUBLISHED["gpt2"].model.vocab == 50_257 and PRESETS["gpt2-bytes"].model.vocab == 256
    smaller = (50_257 - 256) * 768  # the embedding's rows that bytes do without
    for name, params, says in [
        ("gpt2", 124_337_664, "gpt2, published: https://huggingface.co/openai-community/gpt2"),
        ("gpt2-bytes", 124_337_664 - smaller, "gpt2-bytes, a course preset"),
    ]:
        summary, out = summary_of(["predict", "--preset", name, "--chip", "h100"], tmp_path, capsys)
        assert summary["params"] == params and out.splitlines()[0].startswith(f"predict: {says}")
    assert roofline_command(["compare", str(tmp_path), "--preset", "gpt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("the course's GPT-2 on bytes is gpt2-bytes")


def test_kv_cache_bytes_under_gqa_and_int8_for_llama3_8b():
    assert decode_cost.kv_cache_bytes(LLAMA3_8B, 1) == LLAMA3_8B_CACHE
    # 3 sequences at T = 4,096: 3 · 2 · 32 · 4096 · 8 · 128 · 2 = 1,610,612,736.
    short = dataclasses.replace(LLAMA3_8B, seq=4_096)
    assert decode_cost.kv_cache_bytes(short, 3) == 1_610_612_736
    # int8: 1 byte a value plus a float32 scale per (token, KV head), for k and for v:
    # 2 · 32 · 8192 · 8 · (128 + 4) = 553,648,128.
    assert decode_cost.kv_cache_bytes(LLAMA3_8B, 1, cache="int8") == 553_648_128
    # Multi-head (K = H = 32) holds G = 4 times the bytes.
    mha = dataclasses.replace(LLAMA3_8B, kv_heads=None)
    assert decode_cost.kv_cache_bytes(mha, 1) == 4 * LLAMA3_8B_CACHE


def test_weight_bytes_bf16_and_int8_for_llama3_8b():
    # Read per step in bf16: the matmul weights, the norms and the one embedding row each
    # token looks up (untied), 2 bytes each: (7,504,658,432 + 266,240 + 4,096) · 2.
    assert decode_cost.weight_bytes(LLAMA3_8B) == 15_009_857_536
    # int8: 1 byte a matmul value and the row (4,096), 4 per scale (1,504,512 and the
    # row's 1), the norms in bf16: 7,504,662,528 + 6,018,052 + 532,480 = 7,511,213,060.
    int8 = LLAMA3_8B_MATMUL + 4_096 + 4 * (LLAMA3_8B_SCALES + 1) + 2 * LLAMA3_8B_NORMS
    assert int8 == 7_511_213_060 == decode_cost.weight_bytes(LLAMA3_8B, weights="int8")
    # Held whole: every parameter, 8,030,261,248 · 2 bytes in bf16; in int8 the matmul
    # weights and the 525,336,576-value embedding table 1 byte each, their scales
    # (1,504,512 + the table's 128,256 rows) 4 bytes, the norms 2:
    # 8,029,995,008 + 6,531,072 + 532,480 = 8,037,058,560.
    assert decode_cost.stored_weight_bytes(LLAMA3_8B) == 16_060_522_496
    assert decode_cost.stored_weight_bytes(LLAMA3_8B, weights="int8") == 8_037_058_560


def test_weight_bytes_of_a_tied_model_with_a_positional_table():
    # GPT-2: per layer 2·E·F + 4·E·H·D = 4,718,592 + 2,359,296 = 7,077,888, x 12 =
    # 84,934,656, plus the tied embedding V·E = 50257·768 = 38,597,376: 123,532,032;
    # norms (2·12 + 1)·768 = 19,200; one row of the positional table, 768.
    gpt2 = PUBLISHED["gpt2"].model
    assert decode_cost.weight_bytes(gpt2) == (123_532_032 + 19_200 + 768) * 2 == 247_104_000


def llama3_8b_plan(batches, chips=1, context=8_192, **levers):
    return plan_serving(
        LLAMA3_8B,
        find_chip("h100"),
        batches=batches,
        prompt=1_024,
        context=context,
        chips=chips,
        **levers,
    )


def test_fits_and_does_not_fit_on_an_h100():
    # Held: 16,060,522,496 bytes of weights + B · 1,073,741,824 of cache within 80 GiB,
    # 85,899,345,920 bytes: B <= 69,838,823,424 / 1,073,741,824 = 65.04, so 65 fits
    # (85,853,741,056 bytes) and 66 does not (86,927,482,880). Against 80e9 it would be 59.
    plan = llama3_8b_plan([65, 66])
    assert [r.fits for r in plan.batches] == [True, False]
    assert plan.batches[0].total_bytes == 16_060_522_496 + 65 * LLAMA3_8B_CACHE
    assert plan.max_batch == 65
    # Two chips hold twice: (171,798,691,840 − 16,060,522,496) / 1,073,741,824 = 145.04.
    assert llama3_8b_plan([145, 146], chips=2).max_batch == 145


def test_tokens_per_second_at_batch_1_is_bandwidth_over_bytes():
    # 3.35e12 B/s / (15,009,857,536 + 1,073,741,824) bytes = 208.29 tokens/s; two chips
    # of tensor parallelism each read half: twice that.
    one = llama3_8b_plan([1]).batches[0].step
    assert one.bound == "memory"
    assert one.tokens_per_s == pytest.approx(H100_BW / 16_083_599_360, rel=1e-12)
    assert one.tokens_per_s == pytest.approx(208.29, abs=0.01)
    two = llama3_8b_plan([1], chips=2).batches[0].step
    assert two.tokens_per_s == pytest.approx(2 * H100_BW / 16_083_599_360, rel=1e-12)


# At T = 256, by hand: f = 2·P_matmul + 4·L·T·H·D = 15,009,316,864 + 4·32·256·32·128 =
# 15,143,534,592 FLOPs per sequence; C = 131,072 · 256 = 33,554,432 bytes (int8:
# 2·32·256·8·132 = 17,301,504). B* = W / (f · bw / peak − C).
F_256, C_256, C_256_INT8 = 15_143_534_592, 33_554_432, 17_301_504


def test_the_critical_batch_with_and_without_int8():
    def hand(w, c):
        return w / (F_256 * H100_BW / H100_PEAK - c)

    bf16 = llama3_8b_plan([1], context=256)
    assert hand(15_009_857_536, C_256) == pytest.approx(846.07, abs=0.01)
    assert bf16.critical_batch == pytest.approx(hand(15_009_857_536, C_256), rel=1e-12)
    # int8 weights halve W; the FLOPs stay at the bf16 peak: B* halves too, to 423.39.
    int8 = llama3_8b_plan([1], context=256, weights="int8")
    assert int8.critical_batch == pytest.approx(hand(7_511_213_060, C_256), rel=1e-12)
    assert int8.critical_batch == pytest.approx(423.39, abs=0.01)
    both = llama3_8b_plan([1], context=256, weights="int8", cache="int8")
    assert both.critical_batch == pytest.approx(hand(7_511_213_060, C_256_INT8), rel=1e-12)
    # At T = 8,192 a sequence's cache (1 GiB: 0.32 ms at 3.35 TB/s) outlasts its FLOPs
    # (2·7,504,658,432 + 4·32·8192·32·128 = 19,304,284,160: 19.5 us): never compute-bound.
    assert llama3_8b_plan([1]).critical_batch is None


def test_time_to_first_token():
    # Prefill of 1,024 tokens: 2·1024·(P_matmul − V·E) = 2·1024·6,979,321,856 =
    # 14,293,651,161,088; the unembedding for the last token only, 2·525,336,576 =
    # 1,050,673,152; attention in full, 4·L·P²·H·D = 4·32·1024²·32·128 = 549,755,813,888:
    # 14,844,457,648,128 FLOPs, 15.01 ms at 989 TFLOP/s, above the memory bound's
    # (15,009,857,536 + 134,217,728 bytes) / 3.35e12 = 4.52 ms.
    ttft = llama3_8b_plan([1]).ttft
    assert ttft.bound == "compute"
    assert ttft.step_s == pytest.approx(14_844_457_648_128 / H100_PEAK, rel=1e-12)
    assert llama3_8b_plan([1], chips=4).ttft.step_s == pytest.approx(ttft.step_s / 4)


DECODE = ["decode", "--preset", "llama3-8b", "--chip", "h100", "--chips", "1"]


def test_decode_s_summary_keys_and_numbers(tmp_path, capsys):
    summary, out = summary_of(
        [*DECODE, "--batches", "1,8,66", "--context", "8192"], tmp_path, capsys
    )
    keys = {"batch", "kv_cache_bytes", "total_bytes", "fits", "step_seconds", "bound"}
    keys |= {"tokens_per_second", "launch_seconds", "floor_step_seconds", "floor_bound"}
    keys |= {"estimate_step_seconds", "estimate_bound", "estimate_launch_seconds"}
    keys |= {"estimate_all_reduce_seconds", "achievable_bandwidth"}
    assert [set(b) for b in summary["batches"]] == 3 * [keys]
    # XLA's 13 kernels a layer and 7 besides: 32 x 13 + 7 = 423 a token, 1.513 us each
    # (90.77 us / 60): 0.640 ms, under the 4.80 ms the bytes take at batch 1.
    assert summary["kernels_per_token"] == 423
    assert summary["batches"][0]["launch_seconds"] == pytest.approx(423 * 90.77e-6 / 60)
    assert [b["bound"] for b in summary["batches"]] == ["bytes"] * 3
    assert summary["params"] == 8_030_261_248 and summary["critical_batch"] is None
    assert [b["fits"] for b in summary["batches"]] == [True, True, False]
    # Batch 66: 66 GiB of cache, 86.93 GB held, past 80 GiB: printed, not raised.
    assert summary["batches"][2]["kv_cache_bytes"] == 66 * LLAMA3_8B_CACHE
    assert summary["hbm_bytes"] == H100_HBM
    assert "does not fit" in out and "GB = 1e9 bytes, GiB = 2^30" in out
    assert "80 GiB (85.90 GB) HBM each" in out and "fits 1 x 80 GiB" in out
    # The napkin beside B* drops the cache's bytes, not its attention FLOPs: it says so.
    assert "memory-bound (the cache's bytes left out, B* = " in out
    assert out.splitlines()[0].startswith("decode: llama3-8b, published: https://")
    one = summary["batches"][0]
    assert one["tokens_per_second"] == pytest.approx(H100_BW / 16_083_599_360, rel=1e-12)
    assert summary["ttft_seconds"] == pytest.approx(14_844_457_648_128 / H100_PEAK, rel=1e-12)


def test_decode_s_critical_batch_is_rounded_up(tmp_path, capsys):
    summary, _ = summary_of([*DECODE, "--context", "256", "--weights", "int8"], tmp_path, capsys)
    assert summary["critical_batch"] == 424  # 423.39 sequences, by hand above
    assert summary["weights"] == "int8" and summary["cache"] == "bfloat16"


def test_decode_kv_heads_override(tmp_path, capsys):
    # K = 1 (multi-query): 2·32·8192·1·128·2 = 134,217,728 bytes a sequence.
    summary, _ = summary_of([*DECODE, "--kv-heads", "1", "--batches", "1"], tmp_path, capsys)
    assert summary["batches"][0]["kv_cache_bytes"] == 134_217_728


def test_predict_a_training_run_of_llama2_7b(tmp_path, capsys):
    # Per token: 6·P_matmul + 12·L·H·D·S. P_matmul = 32·(4·4096² + 3·4096·11008) +
    # 32000·4096 = 32·202,375,168 + 131,072,000 = 6,607,077,376; 6 of it =
    # 39,642,464,256; attention 12·32·32·128·4096 = 6,442,450,944: 46,084,915,200.
    # On 2T tokens: 92,169,830,400,000,000,000,000 FLOPs. On 2,048 A100s (312 TFLOP/s
    # bf16) at MFU 0.4: 9.21698304e22 / (2048 · 312e12 · 0.4) = 360,615.4 s = 4.174 days.
    argv = ["predict", "--preset", "llama2-7b", "--chip", "a100", "--chips", "2048"]
    summary, out = summary_of([*argv, "--tokens", "2e12", "--mfu", "0.4"], tmp_path, capsys)
    assert summary["training_flops"] == 92_169_830_400_000_000_000_000
    assert summary["days"] == pytest.approx(9.21698304e22 / (2048 * A100_PEAK * 0.4) / 86_400)
    assert summary["days"] == pytest.approx(4.174, abs=0.001)
    # 6·T·P, beside it: 6 · 2e12 · 6,738,415,616.
    assert summary["napkin_flops"] == 6 * 2 * 10**12 * 6_738_415_616
    assert summary["params"] == 6_738_415_616 and summary["step_seconds"] > 0
    assert out.splitlines()[0].startswith("predict: llama2-7b, published: https://")


def test_predict_takes_gpt2_as_published_and_keeps_the_course_s_presets(tmp_path, capsys):
    summary, _ = summary_of(["predict", "--preset", "gpt2", "--chip", "h100"], tmp_path, capsys)
    assert summary["params"] == 124_337_664 and summary["batch"] == 512
    assert set(summary) >= {"params", "step_seconds"} and "days" not in summary
    summary, out = summary_of(["predict", "--preset", "cpu"], tmp_path, capsys)
    assert "a course preset" in out.splitlines()[0]


@pytest.mark.parametrize(
    "argv, says",
    [
        ([*DECODE, "--kv-heads", "5"], "must divide the 32 query heads"),
        (["decode", "--preset", "llama5"], "invalid choice"),
        (["decode", "--preset", "llama3-8b", "--chip", "h1000"], "unknown chip 'h1000'"),
        (["decode", "--preset", "llama3-8b", "--chip", "local"], "a chip of the table"),
        ([*DECODE, "--batches", "1,0"], "positive integers"),
        ([*DECODE, "--chips", "0"], "positive"),
        (
            ["decode", "--preset", "gpt2", "--chip", "h100", "--context", "2048"],
            "--context 2,048: gpt2's learned position table has 1,024 rows",
        ),
        # 32 query heads and 8 key/value heads split over 1, 2, 4, 8 chips (shares of
        # both), 16 or 32 (copies of the 8); 3 splits neither.
        (
            [*DECODE, "--chips", "3"],
            "--chips 3: tensor parallelism splits the 32 query heads and the 8 key/value "
            "heads evenly (try 1, 2, 4, 8, 16, 32)",
        ),
        ([*DECODE, "--context", "512", "--prompt", "1024"], "longer than the context"),
        ([*DECODE, "--weights", "int4"], "invalid choice"),
        (["predict", "--preset", "llama2-7b", "--weights", "int8"], "roofline decode"),
        (["predict", "--preset", "llama2-7b", "--cache", "int8"], "roofline decode"),
        (["predict", "--preset", "llama3-8b", "--kv-heads", "3"], "must divide"),
        (["predict", "--preset", "llama2-7b", "--tokens", "2e12", "--mfu", "40"], "0.4"),
        (["predict", "--preset", "llama2-7b", "--tokens", "2e12"], "go together"),
        (["predict", "--preset", "llama2-7b", "--tokens", "0", "--mfu", "0.4"], "positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert roofline_command(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize(
    "preset, context, published", [("llama2-13b", 8_192, 4_096), ("llama3-8b", 131_072, 8_192)]
)
def test_a_rope_model_is_planned_past_its_published_context_as_a_what_if(
    preset, context, published, tmp_path, capsys
):
    """The scaling book's LLaMA-2-13B table is at 8,192; Llama 3.1's shape is LLaMA-3-8B at
    131,072. Rotary positions have no table to run out of: planned, and said to be a
    what-if. The cache grows with the context: 2 (k, v) x L x K x D x 2 bytes a position,
    LLaMA-2-13B's 2 x 40 x 40 x 128 x 2 = 819,200, so 8,192 positions hold 6,710,886,400."""
    argv = ["decode", "--preset", preset, "--chip", "h100", "--context", str(context)]
    summary, out = summary_of([*argv, "--batches", "1"], tmp_path, capsys)
    assert summary["context"] == context and summary["published_context"] == published
    what_if = out.splitlines()[1]
    assert what_if.startswith(f"what-if: {context:,} positions, past the {published:,}")
    if preset == "llama2-13b":
        assert summary["batches"][0]["kv_cache_bytes"] == 6_710_886_400


@pytest.mark.parametrize("preset, heads", [("llama2-7b", ""), ("llama3-8b", " K=8 ")])
def test_predict_names_key_value_heads_only_where_fewer_than_the_query_heads(preset, heads, capsys):
    """LLaMA-2-7B has no grouped-query attention (K = H = 32): no K in its line; LLaMA-3-8B
    has K = 8 of 32, said once."""
    assert roofline_command(["predict", "--preset", preset, "--chip", "h100"]) == 0
    step = capsys.readouterr().out.splitlines()[1]
    assert step.count("K=") == (1 if heads else 0) and heads in step, step


def test_ttft_is_a_lower_bound_and_tensor_parallelism_s_all_reduces_are_named(capsys):
    """Megatron's split of a layer over chips: an all-reduce after attention, one after the
    MLP, so LLaMA-3-70B's 80 layers make 160 a token, which the floor leaves out and the
    estimate counts."""
    argv = ["decode", "--preset", "llama3-70b", "--chip", "h100", "--chips", "8", "--batches", "1"]
    assert roofline_command(argv) == 0
    out = capsys.readouterr().out
    assert "time to first token: at least " in out
    assert "its 160 all-reduces a token (2 a layer) in the estimate" in out
    assert "left out of the floor and TTFT" in out


def test_predict_s_bytes_keep_a_space_before_a_wide_number(capsys):
    """LLaMA-3-70B's 2,048 x 8,192 tokens save 3,472,618.50 GB of activations, wider than
    the column's 10 characters, which once ran into the label."""
    assert roofline_command(["predict", "--preset", "llama3-70b", "--chip", "h100"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "activations" in line)
    assert re.match(r"  \D+? +[\d,]+\.\d\d GB ", line), line  # a space before the number


def test_a_model_too_big_for_one_chip_says_how_many_it_needs(tmp_path, capsys):
    """LLaMA-3-70B in bf16: 70,553,706,496 x 2 = 141.1 GB of weights, over one H100's
    80 GiB (85.9 GB): 2 chips hold them. 64 sequences' caches add 64 x 2 (k, v) x 80
    layers x 8 heads x 128 x 2 bytes x 8,192 = 171.8 GB: 312.9 GB, 3.64 chips' worth, and
    4 split the 64 query and 8 key/value heads. A row that does not fit still shows its
    tokens/s, in parentheses."""
    argv = ["decode", "--preset", "llama3-70b", "--chip", "h100", "--batches", "1,64"]
    summary, out = summary_of(argv, tmp_path, capsys)
    assert summary["fewest_chips"] == 2 and summary["fewest_chips_for_the_largest_batch"] == 4
    assert "fewest chips that hold the weights: 2; with 64 sequences' caches: 4" in out
    rows = [line.split() for line in out.splitlines() if line[:7].strip() in ("1", "64")]
    assert all(r[-1].startswith("(") and r[-1].endswith(")") for r in rows), rows


def test_a_batch_that_does_not_fit_is_still_planned():
    row = llama3_8b_plan([66]).batches[0]
    assert not row.fits and math.isfinite(row.step.step_s) and row.step.tokens_per_s > 0


# JAX preallocates 75% of a GPU by default: 0.75 · 85,899,345,920 = 64,424,509,440 bytes,
# 60.0 GiB; at XLA_PYTHON_CLIENT_MEM_FRACTION=.9, 77,309,411,328 bytes, 72.0 GiB. A TPU's
# HBM is all JAX's: no line.
USABLE_H100 = "usable by JAX: 75% = 60.0 GiB (64.42 GB) of 80 GiB a chip"


@pytest.mark.parametrize(
    "command, fits",
    [
        # "fits" stays against the whole HBM: 65 sequences, 85.85 GB of 85.90 (by hand above)
        (DECODE, "largest batch that fits: 65 sequences"),
        # memory judges "fits" against the usable share itself (tests/test_memory_plan_levers.py)
    ],
)
def test_the_planners_say_what_jax_may_use_of_an_h100_beside_fits(
    command, fits, capsys, monkeypatch
):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert roofline_command(command) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("usable by JAX"))
    assert line.startswith(USABLE_H100) and "XLA_PYTHON_CLIENT_MEM_FRACTION" in line
    assert fits in out and "80 GiB (85.90 GB)" in out
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert roofline_command(command) == 0
    assert "usable by JAX: 90% = 72.0 GiB (77.31 GB) of 80 GiB" in capsys.readouterr().out
    assert roofline_command([*command, "--chip", "tpu-v5p"]) == 0
    assert "usable by JAX" not in capsys.readouterr().out


@pytest.mark.parametrize("levers", [[], ["--weights", "int8", "--cache", "int8"]])
def test_the_readme_s_decode_tables_are_the_code_s(levers, capsys):
    """roofline/README.md quotes two decode tables; they must still be what it prints."""
    argv = [*DECODE, "--batches", "1,8,64", "--context", "8192", *levers]
    assert roofline_command(argv) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.split()[:1] == ["batch"])
    with open(os.path.join(REPO, "roofline", "README.md")) as f:
        readme = f.read().splitlines()
    quoted = readme.index(f"$ python -m roofline {' '.join(argv)}")
    assert readme[quoted + 1 : quoted + 5] == out[start : start + 4]

"""sessions/s5_serve.py as a student runs it: each lever's bytes against counts
worked by hand, its quality where the lever changes nothing, the grouped-query
ladder, its JSON, bad input on one line, and --target reading the compiled int8
decode for h100:1."""

import json

import pytest
from helpers import need, run_script

TINY = ["--random-params", "--preset", "tiny", "--new-tokens", "4"]

# The tiny preset by hand: L=2, E=48, F=96, H=4, D=12, T=64, V=256, float32.
#   matmul values: per layer q, k, v, o 4·48·48 = 9,216 and the MLP 2·48·96 = 9,216,
#                  x 2 layers = 36,864, and the tied embedding 256·48 = 12,288: 49,152
#   the rest read: norms (2·2 + 1)·48 = 240 and one row of the positional table, 48: 288
#   full, float32:  (49,152 + 288) x 4                                     = 197,760 bytes
#   int8: 49,152 x 1, plus a float32 scale per output channel: per layer q, k, v
#         48 each, o 48, w_in 96, w_out 48 = 336, x 2 = 672, and 256 embedding rows:
#         928 x 4 = 3,712; the 288 others in float32, 1,152:                54,016 bytes
#   cache, a sequence: 2 (k, v) x 2 layers x 64 positions x 4 heads x 12 x 4 = 49,152
#   int8 cache: 2 x 2 x 64 x 4 x (12 x 1 + a 4-byte scale)                 = 16,384
WEIGHTS = {"full": 197_760, "int8": 54_016}
CACHE = {"full": 49_152, "int8": 16_384}


def test_s5_levers_bytes_quality_and_ladder(tmp_path, capsys):
    summary = tmp_path / "s5.json"
    # Batch 2 alone: a byte or a token counted once a step, not once a sequence, shows
    # at 2 and not at 1; each batch more is 4 more decode programs compiled.
    argv = [*TINY, "--batches", "2", "--train-kv-heads", "3", "--summary-out", str(summary)]
    code, out, err = run_script("sessions/s5_serve.py", argv, capsys)
    assert code == 0, err
    s = json.loads(summary.read_text())
    levers = {(r["weights"], r["cache"], r["batch"]): r for r in s["levers"]}
    assert sorted(levers) == sorted((w, c, 2) for w in ("full", "int8") for c in ("full", "int8"))
    for (w, c, b), r in levers.items():
        assert r["weight_bytes"] == WEIGHTS[w], (w, c, b)
        assert r["cache_bytes"] == b * CACHE[c], (w, c, b)
        assert r["tokens_per_second"] == pytest.approx(b / r["step_seconds"])
        read = r["weight_bytes"] + r["cache_bytes"]
        assert r["mbu"] == pytest.approx(read / r["step_seconds"] / s["bandwidth"])
        assert 0 <= r["greedy_agreement"] <= 1
    # Full precision agrees with itself; its loss through decode is the model's own on
    # those batches (sessions/inference/quality.py holds that equality), above zero.
    assert levers["full", "full", 2]["greedy_agreement"] == 1.0
    assert levers["full", "full", 2]["val_loss"] > 0
    # The ladder: K = H, H/2, 1 at the tiny preset's 4 heads, each cache K/H of the full.
    ladder = s["kv_heads"]
    assert [r["kv_heads"] for r in ladder] == [4, 2, 1]
    assert [r["cache_bytes"] for r in ladder] == [CACHE["full"] * k // 4 for k in (4, 2, 1)]
    assert all(r["val_loss"] > 0 and r["tokens_per_second"] > 0 for r in ladder)
    assert s["plan"]["batches"][0]["batch"] == 1 and "critical_batch" in s["plan"]
    assert "grouped-query attention, trained 3 steps each" in out
    assert "planned: llama3-8b" in out


@pytest.mark.parametrize(
    "argv, why",
    [
        ([*TINY, "--mesh", "data=2"], "serves on one device"),
        ([*TINY, "--plan", "llama9"], "--plan llama9: no such published model"),
        ([*TINY, "--plan-chip", "h999"], "--plan-chip h999: no such chip"),
        ([*TINY, "--kv-heads", "3"], "--kv-heads 3 must divide the 4 query heads"),
        ([*TINY, "--batches", "0"], "--batches"),
        # A checkpoint trained with other positions or K than the flags ask for.
        (["--kv-heads", "2"], "the checkpoint has kv_heads=4, not kv_heads=2"),
        (["--rope"], "the checkpoint has rope=False, not rope=True"),
    ],
)
def test_s5_bad_input_is_one_line_and_exit_2(argv, why, capsys, checkpoint_dir):
    if "--random-params" not in argv:
        argv = ["--checkpoint-dir", checkpoint_dir, *argv]
    code, _, err = run_script("sessions/s5_serve.py", argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and why in err, err


def test_s5_target_reads_int8_off_the_program_compiled_for_an_h100(tmp_path, capsys):
    """The decode of each lever compiled for h100:1 at GPT-2's shapes on two of its
    layers (as tests/test_decode_targets.py compiles it: the bytes and kernels are per
    layer, and all 12 take a test three times as long): at batch 1 each reads within
    15% of the roofline's count, int8 weights at most 0.6x of bf16's (0.597x, as at
    12 layers), and no op writes an int8 weight or cache out as floats."""
    need("gpu")
    summary = tmp_path / "target.json"
    argv = ["--target", "h100:1", "--preset", "gpt2-bytes", "--layers", "2", "--batches", "1"]
    code, _, err = run_script(
        "sessions/s5_serve.py", [*argv, "--summary-out", str(summary)], capsys
    )
    assert code == 0, err
    rows = {(r["weights"], r["cache"]): r for r in json.loads(summary.read_text())["levers"]}
    assert len(rows) == 4
    for kind, r in rows.items():
        assert r["xla_bytes_accessed"] == pytest.approx(r["roofline_bytes"], rel=0.15), kind
        assert r["float_copies"] == 0, kind
    assert (
        rows["int8", "full"]["xla_bytes_accessed"]
        <= 0.6 * rows["full", "full"]["xla_bytes_accessed"]
    )
    # Two of GPT-2's layers at batch 1, by hand: 13 kernels a layer and 7 besides (see
    # test_decode_targets.py's count a layer); at all 12, 163 a token, the H100 run's
    # step (tests/test_launch_bound.py).
    assert rows["full", "full"]["kernels_per_token"] == 2 * 13 + 7 == 33

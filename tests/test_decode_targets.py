"""Inference on chips this machine lacks: `s3_infer.py --target`, prefill and the
decode loop compiled by the real TPU and NVIDIA compilers, never run.

What each device holds, the collectives of one decode step, the matmul dtypes
and XLA's FLOP count of one step are checked against the sharding rules and
the napkin, each derived here by hand. Tests that need the compilers skip
without them (HPLLM_REQUIRE_AOT=1 turns the skips into failures, as in
tests/test_targets.py). Each program is compiled once per module.
"""

import json
import re

import jax
import numpy as np
import pytest
from helpers import need, s3_in_process

from roofline.compiled.program import collectives
from roofline.decode_cost import decode_step_cost, decode_step_cost_per_device, weight_bytes
from roofline.flops import param_count
from sessions.inference import kv_cache, shapes
from sessions.model.config import PRESETS
from sessions.plan import programs
from sessions.plan.infer_on_target import plan_inference
from sessions.run.cli import PROMPT, infer_flags, serving_config
from sessions.shard import sharding
from sessions.train.data import text_to_tokens


def plan(target_text, mesh, batches, preset="course", *flags):
    """(DecodePlanned, cfg) for s3_infer.py --target TARGET --mesh MESH --batches B [flags]."""
    target, devices = programs.devices_for(target_text)
    args = infer_flags(["--target", target_text, "--preset", preset, "--batches", batches, *flags])
    serving = serving_config(args, platform=target.chip.platform)
    planned = plan_inference(serving, mesh, args.batches, target, devices, lambda *a: None)
    return planned, serving.model


# The course's shapes, one layer: D = T = 128 and E = 512 fill the TPU's 128-lane
# tiles, so XLA's memory plan is the bytes themselves, not padding. At least 8
# rows per device: with one, the compiler turns the matmuls into multiply-and-reduce.
@pytest.fixture(scope="module")
def tpu_tp():
    need("tpu")
    return plan("tpu-v5e:2x2", "tp=4", "8,32", "course", "--layers", "1")


@pytest.fixture(scope="module")
def tpu_data():
    need("tpu")
    return plan("tpu-v5e:2x2", "data=4", "32", "course", "--layers", "1")


def napkin_step_flops(cfg, batch):
    """B·f by hand: 2 FLOPs per matmul weight per token (the tied embedding once,
    as the output projection) and 4·L·T·H·D for attention over the whole cache."""
    E, F, H, D, L, V, T = (
        cfg.embed,
        cfg.ff,
        cfg.heads,
        cfg.head_dim,
        cfg.layers,
        cfg.vocab,
        cfg.seq,
    )
    return batch * (2 * (L * (2 * E * F + 4 * E * H * D) + V * E) + 4 * L * T * H * D)


def test_decode_matmuls_run_in_bf16_by_default(tpu_tp):
    planned, cfg = tpu_tp
    assert cfg.dtype == "bfloat16"  # the default on an accelerator target
    for p in planned.plans:
        assert p.matmul_dtypes, "no matmul found in the decode step"
        assert all(a == b == "bf16" for a, b, _ in p.matmul_dtypes), p.matmul_dtypes
        # q, k, v, the output projection and the MLP's two: six per layer, and the logits.
        assert sum(p.matmul_dtypes.values()) >= 6 * cfg.layers + 1


def test_tensor_parallel_decode_all_reduces_activations(tpu_tp):
    planned, cfg = tpu_tp
    for p in planned.plans:
        found = p.collectives
        # Heads and F split four ways: each layer's attention and MLP outputs are
        # partial sums of the [B, 1, E] residual stream (bf16), all-reduced every step;
        # so is the token's embedding, looked up in a table split over V. Per step: the
        # compiled program runs kv_cache.STEPS of them, and counts them all.
        assert found["all-reduce"].count == 2 * cfg.layers + 1
        assert found["all-reduce"].output_bytes == pytest.approx(
            (2 * cfg.layers + 1) * p.batch * cfg.embed * 2, rel=0.01
        )
        # No weight moves: whatever is gathered (the logits' argmax over V's shards)
        # is smaller than the smallest weight shard, a quarter of wq.
        gathered = found["all-gather"].output_bytes if "all-gather" in found else 0
        assert gathered < cfg.embed * cfg.heads * cfg.head_dim * 2 // 4
        assert p.per_call == {}  # nothing outside the loop: every collective is per step
        assert p.comm_s > 0


def test_data_parallel_decode_needs_no_collectives(tpu_data):
    (p,) = tpu_data[0].plans
    assert p.collectives == {} and p.per_call == {} and p.comm_s == 0


def test_each_device_holds_its_share_of_weights_and_cache(tpu_tp, tpu_data):
    for (planned, cfg), tp in ((tpu_tp, 4), (tpu_data, 1)):
        L, T, H, D, E, V = cfg.layers, cfg.seq, cfg.heads, cfg.head_dim, cfg.embed, cfg.vocab
        # tp splits every matmul weight; the positional table and the norm scales stay whole.
        whole = T * E + (2 * L + 1) * E
        weights = 2 * ((param_count(cfg) - whole) // tp + whole)  # bf16
        for p in planned.plans:
            # The napkin's 2·L·B·T·H·D·bytes, split 4 ways: rows over data, or heads over tp.
            assert p.cache_bytes == 2 * L * p.batch * T * H * D * 2 // 4
            assert p.weight_bytes == weights
            rows = p.batch // (4 // tp)  # tokens int32 [rows, T] and logits float32 [rows, V]
            inputs = rows * (T + V) * 4
            # XLA's plan holds exactly these arguments (TPU tiles may pad a little).
            assert p.argument_bytes == pytest.approx(weights + p.cache_bytes + inputs, rel=0.01)
            assert p.fits


def test_xla_counts_one_decode_step_as_the_napkin_does(tpu_tp, tpu_data):
    for planned, cfg in (tpu_tp, tpu_data):
        for p in planned.plans:
            napkin = napkin_step_flops(cfg, p.batch) / 4
            assert p.step.flops == napkin
            # XLA also counts the elementwise work (norms, softmax, argmax): a few percent.
            assert p.xla_flops == pytest.approx(napkin, rel=0.08), (
                planned.summary["mesh"],
                p.batch,
            )


def test_prefill_flops_match_the_napkin(tpu_tp):
    planned, cfg = tpu_tp
    s = planned.summary["prefill"]
    B, P = 32, len(text_to_tokens(PROMPT))  # the default --prompt
    E, F, H, D, L, V = cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.vocab
    # Every layer for every prompt token; the output projection for the last one only;
    # attention's two einsums over the whole P x P scores.
    napkin = 2 * B * P * L * (2 * E * F + 4 * E * H * D) + 2 * B * V * E + 4 * L * B * P * P * H * D
    assert s["batch"] == B and s["napkin_flops_per_device"] == napkin / 4
    assert s["attention_impl"] == "fused"  # splash needs P divisible by 128; 21 is not
    assert s["xla_flops_per_device"] == pytest.approx(napkin / 4, rel=0.03)


def test_decode_roofline_reads_every_weight_tp_does_not_split():
    cfg = PRESETS["course"].model
    B, roofs = 64, {"peak_flops": 197e12, "bandwidth": 819e9}
    W, C = weight_bytes(cfg), 2 * cfg.layers * B * cfg.seq * cfg.heads * cfg.head_dim * 4
    # Data parallel: each device reads all the weights and its quarter of the cache.
    data = decode_step_cost_per_device(cfg, B, {"data": 4, "fsdp": 1, "tp": 1}, **roofs)
    assert data.bytes == W + C / 4
    assert data.memory_s == pytest.approx((W + C / 4) / 819e9)
    # Tensor parallel splits both: one chip's roofline with four chips' roofs.
    tp = decode_step_cost_per_device(cfg, B, {"data": 1, "fsdp": 1, "tp": 4}, **roofs)
    whole = decode_step_cost(cfg, B, peak_flops=4 * 197e12, bandwidth=4 * 819e9)
    assert tp.memory_s == pytest.approx(whole.memory_s)
    assert tp.compute_s == pytest.approx(whole.compute_s) == data.compute_s


LOOP_HLO = """
%cond (p: (bf16[8,32], s32[], s32[])) -> pred[] {
  %p = (bf16[8,32]{1,0}, s32[], s32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=1
  %n = s32[] get-tuple-element(%p), index=2
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%gather_start (a: bf16[2,32]) -> bf16[8,32] {
  %a = bf16[2,32]{1,0} parameter(0)
  ROOT %ag.1 = bf16[8,32]{1,0} all-gather(%a), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}
}
%gather_rest (a: bf16[2,32]) -> bf16[8,32] {
  %a = bf16[2,32]{1,0} parameter(0)
  ROOT %ag.2 = bf16[8,32]{1,0} all-gather(%a), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}
}
%body (p: (bf16[8,32], s32[], s32[])) -> (bf16[8,32], s32[], s32[]) {
  %p = (bf16[8,32]{1,0}, s32[], s32[]) parameter(0)
  %w = bf16[2,32]{1,0} slice(%x), slice={[0:2], [0:32]}
  %f1 = bf16[8,32]{1,0} fusion(%w), kind=kCustom, calls=%gather_start
  %f2 = bf16[8,32]{1,0} fusion(%w), kind=kCustom, calls=%gather_rest
  ROOT %t = (bf16[8,32]{1,0}, s32[], s32[]) tuple(%f2, %i, %n)
}
ENTRY %main (x: bf16[8,32], n: s32[]) -> bf16[8,32] {
  %x = bf16[8,32]{1,0} parameter(0)
  %ar = bf16[8,32]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %w = (bf16[8,32]{1,0}, s32[], s32[]) while(%t0), condition=%cond, body=%body
  ROOT %g = bf16[8,32]{1,0} get-tuple-element(%w), index=0
}
"""


def test_a_loops_collectives_are_read_apart_from_the_rest():
    # A loop over a traced trip count (i < n, no constant: a fori_loop to a traced n),
    # its all-gather inside fusions the body calls, spread over two of them with one
    # channel (a TPU's async collective fusion): counted once, as one trip's all-gather
    # of 8*32 bf16. The all-reduce runs once. (Decode's loop has a constant count.)
    assert collectives(LOOP_HLO, 4, in_loops=True) == {"all-gather": (1, 512, 384)}
    assert collectives(LOOP_HLO, 4, in_loops=False) == {"all-reduce": (1, 512, 768)}
    assert set(collectives(LOOP_HLO, 4)) == {"all-gather", "all-reduce"}


def test_cli_prints_each_batch_and_writes_the_summary(tmp_path, capsys):
    need("gpu")
    summary, hlo = tmp_path / "plan.json", tmp_path / "decode.hlo"
    code, out, err = s3_in_process(
        [
            "--target",
            "h100:1",
            "--preset",
            "tiny",
            "--batches",
            "2,8",
            "--summary-out",
            str(summary),
            "--hlo-out",
            str(hlo),
        ],
        capsys,
    )
    assert code == 0, err
    for text in (
        "target: h100-sxm:1",
        "prefill: 8 x 21 tokens",
        "FLOPs per device",
        "KV cache",
        "tokens/s",
        "memory-bound",
    ):
        assert text in out, text
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("2 ", "8 "))]
    assert [r[0] for r in rows] == ["2", "8"], out  # one table row per batch
    assert [r[-1] for r in rows] == ["launches", "launches"], out  # the bound, named
    s = json.loads(summary.read_text())
    assert set(s["batches"]) == {"2", "8"}
    cfg = PRESETS["tiny"].model
    for b, row in s["batches"].items():
        B = int(b)
        assert (
            row["cache_bytes_per_device"]
            == 2 * cfg.layers * B * cfg.seq * cfg.heads * cfg.head_dim * 2
        )
        assert row["weight_bytes_per_device"] == 2 * param_count(cfg)
        assert row["hbm_bytes_per_device"] == 80 * 2**30 and row["fits"]  # NVIDIA's "80GB"
        assert row["predicted_tokens_per_sec"] == pytest.approx(B / row["predicted_step_seconds"])
        assert row["napkin_flops_per_device"] == napkin_step_flops(cfg, B)
        assert row["xla_flops_per_device"] == pytest.approx(
            row["napkin_flops_per_device"], rel=0.15
        )
        assert row["collectives_per_step"] == {}
        # Every kernel a token launches, printed as in the summary; at 0.1 MB a step
        # (0.04 us at 3.35 TB/s) the launches, 1.513 us each (90.77 us / 60), bind.
        n = row["kernels_per_token"]
        assert n == sum(row["kernel_kinds"].values()) > 0
        assert f"kernels a token {n} (" in out
        assert row["launch_seconds"] == pytest.approx(n * 90.77e-6 / 60)
        assert row["bound"] == "launches"
        assert all(k.startswith("bf16,bf16->") for k in row["matmul_dtypes"])
    assert " while(" in hlo.read_text()  # the decode loop, as compiled


def trip_counts_known(hlo_text):
    """For each `while` in an HLO module's text, the trip count XLA knows, as it
    prints it in the loop's backend_config ({"known_trip_count":{"n":"16"},...}),
    or None."""
    return [
        int(m.group(1)) if (m := re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)) else None
        for line in hlo_text.splitlines()
        if " while(" in line
    ]


# GPT-2's shapes on two layers: the per-layer kernels of its decode as compiled for
# h100:1, in a program small enough to compile in a test.
@pytest.fixture(scope="module")
def gpt2_h100():
    need("gpu")
    return plan("h100:1", None, "1", "gpt2-bytes", "--layers", "2")


def launches_by_regex(hlo_text):
    """Kernels a token by a route of its own: in the decode loop's body (and its condition,
    unless the loop's trip count is known: a GPU then never runs it), as printed, every line
    that is a fusion or a custom call (a deviceless compile makes no command buffers in the
    HLO, so none hides a kernel)."""
    loop = re.search(r" while\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)(.*)", hlo_text)
    assert loop and "command_buffer" not in hlo_text
    condition, body, rest = loop.groups()
    count = 0
    for name in [body] if "known_trip_count" in rest else [condition, body]:
        block = re.search(r"\n%?" + re.escape(name) + r" \(.*?\n}", hlo_text, re.S).group(0)
        count += len(
            re.findall(r"(?m)^\s*(?:ROOT )?%\S+ = [^\n]*? (?:fusion|custom-call)\(", block)
        )
    return count


def test_every_kernel_a_token_launches_is_counted(gpt2_h100):
    """At batch 1 (E = 768) XLA writes each layer as 13 kernels, by hand from its program:
    the norm's sum of squares and its scaling (a convert fusion), twice; q, k and v in one
    multiply-and-reduce, q·k of the new key, the output projection and the MLP's two (5
    matrix-vector products); the scores over the cache (a concatenate fusion); a Triton
    softmax·v; the cache's two writes. Outside the layers 7: the final norm's two, the
    logits (a matrix-vector product), the argmax (a reduction), the token's write and two
    small loop fusions. (The loop's condition, a compare, never runs: XLA knows the 16
    trips.)"""
    planned, cfg = gpt2_h100
    (p,) = planned.plans
    L = cfg.layers
    assert p.launches.per_token == 13 * L + 7 == launches_by_regex(planned.compiled.as_text())
    assert p.launches.kinds == {
        "matvec": 5 * L + 1,
        "reduce": 2 * L + 2,
        "convert": 2 * L + 1,
        "dus": 2 * L + 1,
        "concatenate": L,
        "triton": L,
        "loop": 2,
    }
    # 33 kernels x 90.77 us / 60 = 49.9 us, above the 0.02 ms its bytes take: launches bind.
    assert p.launch.launch_s == pytest.approx(33 * 90.77e-6 / 60)
    assert p.bound == "launches" and p.step_s == p.launch.launch_s > p.step.memory_s


def test_the_gpu_decode_programs_never_wait_on_the_host(gpt2_h100):
    """XLA's GPU runtime runs a `while` of unknown trip count by copying its
    predicate to the host and waiting for it after every trip, and a
    `conditional` likewise for its branch (WhileThunk and ConditionalThunk in
    xla/backends/gpu/runtime): a host round trip per token. A count it knows it
    runs without asking. Checked in both decode programs, greedy (what
    `s3_infer.py --target h100:1 --hlo-out` writes) and sampling (what s3_infer.py
    times), over every loop."""
    planned, cfg = gpt2_h100
    target, devices = programs.devices_for("h100:1")
    mesh = sharding.make_mesh(sharding.parse_mesh(None, 1), devices=np.array(devices))
    args, static = shapes.abstract_decode_inputs(cfg, 1, mesh)
    with jax.set_mesh(mesh):
        lowered = kv_cache.decode_steps.lower(*args, **{**static, "greedy": False})
        sampling = programs.compile_for(lowered, target.chip, lambda *a: None)
    for program in (planned.compiled, sampling):
        text = program.as_text()
        assert trip_counts_known(text) == [kv_cache.STEPS], trip_counts_known(text)
        assert not re.search(r" conditional\(", text)


@pytest.mark.parametrize(
    "target, platform, layers, batch, why",
    [
        # One sequence's cache, 2·L·T·H·D·2 bytes at T=65536, H·D=8192: 17.2 GB at 8
        # layers, beyond a v5e's 16 GB even split four ways: the TPU compiler refuses it.
        ("tpu-v5e:2x2", "tpu", 8, 4, "HBM"),
        # 4.3 GB at 2 layers, 137 GB for 32: the NVIDIA compiler plans it, past 80 GiB (85.9 GB).
        ("h100:1", "gpu", 2, 32, "XLA's plan needs"),
    ],
)
def test_a_cache_that_fits_no_device_exits_2_on_one_line(
    target, platform, layers, batch, why, capsys
):
    need(platform)
    code, out, err = s3_in_process(
        [
            "--target",
            target,
            "--preset",
            "tiny",
            "--heads",
            "64",
            "--head-dim",
            "128",
            "--layers",
            str(layers),
            "--seq",
            "65536",
            "--batches",
            str(batch),
        ],
        capsys,
    )
    assert code == 2
    said = [line for line in out.splitlines() if f"batch {batch} does not fit" in line]
    assert len(said) == 1 and why in said[0], out
    error = err.strip().splitlines()
    assert len(error) == 1, err
    assert error[0].startswith(f"error: no batch of {batch} fits on {target.split(':')[0]}")
    assert "--batches" in error[0] and "--seq" in error[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "tpu-v9"], "unknown chip"),
        (["--target", "t4"], "no compile-only target for t4 here"),  # in the table, not in XLA's
        (["--target", "h100:8", "--mesh", "fsdp=4"], "8 are present"),
        (["--target", "h100:2", "--mesh", "data=2", "--batches", "3"], "3 does not divide"),
    ],
)
def test_bad_targets_are_one_line_and_exit_2(argv, message, capsys):
    if "tpu-v9" not in argv and "t4" not in argv:
        need("gpu")
    code, _, err = s3_in_process(["--preset", "tiny", *argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err

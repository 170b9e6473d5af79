"""roofline/compiled/op_work.py and op_roofline.py: each op of a compiled program, its
FLOPs, bytes and link bytes against counts done by hand, and the step it
predicts on a chip's roofs; then a gpt2-bytes step compiled for h100:8."""

import contextlib
import io
import json

import pytest

from roofline.chip import Roofs, chip_roofs, matmul_tile
from roofline.compiled.hlo import parse
from roofline.compiled.op_roofline import predict_ops
from roofline.compiled.op_work import hbm_bytes, program_work
from roofline.hardware import CHIPS
from tests.helpers import need, run_script

# A dot, a fusion that only slices one of its operands, an all-reduce over 4
# devices, and a cuDNN attention kernel, as XLA prints them after layout.
OPS = """HloModule ops, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_slice_add (p0: f32[64,32], p1: f32[8,32]) -> f32[8,32] {
  %p0 = f32[64,32]{1,0} parameter(0)
  %p1 = f32[8,32]{1,0} parameter(1)
  %sl = f32[8,32]{1,0} slice(%p0), slice={[0:8], [0:32]}
  ROOT %sum = f32[8,32]{1,0} add(%sl, %p1)
}

ENTRY %main (x: f32[8,16], w: f32[16,32], big: f32[64,32], q: bf16[2,128,4,64], k: bf16[2,128,4,64], v: bf16[2,128,4,64]) -> f32[8,32] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,32]{1,0} parameter(1)
  %big = f32[64,32]{1,0} parameter(2)
  %q = bf16[2,128,4,64]{3,2,1,0} parameter(3)
  %k = bf16[2,128,4,64]{3,2,1,0} parameter(4)
  %v = bf16[2,128,4,64]{3,2,1,0} parameter(5)
  %d = f32[8,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %f = f32[8,32]{1,0} fusion(%big, %d), kind=kLoop, calls=%fused_slice_add
  %ar = f32[8,32]{1,0} all-reduce(%f), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %fmha = (bf16[2,4,128,64]{3,1,2,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"mask_type":"CAUSAL"}}
  ROOT %out = f32[8,32]{1,0} copy(%ar)
}
"""


def by_name(hlo, devices=4, tile=None):
    return {w.name: w for w in program_work(hlo, devices, tile)}


def test_a_dot_costs_2mnk_and_reads_its_operands_once():
    d = by_name(OPS)["d"]
    assert d.matmul_flops == 2 * 8 * 32 * 16
    assert d.hbm_bytes == 4 * (8 * 16 + 16 * 32 + 8 * 32)
    assert d.link_bytes == 0 and d.count == 1


def test_a_fusion_reads_only_the_slice_it_takes_and_counts_its_arithmetic():
    f = by_name(OPS)["f"]
    # reads 8 of big's 64 rows, all of d, writes its result; one add per element
    assert f.hbm_bytes == 4 * (8 * 32 + 8 * 32 + 8 * 32)
    assert f.other_flops == 8 * 32 and f.matmul_flops == 0


def test_an_all_reduce_sends_twice_its_bytes_times_n_minus_1_over_n():
    ar = by_name(OPS)["ar"]
    assert ar.link_bytes == 2 * (8 * 32 * 4) * 3 // 4  # ring all-reduce over 4 devices


def test_an_attention_kernel_counts_its_two_matmuls_over_the_unmasked_half():
    fmha = by_name(OPS)["fmha"]
    b, s, h, d = 2, 128, 4, 64
    assert fmha.matmul_flops == 2 * (2 * b * h * s * s * d) // 2  # causal: half the scores
    assert fmha.hbm_bytes == 3 * 2 * (b * s * h * d) + 2 * (b * s * h * d)


def test_markers_and_views_are_no_ops():
    assert not {"x", "w", "big"} & by_name(OPS).keys()


def test_tiles_pad_the_matmul_dimensions():
    padded = by_name(OPS, tile=(8, 128, 128))["d"]
    assert padded.matmul_flops == 2 * 8 * 128 * 128  # N 32 -> 128, K 16 -> 128
    assert padded.unpadded_matmul_flops == 2 * 8 * 32 * 16
    # the tiles' sources: a TPU's 128x128 MXU, v6e's 256x256; Hopper's wgmma m64nNk16
    assert matmul_tile(CHIPS["tpu-v5e"]) == (8, 128, 128)
    assert matmul_tile(CHIPS["tpu-v6e"]) == (8, 256, 256)
    assert matmul_tile(CHIPS["h100"]) == (64, 8, 16)


def test_bytes_follow_the_layout_tiles_and_leave_out_on_chip_memory():
    assert hbm_bytes("f32[12,64]{1,0}") == 12 * 64 * 4
    assert hbm_bytes("f32[12,64]{1,0:T(8,128)}") == 16 * 128 * 4  # both dims padded
    assert hbm_bytes("f32[12,64]{0,1:T(8,128)}") == 128 * 64 * 4  # dim 0 is minor here
    assert hbm_bytes("f32[12,64]{1,0:T(8,128)S(1)}") == 0  # a TPU's VMEM


# A loop as XLA unrolls one: its counter from 2 while < 8, in steps of 2, so
# the body runs 3 times (2, 4, 6); its dot counts 3 times a step.
LOOP = """HloModule loop

%cond (p: (f32[8,8], u32[])) -> pred[] {
  %p = (f32[8,8]{1,0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (f32[8,8], u32[])) -> (f32[8,8], u32[]) {
  %q = (f32[8,8]{1,0}, u32[]) parameter(0)
  %x = f32[8,8]{1,0} get-tuple-element(%q), index=0
  %j = u32[] get-tuple-element(%q), index=1
  %two = u32[] constant(2)
  %next = u32[] add(%j, %two)
  %y = f32[8,8]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[8,8]{1,0}, u32[]) tuple(%y, %next)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %start = u32[] constant(2)
  %init = (f32[8,8]{1,0}, u32[]) tuple(%a, %start)
  %loop = (f32[8,8]{1,0}, u32[]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8,8]{1,0} get-tuple-element(%loop), index=0
}
"""


def test_a_loop_body_counts_once_a_trip_with_the_counters_step():
    assert parse(LOOP).trip_counts["body"] == 3
    y = by_name(LOOP, devices=1)["y"]
    assert y.count == 3 and y.matmul_flops == 2 * 8 * 8 * 8
    roofs = Roofs("test", 1e9, "test", 1e12, "test")
    p = predict_ops(LOOP, roofs)
    once = max(2 * 8**3 / 1e9, 3 * 8 * 8 * 4 / 1e12)
    # the dot 3 times; the counter's add and the condition's compare, one
    # element each, once a trip
    assert p.step_s == pytest.approx(3 * once + 3 * 2 / 1e9)


# An all-gather started before a dot and waited for after it (asynchronous)
# against the same all-gather done at once (synchronous).
OVERLAP = """HloModule overlap, num_partitions=2

ENTRY %main (x: f32[64,64], w: f32[32,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[32,64]{1,0} parameter(1)
  %ag = (f32[32,64]{1,0}, f32[64,64]{1,0}) all-gather-start(%w), channel_id=1, replica_groups={{0,1}}, dimensions={0}
  %d = f32[64,64]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %done = f32[64,64]{1,0} all-gather-done(%ag)
  ROOT %e = f32[64,64]{1,0} dot(%d, %done), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
SYNC = (
    OVERLAP.replace("all-gather-start(%w), channel_id=1", "all-gather(%w), channel_id=1")
    .replace("(f32[32,64]{1,0}, f32[64,64]{1,0}) all-gather", "f32[64,64]{1,0} all-gather")
    .replace("  %done = f32[64,64]{1,0} all-gather-done(%ag)\n", "")
    .replace("dot(%d, %done)", "dot(%d, %ag)")
)


def test_an_asynchronous_collective_hides_behind_the_ops_before_its_use():
    # slow links: the all-gather (16 KB sent) takes 16 us, each dot 0.52 us
    roofs = Roofs("test", 1e12, "test", 1e12, "test", link=1e9)
    dot = 2 * 64**3 / 1e12
    gather = 32 * 64 * 4 / 1e9
    overlapped = predict_ops(OVERLAP, roofs, devices=2)
    waited = predict_ops(SYNC, roofs, devices=2)
    assert waited.step_s == pytest.approx(2 * dot + gather)
    assert overlapped.step_s == pytest.approx(max(dot, gather) + dot)
    # the step adds up by kind, the exposed wait counted as the collective's
    assert sum(overlapped.seconds_by_kind.values()) == pytest.approx(overlapped.step_s)
    assert overlapped.seconds_by_kind["collective"] == pytest.approx(gather - dot)


def plan_gpt2_on_h100(out, *mesh):
    """GPT-2's shapes at GPT-2's vocabulary, two layers (to compile in seconds),
    planned for h100:8: (exit status, printed, stderr, summary, compiled program's path)."""
    need("gpu")
    argv = ["--preset", "gpt2-bytes", "--layers", "2", "--vocab", "50304", "--target", "h100:8"]
    argv += ["--summary-out", str(out / "s.json"), "--hlo-out", str(out / "step.hlo"), *mesh]
    printed = Printed()
    with contextlib.redirect_stdout(printed.out), contextlib.redirect_stderr(printed.err):
        code, stdout, err = run_script("sessions/s2_train.py", argv, printed)
    return code, stdout, err, json.loads((out / "s.json").read_text()), (out / "step.hlo")


@pytest.fixture(scope="module")
def gpt2_on_h100(tmp_path_factory):
    return plan_gpt2_on_h100(tmp_path_factory.mktemp("fsdp"))


class Printed:
    """What a script run in a module-scoped fixture printed (capsys is per test)."""

    def __init__(self):
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self):
        return self.out.getvalue(), self.err.getvalue()


def test_the_per_op_step_lies_between_the_whole_step_bound_and_the_sum_of_its_parts(
    gpt2_on_h100,
):
    *_, summary, hlo = gpt2_on_h100
    p = predict_ops(hlo.read_text(), chip_roofs(CHIPS["h100"], "bfloat16"), devices=8)
    compute, memory, links = p.totals
    assert summary["predicted_step_seconds"] == pytest.approx(p.step_s)
    assert summary["bound_step_seconds"] <= p.step_s <= compute + memory + links
    assert summary["predicted_mfu"] < 1
    by_kind = summary["predicted_seconds_by_kind"]
    assert sum(by_kind.values()) == pytest.approx(p.step_s)


def test_the_vocabularys_softmax_is_a_top_op_and_memory_bound(gpt2_on_h100):
    code, printed, _, summary, _ = gpt2_on_h100
    assert code == 0 and "per-op prediction" in printed
    top = summary["top_ops"]
    assert len(top) == 10 and all(
        {"name", "kind", "flops", "bytes", "seconds", "bound"} <= t.keys() for t in top
    )
    # the logits are [4096 tokens a device, 50304]: their softmax and its gradient
    # read and write 4096 x 50304 x 4 bytes a pass, at 0.6 FLOPs a byte
    vocab_ops = [t for t in top if t["kind"] in ("elementwise", "other") and "50304" in t["shape"]]
    assert vocab_ops and all(t["bound"] == "memory" for t in vocab_ops)


def test_a_replicated_optimizer_update_is_a_top_op_and_memory_bound(tmp_path):
    # data=8: every device updates all 53M parameters (AdamW reads the weight, its
    # gradient and two moments, and writes three: 28 bytes and ~10 FLOPs a parameter).
    # Under fsdp=8 each device updates an eighth, and it drops out of the top ten.
    code, printed, _, summary, _ = plan_gpt2_on_h100(tmp_path, "--mesh", "data=8")
    assert code == 0
    update = [t for t in summary["top_ops"] if t["phase"] == "update" and t["kind"] != "collective"]
    assert update and all(t["bound"] == "memory" for t in update)
    assert "by phase" in printed


CALL = """HloModule call

%callee (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  ROOT %d = f32[64,64]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  ROOT %c = f32[64,64]{1,0} call(%x), to_apply=%callee
}
"""


def test_a_called_computations_ops_run_in_the_step():
    roofs = Roofs("test", 1e12, "test", 1e15, "test")
    p = predict_ops(CALL, roofs)
    assert [o.name for o in p.ops] == ["d"]
    assert p.step_s == pytest.approx(2 * 64**3 / 1e12)


def test_a_caches_roof_takes_the_bytes_it_holds_the_memory_the_rest():
    roofs = Roofs("test", 1e12, "test", 1e9, "test", cache=(1e11, 1000))
    assert roofs.memory_seconds(3000) == pytest.approx(1000 / 1e11 + 2000 / 1e9)
    assert roofs.memory_seconds(500) == pytest.approx(500 / 1e11)
    no_cache = Roofs("test", 1e12, "test", 1e9, "test")
    assert no_cache.memory_seconds(3000) == pytest.approx(3000 / 1e9)


def test_each_matmul_runs_at_the_rate_timed_for_its_shape():
    d = by_name(OPS)["d"]
    assert d.matmul_shapes == ((1, 8, 32, 16, "f32"),)
    rates = {(1, 8, 32, 16, "f32"): 1e9}
    timed = Roofs("test", 1e12, "test", 1e15, "test", matmul_rates=rates)
    assert timed.matmul_seconds(d) == pytest.approx(2 * 8 * 32 * 16 / 1e9)
    untimed = Roofs("test", 1e12, "test", 1e15, "test", matmul_rates={(2, 2, 2, 2, "f32"): 1})
    assert untimed.matmul_seconds(d) == pytest.approx(2 * 8 * 32 * 16 / 1e12)  # at the peak


def test_a_chip_of_two_devices_gives_each_half_its_figures():
    """A TPU v3 is two jax devices (cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16
    and 900 GB/s a chip, two TensorCores): a device's roofs are half of each."""
    whole = chip_roofs(CHIPS["tpu-v3"], "bfloat16")
    half = chip_roofs(CHIPS["tpu-v3"], "bfloat16", devices_per_chip=2)
    assert (whole.peak_flops, whole.bandwidth) == (123e12, 900e9)
    assert (half.peak_flops, half.bandwidth, half.vector_peak) == (61.5e12, 450e9, 61.5e12)

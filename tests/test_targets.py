"""Chips this machine lacks: the step compiled by the real TPU and NVIDIA compilers.

The compiled programs are read, never run: memory, collectives, kernels and
matmul dtypes are checked against what the sharding rules and the config say
they must be. Tests that need the compilers skip without them, naming the file
that installs them; CI installs it and sets HPLLM_REQUIRE_AOT=1, which turns
those skips into failures. Each program is compiled once per module.
"""

import ast
import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest
from conftest import REPO, run_python, s2_in_process

from roofline.flops import attention_flops, param_count, train_flops
from roofline.hardware import CHIPS
from roofline.program import (
    collectives,
    group_size,
    link_bytes,
    matmul_dtypes,
    windowed_loops,
)
from roofline.targets import EXTRAS, TargetError, missing_extras, parse_target
from sessions import aot, s2_train, sharding
from sessions.attention import choose, einsum_attention, splash_attention, splash_kernel
from sessions.config import ModelConfig
from sessions.errors import UsageError
from sessions.model import init_params


def need(platform):
    """Skip (or, in CI, fail) unless this machine can compile for platform."""
    missing = missing_extras(platform)
    if missing:
        message = f"{missing} not installed: pip install -r {EXTRAS}"
        if os.environ.get("HPLLM_REQUIRE_AOT"):
            pytest.fail(message)
        pytest.skip(message)


def compile_step(target_text, preset="tiny", mesh=None, **flags):
    """Planned (sessions/aot.py) for s2_train.py --target TARGET --preset PRESET [flags]."""
    argv = ["--preset", preset, "--target", target_text]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    args = s2_train.parse_args(argv)
    target, devices = aot.devices_for(target_text)
    _, cfg, tc, note = s2_train.choose_configs(args, platform=target.chip.platform)
    return aot.plan_target(mesh, cfg, tc, preset, target, devices, lambda *a: None, note), cfg, tc


# The course's shapes, one layer: every dimension a multiple of the TPU's 128-lane
# tiles once split four ways, so the memory plan is not dominated by padding.
ONE_LAYER = {"preset": "course", "layers": 1, "batch": 16}


@pytest.fixture(scope="module")
def tpu_fsdp():
    need("tpu")
    return compile_step("tpu-v5e:2x2", mesh="fsdp=4", **ONE_LAYER)


@pytest.fixture(scope="module")
def tpu_data():
    need("tpu")
    return compile_step("tpu-v5e:2x2", mesh="data=4", **ONE_LAYER)


@pytest.fixture(scope="module")
def tpu_tp():
    need("tpu")
    return compile_step("tpu-v5e:2x2", mesh="tp=4", **ONE_LAYER)


@pytest.fixture(scope="module")
def h100_course():
    need("gpu")
    return compile_step("h100:8", preset="course", batch=32)


# Hand-written HLO: what the parser must read whatever the compiler version prints.


def test_group_sizes_in_each_spelling():
    assert group_size("replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}", 8) == 4
    assert group_size("replica_groups=[2,4]<=[8], dimensions={0}", 8) == 4
    assert group_size("replica_groups=[4,2]<=[2,4]T(1,0)", 8) == 2
    assert group_size("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, x", 8) == 4
    assert group_size("replica_groups=mesh['a'=2,'b'=4] {'a','b'}, x", 8) == 8
    assert group_size("replica_groups={}, to_apply=%add", 8) == 8


def test_link_bytes_follow_the_ring():
    # n devices on a ring: an all-gather of an output of O bytes receives the
    # n-1 shards of O/n it lacks; a reduce-scatter to O bytes sends n-1 partial
    # sums of O; an all-reduce is both of an O-byte array.
    assert link_bytes("all-gather", 800, 8) == 700
    assert link_bytes("reduce-scatter", 100, 8) == 700
    assert link_bytes("all-reduce", 800, 8) == 1400
    assert link_bytes("all-gather", 800, 1) == 0


HLO = """
HloModule step, num_partitions=4
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%fused_dot (p0: bf16[16,8], p1: bf16[8,32]) -> f32[16,32] {
  %p0 = bf16[16,8]{1,0} parameter(0)
  %p1 = bf16[8,32]{1,0} parameter(1)
  ROOT %d = f32[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY %main (x: bf16[16,8], w: bf16[2,32]) -> f32[16,32] {
  %x = bf16[16,8]{1,0} parameter(0)
  %w = bf16[2,32]{1,0} parameter(1)
  %ag-start = (bf16[2,32]{1,0}, bf16[8,32]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %ag-done = bf16[8,32]{1,0} all-gather-done(%ag-start)
  %f = f32[16,32]{1,0} fusion(%x, %ag-done), kind=kOutput, calls=%fused_dot, frontend_attributes={kernel_metadata={
}}
  %ar = f32[16,32]{1,0} all-reduce(%f), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add
  %rs = f32[4,32]{1,0} reduce-scatter(%ar), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  ROOT %g = f32[16,32]{1,0} all-gather(%rs), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
}
"""


def test_collectives_read_from_hlo_text():
    found = collectives(HLO, devices=4)
    # all-gathers: the async one's result is the -done's type, 8*32 bf16 = 512 B over 4
    # devices, plus the sync one, 16*32 f32 = 2048 B: link bytes 3/4 of each.
    assert found["all-gather"].count == 2
    assert found["all-gather"].output_bytes == 512 + 2048
    assert found["all-gather"].bytes == 512 * 3 // 4 + 2048 * 3 // 4
    # all-reduce over groups of 2: 2048 B, sent 2 * 1/2 of it.
    assert found["all-reduce"] == (1, 2048, 2048)
    # reduce-scatter to 4*32 f32 = 512 B over 4: 3 partial sums of 512 B sent.
    assert found["reduce-scatter"] == (1, 512, 1536)


def test_matmul_dtypes_look_up_named_operands():
    assert matmul_dtypes(HLO) == {("bf16", "bf16", "f32"): 1}


# Chips and targets, with or without the compilers.


def test_float32_peak_is_the_precision_the_matmuls_run_at():
    h100 = CHIPS["h100"]
    # NVIDIA's datasheet: TF32 494.5 TFLOP/s dense, FP32 67; JAX's default precision
    # runs float32 matmuls as TF32 on Ampere and newer.
    assert h100.peak("float32") == 494.5e12
    assert h100.peak("float32", "highest") == 67e12
    assert h100.peak("bfloat16") == 989e12
    assert CHIPS["tpu-v5e"].peak("float32") == 197e12  # bf16 passes on a TPU


def test_targets_parse_and_default_to_one_host():
    assert parse_target("tpu-v5e:2x4")[1] == "2x4"
    assert parse_target("tpu-v5e")[1] == "2x4"  # one v5e host: 8 chips
    assert parse_target("h100")[1] == "8"
    assert parse_target("H100:1")[0] is CHIPS["h100-sxm"]
    for bad in ("tpu-v9", "h100:x", "tpu-v5e:8", "local", "h100:0"):
        with pytest.raises(TargetError):
            parse_target(bad)


def test_missing_compilers_name_the_file(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(UsageError, match=r"libtpu.*pip install -r requirements-aot\.txt"):
        aot.devices_for("tpu-v5e:2x2")
    with pytest.raises(UsageError, match=r"requirements-aot\.txt"):
        aot.devices_for("h100:8")


def test_attention_kernel_follows_the_target():
    course = ModelConfig(
        embed=512, ff=2048, heads=4, head_dim=128, layers=4, seq=128, dtype="bfloat16"
    )
    assert choose(None, "cpu", course, 32) == ("einsum", None)
    assert choose(None, "tpu", course, 32) == ("splash", None)
    impl, note = choose(None, "tpu", dataclasses.replace(course, seq=64), 32)
    assert impl == "fused" and "divisible by 128" in note
    impl, note = choose("fused", "gpu", dataclasses.replace(course, dtype="float32"), 32)
    assert impl == "fused" and "bfloat16" in note
    with pytest.raises(UsageError, match="TPU"):
        choose("splash", "gpu", course, 32)
    with pytest.raises(UsageError, match="GPU"):
        choose("cudnn", "cpu", course, 32)


def test_param_count_formula_equals_the_params_built(cfg):
    for c in (
        cfg,
        dataclasses.replace(cfg, attention=False),
        dataclasses.replace(cfg, positions=False),
    ):
        built = jax.eval_shape(lambda k, c=c: init_params(c, k), jax.random.key(0))
        assert param_count(c) == sum(math.prod(x.shape) for x in jax.tree.leaves(built))


def test_roofline_never_imports_the_training_step():
    allowed = {"sessions.config", "sessions.cli"}  # configs and flags, never the step
    for name in os.listdir(os.path.join(REPO, "roofline")):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(REPO, "roofline", name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            for module in modules:
                if module.startswith("sessions"):
                    assert module in allowed, f"roofline/{name} imports {module}"


# The splash kernel, checked against the einsum reference on this CPU (interpreted).


def test_splash_kernel_equals_the_reference_forward_and_backward():
    B, S, H, D = 1, 128, 1, 8
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, D)) for i in range(3))
    out = splash_kernel(q, k, v, interpret=True)
    np.testing.assert_allclose(out, einsum_attention(q, k, v), atol=2e-5)
    probe = jax.random.normal(jax.random.key(3), out.shape)

    def grads(fn):
        return jax.grad(lambda q, k, v: (fn(q, k, v) * probe).sum(), argnums=(0, 1, 2))(q, k, v)

    for mine, ref in zip(
        grads(lambda *a: splash_kernel(*a, interpret=True)), grads(einsum_attention)
    ):
        np.testing.assert_allclose(mine, ref, atol=2e-4)


def test_splash_over_a_mesh_gives_each_device_its_rows_and_heads():
    B, S, H, D = 4, 128, 2, 8  # the kernel's tiles are 128 keys wide, even interpreted
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, H, D)) for i in range(3))
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tp": 2})
    with jax.set_mesh(mesh):
        out = jax.jit(splash_attention)(q, k, v)
    np.testing.assert_allclose(out, einsum_attention(q, k, v), atol=2e-5)


# The TPU compiler: tpu-v5e:2x2, four compile-only chips.


def test_fsdp_gathers_weights_and_scatters_gradients(tpu_fsdp):
    planned, _cfg, _tc = tpu_fsdp
    found = planned.plan.collectives
    assert found["all-gather"].count > 0
    # Gradients of fsdp-sharded weights are reduced to their shards: a reduce-scatter,
    # or an all-reduce the compiler slices. Either way, at least every gradient's bytes.
    reduced = sum(found[k].output_bytes for k in ("reduce-scatter", "all-reduce") if k in found)
    assert reduced > 0


def test_data_parallel_only_all_reduces_gradients(tpu_data):
    planned, cfg, _tc = tpu_data
    found = planned.plan.collectives
    assert set(found) == {"all-reduce"}, found
    # Each device holds whole weights and reduces every gradient: at least P values
    # (float32 or bfloat16 on the wire), and not many times more.
    P = param_count(cfg)
    assert 2 * P <= found["all-reduce"].output_bytes <= 4 * P + 4096


def test_tensor_parallel_all_reduces_activations(tpu_tp):
    planned, cfg, tc = tpu_tp
    found = planned.plan.collectives
    assert "all-reduce" in found and "all-gather" not in found
    # The batch is not split (data = fsdp = 1), weights are split by heads and F:
    # each layer's attention and MLP outputs are partial sums over the [B, S, E]
    # residual stream, all-reduced in the forward pass (and again in backward).
    activation = tc.batch * cfg.seq * cfg.embed * 2  # bf16
    assert found["all-reduce"].output_bytes >= 2 * cfg.layers * activation


def test_memory_per_device_falls_with_fsdp_as_the_sharding_table_says(tpu_fsdp, tpu_data):
    fsdp, data = tpu_fsdp[0], tpu_data[0]
    cfg, tc = tpu_fsdp[1], tpu_fsdp[2]
    # The sharding table: data=4 keeps the whole state on every device, fsdp=4 a
    # quarter of every split weight (norm scales stay whole).
    # float32 weights and Adam's two moments, 12 bytes a parameter, and a few step counters.
    assert 0 <= data.state_bytes_per_device - 12 * param_count(cfg) <= 64
    args = {}
    for name, planned in (("fsdp", fsdp), ("data", data)):
        # XLA's plan holds that state and the device's rows of the tokens (two int32
        # [B/4, S] arrays), and no less; the TPU's 8x128 tiles may pad it.
        args[name] = planned.compiled.memory_analysis().argument_size_in_bytes
        batch_bytes = 2 * (tc.batch // 4) * cfg.seq * 4
        assert args[name] >= planned.state_bytes_per_device + batch_bytes
    table_drop = data.state_bytes_per_device - fsdp.state_bytes_per_device
    assert args["data"] - args["fsdp"] == pytest.approx(table_drop, rel=0.05), args
    assert fsdp.plan.memory_per_device_bytes < data.plan.memory_per_device_bytes


def assert_bf16_matmuls(planned, cfg):
    """bf16 operands everywhere but where the code asks for float32: the loss's
    float32 gradient flowing into the tied output projection's two backward
    matmuls (the logits are float32 by preferred_element_type), which a TPU runs
    as f32 x bf16 and a GPU as f32 x f32."""
    assert cfg.dtype == "bfloat16"
    dtypes = planned.plan.matmul_dtypes
    assert dtypes, "no matmul found in the compiled step"
    wide = {k: n for k, n in dtypes.items() if "f32" in k[:2]}
    assert all(out == "f32" for _, _, out in wide), dtypes
    assert sum(wide.values()) <= 3, dtypes
    assert sum(n for (lhs, rhs, _), n in dtypes.items() if lhs == rhs == "bf16") >= 6 * cfg.layers


def test_bf16_step_runs_its_matmuls_in_bf16(tpu_fsdp):
    assert_bf16_matmuls(tpu_fsdp[0], tpu_fsdp[1])


def test_xla_tpu_count_reconciles_with_the_exact_count_on_each_mesh(tpu_fsdp, tpu_data, tpu_tp):
    for planned, cfg, tc in (tpu_fsdp, tpu_data, tpu_tp):
        p = planned.plan
        assert cfg.attention_impl == "splash" and "tpu_custom_call" in p.kernels
        assert p.exact_flops_per_device == train_flops(cfg, tc.batch) / 4
        # XLA cannot see inside the splash kernel: take attention out of the exact count.
        seen = p.exact_flops_per_device - 3 * attention_flops(cfg, tc.batch) / 4
        assert p.xla_flops_per_device == pytest.approx(seen, rel=0.03), p.mesh


LOOP_HLO = """
%cond (p: (bf16[8,32], u32[])) -> pred[] {
  %p = (bf16[8,32]{1,0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%body (p: (bf16[8,32], u32[])) -> (bf16[8,32], u32[]) {
  %p = (bf16[8,32]{1,0}, u32[]) parameter(0)
  %x = bf16[8,32]{1,0} get-tuple-element(%p), index=0
  %cp-start = (bf16[8,32]{1,0}, bf16[8,32]{1,0}, u32[], u32[]) collective-permute-start(%x), source_target_pairs={{0,1},{1,0}}
  %cp-done = bf16[8,32]{1,0} collective-permute-done(%cp-start)
  ROOT %t = (bf16[8,32]{1,0}, u32[]) tuple(%cp-done, %i)
}
ENTRY %main (x: bf16[8,32]) -> bf16[8,32] {
  %x = bf16[8,32]{1,0} parameter(0)
  %w = (bf16[8,32]{1,0}, u32[]) while(%t0), condition=%cond, body=%body
  ROOT %g = bf16[8,32]{1,0} get-tuple-element(%w), index=0
}
"""


def test_a_collective_in_a_loop_counts_once_per_trip():
    # The loop runs while i < 4: four permutes of 8*32 bf16 = 512 B each.
    assert collectives(LOOP_HLO, devices=2)["collective-permute"] == (4, 4 * 512, 4 * 512)


def test_windowed_einsum_loops_are_found():
    hlo = (
        "  %while.1 = (bf16[8,4]{1,0}, u32[]) while(%t), condition=%wide.windowed_dot_"
        "general_cond_ag.1, body=%wide.windowed_dot_general_body_ag.1, metadata={}\n"
        "  %while.2 = (f32[4]{0}, s32[]) while(%u), condition=%cond, body=%scan_body\n"
    )
    assert windowed_loops(hlo) == 1


def test_course_step_compiles_for_tpu_with_splash_attention():
    need("tpu")
    planned, cfg, _tc = compile_step("tpu-v5e:2x2", preset="course", batch=32)
    assert cfg.attention_impl == "splash"
    assert "tpu_custom_call" in planned.plan.kernels
    # XLA cannot count inside the Pallas kernel; with attention's FLOPs taken out of
    # the exact count the rest (matmuls, mostly) agrees within 3%.
    p = planned.plan
    seen = p.exact_flops_per_device - p.kernel_flops_per_device
    assert p.xla_flops_per_device == pytest.approx(seen, rel=0.03)
    assert p.fits


def test_a_step_too_big_for_the_chip_exits_2_with_what_to_try():
    need("tpu")
    # 2.1e9 parameters, replicated by data=4: weights and Adam's two moments alone
    # take 25 GB a chip, more than a v5e's 16 GB.
    result = run_python(
        "sessions/s2_train.py",
        "--preset",
        "tiny",
        "--embed",
        "8192",
        "--ff",
        "65536",
        "--layers",
        "2",
        "--target",
        "tpu-v5e:2x2",
        "--mesh",
        "data=4",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the step does not fit on tpu-v5e:2x2")
    assert "--batch" in error and "fsdp" in error and "Traceback" not in result.stderr


# The NVIDIA compiler: deviceless H100s.


def test_cudnn_flash_attention_forward_and_backward_on_h100(h100_course):
    planned, cfg, _tc = h100_course
    assert cfg.attention_impl == "cudnn"
    kernels = planned.plan.kernels
    assert "__cudnn$fmhaSoftmax" in kernels and "__cudnn$fmhaSoftmaxBackward" in kernels
    # One forward and one backward call per layer.
    assert kernels["__cudnn$fmhaSoftmax"] == cfg.layers
    assert kernels["__cudnn$fmhaSoftmaxBackward"] == cfg.layers
    assert_bf16_matmuls(planned, cfg)


def test_h100_fsdp_collectives_and_no_flop_count(h100_course):
    planned, _cfg, _tc = h100_course
    assert planned.compiled.cost_analysis() is None  # the deviceless compiler counts nothing
    p = planned.plan
    assert {"all-gather", "reduce-scatter"} <= set(p.collectives) or {
        "all-gather",
        "all-reduce",
    } <= set(p.collectives)
    # The count before optimisation (einsum attention) against the exact count.
    assert p.xla_flops_per_device == pytest.approx(p.exact_flops_per_device, rel=0.03)


def test_float32_on_h100_is_held_against_the_tf32_peak():
    need("gpu")
    planned, _, _ = compile_step("h100:1", dtype="float32")
    assert planned.plan.peak == 494.5e12
    with jax.default_matmul_precision("highest"):
        planned, _, _ = compile_step("h100:1", dtype="float32")
    assert planned.plan.peak == 67e12


@pytest.mark.parametrize(
    "target, platform, devices, hbm",
    [
        ("h100:8", "gpu", 8, 80e9),  # NVIDIA's datasheet: 80 GB
        ("tpu-v5e:2x4", "tpu", 8, 16e9),  # Google's v5e page: 16 GB a chip
    ],
)
def test_target_cli_prints_the_report_and_writes_the_summary(
    target, platform, devices, hbm, tmp_path, capsys
):
    need(platform)
    out = tmp_path / "summary.json"
    code = s2_train.cli(["--preset", "tiny", "--target", target, "--summary-out", str(out)])
    printed, err = capsys.readouterr()
    assert code == 0, err
    for heading in (
        "memory per device",
        "FLOPs per device",
        "collectives",
        "custom kernels",
        "compute-bound",
        "memory-bound",
        "communication",
        "best case",
    ):
        assert heading in printed
    summary = json.loads(out.read_text())
    for key in (
        "target",
        "devices",
        "mesh",
        "exact_flops_per_device",
        "xla_flops_per_device",
        "memory_per_device_bytes",
        "hbm_bytes_per_device",
        "fits",
        "collectives",
        "kernels",
        "predicted_step_seconds",
        "predicted_tokens_per_sec",
    ):
        assert key in summary, key
    assert summary["devices"] == devices
    assert summary["mesh"] == {"data": 1, "fsdp": devices, "tp": 1}
    assert (
        summary["exact_flops_per_device"]
        == train_flops(ModelConfig(embed=48, ff=96, heads=4, head_dim=12, layers=2, seq=64), 16)
        / devices
    )
    assert summary["hbm_bytes_per_device"] == hbm
    assert summary["fits"] and summary["memory_per_device_bytes"] < hbm
    assert set(summary["collectives"]) >= {"all-gather"}
    tokens = 16 * 64
    assert summary["predicted_tokens_per_sec"] == pytest.approx(
        tokens / summary["predicted_step_seconds"]
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "tpu-v9"], "unknown chip"),
        (["--target", "h100:8", "--mesh", "fsdp=4"], "8 are present"),
        (["--target", "h100:x"], "GPU count"),
    ],
)
def test_bad_targets_are_one_line_and_exit_2(argv, message, capsys):
    if "h100:8" in argv:
        need("gpu")
    code, err = s2_in_process(["--preset", "tiny", *argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_tpu_topology_the_compiler_refuses_is_one_line():
    need("tpu")
    with pytest.raises(UsageError, match="3x3"):
        aot.devices_for("tpu-v5e:3x3")

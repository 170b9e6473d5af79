"""Training-step plans for chips this machine lacks: the step compiled by the
real TPU and NVIDIA compilers, for `s2_train.py --target`.

The compiled programs are read, never run: memory, collectives, kernels and
matmul dtypes are checked against what the sharding rules and the config say
they must be. Tests that need the compilers skip without them, naming the file
that installs them; CI installs it and sets HPLLM_REQUIRE_AOT=1, which turns
those skips into failures. Each program is compiled once per module.
"""

import math

import jax
import pytest
from helpers import need

from roofline.compiled.hlo import parse
from roofline.compiled.scatters import scatters
from roofline.flops import attention_flops, param_count, train_flops
from sessions.plan import programs
from sessions.plan.train_on_target import plan_target
from sessions.run.cli import resolve, train_flags


def compile_step(target_text, preset="tiny", mesh=None, **flags):
    """Planned (sessions/plan/train_on_target.py) for s2_train.py --target TARGET --preset PRESET [flags]."""
    argv = ["--preset", preset, "--target", target_text]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    target, devices = programs.devices_for(target_text)
    run = resolve(train_flags(argv), platform=target.chip.platform)
    return plan_target(mesh, run, target, devices, lambda *a: None), run.model, run.train


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
def h100_one():
    need("gpu")
    return compile_step("h100:1", preset="course")


@pytest.fixture(scope="module")
def h100_course():
    need("gpu")
    return compile_step("h100:8", preset="course", batch=32)


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
    """bf16 operands everywhere, the tied output projection's included: the logits
    are written in bf16 and only the loss's sums run in float32 (a float32 logit
    array once made its two backward matmuls f32 x bf16 on a TPU, f32 x f32 on a
    GPU)."""
    assert cfg.dtype == "bfloat16"
    dtypes = planned.plan.matmul_dtypes
    assert dtypes, "no matmul found in the compiled step"
    assert not {k: n for k, n in dtypes.items() if "f32" in k[:2]}, dtypes
    assert sum(n for (lhs, rhs, _), n in dtypes.items() if lhs == rhs == "bf16") >= 6 * cfg.layers


def test_bf16_step_runs_its_matmuls_in_bf16(tpu_fsdp):
    assert_bf16_matmuls(tpu_fsdp[0], tpu_fsdp[1])


def test_xla_tpu_count_reconciles_with_the_exact_count_on_each_mesh(tpu_fsdp, tpu_data, tpu_tp):
    """The course step compiles for a TPU with splash attention on each mesh (fsdp=4
    is s2_train.py's default there), and fits. XLA cannot count inside the Pallas
    kernel: with attention's FLOPs (by hand, and as the plan counts them) taken out of
    the exact count, the rest (matmuls, mostly) agrees within 3%."""
    for planned, cfg, tc in (tpu_fsdp, tpu_data, tpu_tp):
        p = planned.plan
        assert cfg.attention_impl == "splash" and "tpu_custom_call" in p.kernels
        assert p.exact_flops_per_device == train_flops(cfg, tc.batch) / 4
        assert p.kernel_flops_per_device == 3 * attention_flops(cfg, tc.batch) / 4
        seen = p.exact_flops_per_device - p.kernel_flops_per_device
        assert p.xla_flops_per_device == pytest.approx(seen, rel=0.03), p.mesh
        assert p.fits, p.mesh


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
    # The peak follows the precision read off the compiled matmuls, whatever their
    # size: one layer over 16 positions compiles in half the time of tiny's two over 64.
    small = {"dtype": "float32", "layers": 1, "seq": 16}
    planned, _, _ = compile_step("h100:1", **small)
    assert planned.plan.peak == 494.5e12
    with jax.default_matmul_precision("highest"):
        planned, _, _ = compile_step("h100:1", **small)
    assert planned.plan.peak == 67e12


def test_gradients_sum_in_float32_on_a_gpu_and_a_tpu(h100_one, tpu_fsdp):
    """The embedding's gradient is a scatter-add, the lookup's transpose. Looked
    up in a bf16 table, an H100 summed it with bf16 atomics: 0.12x PyTorch's
    speed, and the frequent bytes' updates lost (docs/h100-run). In the
    course step compiled for both chips every scatter sums in float32, and
    there is one to check: the compiled program, not the source."""
    for planned, cfg, _ in (h100_one, tpu_fsdp):
        found = scatters(planned.compiled.as_text())
        assert found, "no scatter: the embedding's gradient should be one"
        assert {s.dtype for s in found} == {"f32"}, found
        assert (cfg.vocab, cfg.embed) in {s.shape for s in found}  # the table's


def test_the_course_step_on_h100_moves_no_residual_stream_around(h100_one):
    """No transpose or copy as big as the residual stream [B, S, E]. When the
    positions' gradient was a reduction over the batch, XLA's GPU layout laid
    the stream out batch-minor and transposed it at every norm: 35 kernels,
    1.5 ms of the H100's 8.9 ms step (sessions/model/positions.py)."""
    planned, cfg, tc = h100_one
    stream = tc.batch * cfg.seq * cfg.embed
    module = parse(planned.compiled.as_text())
    moved = [
        (op.name, op.type_text)
        for _, op in module.instructions()
        if op.opcode in ("transpose", "copy") and math.prod(op.shape or ()) >= stream
    ]
    assert not moved


def test_no_scatter_writes_the_logits(h100_one):
    """The target's logit is picked by a compare: the loss's gradient writes no
    scatter into a [B, S, V] array (take_along_axis's transpose would)."""
    planned, cfg, tc = h100_one
    logits = tc.batch * cfg.seq * cfg.vocab
    assert all(math.prod(s.shape) < logits for s in scatters(planned.compiled.as_text()))

"""roofline/: counts equal hand counts, XLA agrees with the exact count, a
trace reads back into steps, every chip has a source, predictions obey the
roofline, and the CLI answers bad input on one line with exit status 2."""

import dataclasses
import functools
import itertools
import json
import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PYTHON,
    REPO,
    hand_flops,
    hand_params,
    roofline_command,
    subprocess_env,
    without_plugin_noise,
)

from roofline.compiled.kinds import KINDS, classify_hlo
from roofline.compiled.op_roofline import group_alike, predict_ops
from roofline.compiled.program import Collective
from roofline.flops import (
    count_params,
    ledger,
    ledger_lines,
    napkin_train_flops,
    param_count,
    train_bytes,
    train_flops,
)
from roofline.hardware import CHIPS, Roofs, chip_for_kind, find_chip, local_roofs
from roofline.measured import compare as compare_module
from roofline.measured import record
from roofline.measured.chart import roofline_chart, roofline_figure
from roofline.measured.compare import compare, profile_table, xla_cost
from roofline.measured.profile import capture
from roofline.measured.table import table_lines
from roofline.measured.trace import read_trace
from roofline.memory import step_memory
from roofline.predict import comm_time, predict, predict_train_step, utilisation
from sessions.model import init_params
from sessions.model.config import PRESETS, PUBLISHED, ModelConfig, TrainConfig
from sessions.train.step import init_state, make_optimizer, make_train_step


@pytest.mark.parametrize("name", ["tiny", "course"])
def test_parameter_and_flop_counts_equal_hand_counts(name):
    cfg, B = PRESETS[name].model, PRESETS[name].train.batch
    P = hand_params(cfg)
    matmuls, attention = hand_flops(cfg, B)
    tokens = B * cfg.seq
    g = ledger(cfg, B)
    assert param_count(cfg) == P == g.params
    assert g.napkin == napkin_train_flops(cfg, B) == 6 * tokens * P  # what s2_train.py prints
    assert g.matmul == matmuls
    assert g.exact == train_flops(cfg, B) == matmuls + attention
    assert g.exact_causal == matmuls + attention // 2
    assert g.forward == (matmuls + attention) // 3
    assert g.kaplan == 6 * tokens * (P - cfg.vocab * cfg.embed - cfg.seq * cfg.embed)


def test_param_count_of_a_real_tree():
    cfg = PRESETS["tiny"].model
    assert count_params(init_params(cfg, jax.random.key(0))) == hand_params(cfg)
    no_attention = dataclasses.replace(cfg, attention=False, positions=False)
    V, E, F, L = cfg.vocab, cfg.embed, cfg.ff, cfg.layers
    assert param_count(no_attention) == V * E + E + L * (E + 2 * E * F)
    assert ledger(no_attention, 2).attention_full == 0


def test_bytes_lower_bound_by_hand():
    cfg, B = PRESETS["tiny"].model, 2
    V, E, F, H, D, L, S = cfg.vocab, cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.seq
    P, tokens, f32 = hand_params(cfg), B * S, 4
    kept = tokens * (L * (E + 3 * H * D + H * D + E + 2 * F) + E) * f32  # float32 activations
    kept += L * B * H * S * S * f32 + tokens * V * f32  # einsum attention's probabilities, logits
    b = train_bytes(cfg, B)
    assert (b.weights, b.gradients, b.optimizer) == (4 * P, 4 * P, 28 * P)
    assert b.activations == 2 * kept  # written forward, read backward
    assert b.total == 36 * P + 2 * kept
    flash = train_bytes(dataclasses.replace(cfg, attention_impl="cudnn", dtype="bfloat16"), B)
    bf16 = 2  # the same values, logits too, at half the bytes; no probabilities (flash)
    assert (
        flash.activations == 2 * tokens * (L * (E + 3 * H * D + H * D + E + 2 * F) + E + V) * bf16
    )


# The shape XLA's count is checked at. At the tiny preset (E=48, 1,024 tokens)
# elementwise work XLA also counts is ~5% of the step: AdamW alone is ~19
# FLOPs per parameter against 6·tokens for the matmuls, and GELU, softmax and
# the norms add a share that falls as 1/E. At E=192 and 512 tokens all of it
# is ~2%, so within 3% checks the matmul count rather than the elementwise
# work, while compiling in about a second. Sizes still differ pairwise.
XLA_CFG = ModelConfig(embed=192, ff=512, heads=3, head_dim=48, layers=2, seq=64)
XLA_BATCH = 8


@pytest.fixture(scope="module")
def compiled_step():
    """(step function, compiled program, state) for XLA_CFG, compiled once."""
    tc = TrainConfig(batch=XLA_BATCH, steps=10, warmup=2)
    optimizer = make_optimizer(tc, tc.steps)
    init = functools.partial(init_state, cfg=XLA_CFG, optimizer=optimizer)
    state = jax.device_put(init(jax.random.key(0)), jax.devices()[0])
    tokens = jax.ShapeDtypeStruct((XLA_BATCH, XLA_CFG.seq), np.int32)
    compiled = (
        make_train_step(XLA_CFG, optimizer)
        .lower(state, {"inputs": tokens, "targets": tokens})
        .compile()
    )
    return compiled, state


def test_xla_flops_agree_with_the_exact_count(compiled_step):
    compiled, _ = compiled_step
    flops, bytes_accessed = xla_cost(compiled)
    exact = train_flops(XLA_CFG, XLA_BATCH)
    assert exact <= flops <= 1.03 * exact  # XLA adds the elementwise work, nothing else
    assert bytes_accessed > train_bytes(XLA_CFG, XLA_BATCH).weights
    # cost_analysis() may be a dict or a list of one dict per program.
    assert xla_cost([compiled.cost_analysis()]) == xla_cost(compiled.cost_analysis())


def test_step_memory_by_hand(compiled_step):
    """XLA's plan, with the parts that can be counted by hand counted by hand.
    Arguments: the state (params, Adam's mu and nu: 3 x 4 bytes per parameter,
    and two int32 step counters, Adam's and the schedule's) and the batch
    (inputs and targets, int32 [B, S]). The state is donated, so the new state
    reuses its buffers: those bytes count once."""
    compiled, _ = compiled_step
    m = compiled.memory_analysis()
    state = 12 * hand_params(XLA_CFG) + 2 * 4
    batch = 2 * XLA_BATCH * XLA_CFG.seq * 4
    assert m.argument_size_in_bytes == state + batch
    assert m.alias_size_in_bytes == state
    memory, source = step_memory(compiled, jax.devices("cpu")[0])
    assert source == "XLA's memory plan of the compiled step"
    assert memory == batch + m.output_size_in_bytes + m.temp_size_in_bytes


def test_xla_counts_two_flops_per_multiply_add():
    B, E, F = 6, 24, 40
    x, w = jax.ShapeDtypeStruct((B, E), jnp.float32), jax.ShapeDtypeStruct((E, F), jnp.float32)
    compiled = jax.jit(lambda x, w: jnp.einsum("BE,EF->BF", x, w)).lower(x, w).compile()
    assert xla_cost(compiled)[0] == 2 * B * E * F


@pytest.fixture(scope="module")
def trace(compiled_step, tmp_path_factory):
    """Three traced steps of the compiled step: (logdir, run dir)."""
    compiled, state = compiled_step
    state = jax.tree.map(jnp.copy, state)  # the step donates its state
    rng = np.random.default_rng(0)
    batch = {
        k: jnp.asarray(rng.integers(0, 256, (XLA_BATCH, XLA_CFG.seq)), jnp.int32)
        for k in ("inputs", "targets")
    }
    logdir = str(tmp_path_factory.mktemp("trace"))
    _, run_dir = capture(compiled, state, itertools.repeat(batch), logdir, steps=3)
    return logdir, run_dir


def test_a_trace_reads_back_into_steps(trace, compiled_step):
    logdir, run_dir = trace
    profile = read_trace(logdir, hlo_text=compiled_step[0].as_text())
    assert profile.run_dir == run_dir
    assert profile.module == "jit_train_step"
    assert [s.step for s in profile.steps] == [0, 1, 2]
    assert profile.classified_by == "HLO"
    for s in profile.steps:
        assert 0 < s.busy_s <= s.wall_s
        assert set(s.by_kind) == set(KINDS)
        assert sum(s.by_kind.values()) == pytest.approx(s.wall_s)
        assert s.by_kind["matmul"] > 0 and s.by_kind["collective"] == 0
    assert sum(profile.kind_fractions().values()) == pytest.approx(1)


def test_the_trace_carries_its_own_hlo(trace):
    """Without the compiled program at hand, xprof's converter finds it in the trace."""
    profile = read_trace(trace[0])
    assert profile.classified_by == "HLO" and len(profile.steps) == 3


def test_ops_are_classified_by_what_is_inside_them():
    hlo = """HloModule m

%fused_dot (p0: f32[4,8], p1: f32[8,2]) -> f32[4,2] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,2]{1,0} parameter(1)
  %d = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[4,2]{1,0} tanh(%d)
}

%fused_layout (p0: f32[4,8]) -> f32[8,4] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %e = f32[4,8]{1,0} exponential(%p0)
  ROOT %c = f32[8,4]{0,1} copy(%e)
}

ENTRY %main (a: f32[4,8], b: f32[8,2]) -> (f32[4,2], f32[8,4]) {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,2]{1,0} parameter(1)
  %ynn_fusion.1 = f32[4,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %copy_fusion = f32[8,4]{0,1} fusion(%a), kind=kLoop, calls=%fused_layout
  %ar = f32[4,2]{1,0} all-reduce(%ynn_fusion.1), replica_groups={}, to_apply=%fused_dot
  %gemm = f32[4,2]{1,0} custom-call(%a, %b), custom_call_target="__cublas$gemm"
  ROOT %tuple = (f32[4,2]{1,0}, f32[8,4]{0,1}) tuple(%ar, %copy_fusion)
}
"""
    kinds = classify_hlo(hlo)
    assert kinds["ynn_fusion.1"] == "matmul"
    assert kinds["copy_fusion"] == "copy/transpose"
    assert kinds["ar"] == "collective"
    assert kinds["gemm"] == "matmul"
    assert kinds["t"] == "elementwise"


# Typed from the datasheets each entry cites, not from the table: per chip, dense
# TFLOP/s by dtype (never NVIDIA's 2:4-sparsity figure, twice as large), HBM
# GB/s, and HBM in GB of 1e9 bytes (a vendor's GiB written as GB: 80 GiB is 85.9); all to 1%.
DATASHEETS = {
    "tpu-v4": ({"bfloat16": 275}, 1200, 34.4),  # 32 GiB
    "tpu-v5e": ({"bfloat16": 197}, 819, 16),
    "tpu-v5p": ({"bfloat16": 459}, 2765, 102),  # 95 GiB
    "tpu-v6e": ({"bfloat16": 918}, 1640, 32),
    "a100-40gb": ({"bfloat16": 312, "tf32": 156, "float32": 19.5}, 1555, 42.9),  # 40 GiB
    "a100-80gb": ({"bfloat16": 312, "tf32": 156, "float32": 19.5}, 2039, 85.9),  # 80 GiB
    "h100-sxm": ({"bfloat16": 989, "tf32": 494.5, "float32": 67}, 3350, 85.9),  # 80 GiB
    "h100-pcie": ({"bfloat16": 756, "tf32": 378, "float32": 51}, 2000, 85.9),  # 80 GiB
    "h200": ({"bfloat16": 989, "tf32": 494.5, "float32": 67}, 4800, 151.4),  # 141 GiB
}


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_chip_figures_are_the_datasheet_s(name):
    tflops, bandwidth, memory = DATASHEETS[name]
    chip = find_chip(name)
    assert chip.source.strip().startswith("https://")
    assert {k: v / 1e12 for k, v in chip.flops.items()} == pytest.approx(tflops, rel=0.01)
    assert chip.peak("bfloat16") == pytest.approx(tflops["bfloat16"] * 1e12, rel=0.01)
    assert chip.hbm_bandwidth / 1e9 == pytest.approx(bandwidth, rel=0.01)
    assert chip.hbm_bytes / 1e9 == pytest.approx(memory, rel=0.01)  # GB of 1e9 bytes


def test_every_chip_has_a_source_and_a_name():
    for name, chip in CHIPS.items():
        assert chip.source.strip() and find_chip(name) is chip, name
        assert chip.flops["bfloat16"] > 0 and chip.hbm_bandwidth > 0 and chip.hbm_bytes > 0
    assert CHIPS["h100"] is CHIPS["h100-sxm"]
    with pytest.raises(KeyError, match="unknown chip"):
        find_chip("h1000")


@pytest.mark.parametrize(
    "kind, name",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA H200", "h200"),
        ("TPU v5 lite", "tpu-v5e"),
        ("TPU v6 lite", "tpu-v6e"),
        ("TPU v4", "tpu-v4"),
        ("cpu", None),
    ],
)
def test_device_kinds_find_their_chip(kind, name):
    chip = chip_for_kind(kind)
    assert (chip.name if chip else None) == name


def test_the_roofline_by_hand():
    p = predict(1e12, 1e9, peak_flops=1e14, bandwidth=1e12, tokens=1000)
    assert (p.compute_s, p.memory_s, p.step_s) == pytest.approx((1e-2, 1e-3, 1e-2))
    assert (p.intensity, p.ridge, p.bound) == (1000, 100, "compute")
    assert p.tokens_per_s == pytest.approx(1e5)
    p = predict(1e12, 1e11, peak_flops=1e14, bandwidth=1e12, tokens=1000, chips=4)
    assert (p.bound, p.step_s) == ("memory", pytest.approx(0.1 / 4))
    u = utilisation(1e12, 0.5, datasheet_peak=4e12, measured_peak=2e12)
    assert (u.flops_per_s, u.mfu_datasheet, u.mfu_measured) == (2e12, 0.5, 1.0)
    assert utilisation(1e12, 0.5, measured_peak=2e12).mfu_datasheet is None
    with pytest.raises(ValueError):
        predict(0, 1, peak_flops=1, bandwidth=1, tokens=1)


def test_the_communication_bound_by_hand():
    """A v5e's ICI is 400 GB/s a chip, both directions counted (roofline/tpus.py):
    200 GB/s a direction, so 1 + 2 GB sent take 15 ms. With no link figure the time
    is unknown where something must be sent, and zero where nothing is."""
    sent = {"all-gather": Collective(2, 4e9, 1e9), "reduce-scatter": Collective(1, 1e9, 2e9)}
    assert comm_time(sent, CHIPS["tpu-v5e"]) == (200e9, pytest.approx(0.015))
    no_link = dataclasses.replace(CHIPS["tpu-v5e"], interconnect=None)
    assert comm_time(sent, no_link) == (None, None)
    assert comm_time({}, no_link) == (None, 0.0)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_predictions_never_beat_either_bound(preset):
    cfg = PRESETS[preset].model
    for chip, batch, chips, dtype in itertools.product(
        CHIPS.values(), (1, 32, 512), (1, 8), ("bfloat16", "float32")
    ):
        p = predict_train_step(dataclasses.replace(cfg, dtype=dtype), batch, chip, chips=chips)
        assert p.step_s >= p.compute_s and p.step_s >= p.memory_s
        assert p.step_s == max(p.compute_s, p.memory_s)
        assert (p.bound == "compute") == (p.intensity >= p.ridge)
        assert p.tokens_per_s <= batch * cfg.seq * chips * chip.peak(dtype) / p.flops * (1 + 1e-12)


@pytest.fixture()
def fixed_roofs(monkeypatch):
    """This machine's roofs, fixed: no calibration runs inside a test."""
    # No datasheet, 100 GFLOP/s, 10 GB/s
    roofs = Roofs("measured on this machine", 1e11, "fixed", 1e10, "fixed", measured=True)
    monkeypatch.setattr(compare_module, "local_roofs", lambda dtype, **_: roofs)
    monkeypatch.setattr(record, "local_roofs", lambda dtype, **_: roofs)
    # Every matmul shape at half the peak, as if timed (calibrate.matmul_rates)
    rates = lambda shapes: dict.fromkeys(shapes, 5e10)  # noqa: E731
    monkeypatch.setattr(compare_module.calibrate, "matmul_rates", rates)
    return roofs


def test_the_three_columns(trace, compiled_step, fixed_roofs, tmp_path, capsys):
    logdir, _ = trace
    compiled, _ = compiled_step
    lines = profile_table(logdir, XLA_CFG, XLA_BATCH, compiled, devices=1)
    text = "\n".join(lines)
    for column in ("napkin", "XLA's count", "measured (trace)"):
        assert column in text
    assert "MFU vs measured ceiling" in text and "xprof --logdir" in text
    c = compare(XLA_CFG, XLA_BATCH, fixed_roofs, cost=xla_cost(compiled), trace=read_trace(logdir))
    assert c.use.flops_per_s == pytest.approx(train_flops(XLA_CFG, XLA_BATCH) / c.trace.step_s)
    assert c.use.mfu_measured == pytest.approx(c.use.flops_per_s / 1e11)
    assert c.napkin.step_s <= c.xla.step_s  # XLA moves more bytes than the lower bound
    assert any("n/a" in line for line in table_lines(c))  # no datasheet for a CPU
    png = roofline_chart(c, tmp_path / "roofline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # profile_table left roofline.json, so the CLI redoes the table from the directory.
    summary_path = tmp_path / "compare.json"
    assert roofline_command(["compare", logdir, "--summary-out", str(summary_path)]) == 0
    assert "measured (trace)" in capsys.readouterr().out
    summary = json.loads(summary_path.read_text())
    assert summary["measured_step_seconds"] == pytest.approx(c.trace.step_s)
    assert summary["bound_step_seconds"] == pytest.approx(c.napkin.step_s)
    assert summary["mfu_measured_roof"] == pytest.approx(c.use.mfu_measured)
    mean_step = sum(s.wall_s for s in c.trace.steps) / len(c.trace.steps)  # kinds are means
    assert sum(summary["measured_seconds_by_kind"].values()) == pytest.approx(mean_step)


def test_the_prediction_holds_every_op_the_trace_ran(trace, compiled_step):
    """On the CPU the per-op prediction and the trace cover the same ops: each
    op the step's program ran is predicted; and each op's measured seconds,
    split as the kinds are, add up to its kind's."""
    hlo = compiled_step[0].as_text()
    t = read_trace(trace[0], hlo_text=hlo)
    p = predict_ops(hlo, Roofs("fixed", 1e11, "fixed", 1e10, "fixed"))
    measured = t.op_seconds()
    assert measured and set(measured) <= {o.name for o in p.ops}
    kinds, by_kind = classify_hlo(hlo), t.kind_seconds()
    for kind in set(KINDS) - {"idle"}:
        mine = sum(s for name, s in measured.items() if kinds[name] == kind)
        assert mine == pytest.approx(by_kind[kind], abs=1e-12)


def test_compare_summary_puts_each_op_beside_its_time(
    trace, compiled_step, fixed_roofs, tmp_path, capsys
):
    """profile_table leaves the step's HLO beside roofline.json; compare redoes the
    per-op prediction from the directory alone, and its summary adds up."""
    logdir = str(tmp_path / "run")
    shutil.copytree(trace[0], logdir)
    profile_table(logdir, XLA_CFG, XLA_BATCH, compiled_step[0], devices=1, chart=False)
    assert os.path.exists(os.path.join(logdir, record.HLO))
    out = tmp_path / "summary.json"
    assert roofline_command(["compare", logdir, "--summary-out", str(out)]) == 0
    assert "predicted" in capsys.readouterr().out
    s = json.loads(out.read_text())
    for key in (
        "measured_step_seconds",
        "bound_step_seconds",
        "xla_step_seconds",
        "mfu_measured_roof",
    ):
        assert s[key] > 0  # the keys comparison_summary wrote before
    assert sum(s["predicted_seconds_by_kind"].values()) == pytest.approx(
        s["predicted_step_seconds"]
    )
    assert set(s["measured_seconds_by_kind"]) == set(KINDS)
    tops = s["top_ops"]
    assert tops and all(
        {"name", "kind", "flops", "bytes", "seconds", "bound", "measured_seconds"} <= set(o)
        for o in tops
    )
    assert all(o["measured_seconds"] >= 0 for o in tops)
    # Op times are means over the traced steps, as the kinds are: their sum is the mean step.
    assert sum(o["measured_seconds"] for o in tops) <= sum(s["measured_seconds_by_kind"].values())
    # Without the HLO: the same table, one line saying so, and no per-op numbers.
    os.remove(os.path.join(logdir, record.HLO))
    assert roofline_command(["compare", logdir, "--summary-out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "no per-op prediction" in captured.out and "Traceback" not in captured.err
    assert json.loads(out.read_text())["top_ops"] is None


def test_the_best_case_from_this_machines_ceilings_is_below_its_traced_step(trace, compiled_step):
    """The per-op best case (the ceilings alone: the measured matmul peak, the
    cache's and the memory's measured bandwidths) never exceeds a measured step."""
    roofs = local_roofs(XLA_CFG.dtype, measured=True, devices=1)
    assert roofs.cache, "this CPU's last-level cache was measured"
    c = compare(
        XLA_CFG,
        XLA_BATCH,
        roofs,
        trace=read_trace(trace[0], hlo_text=compiled_step[0].as_text()),
        hlo_text=compiled_step[0].as_text(),
    )
    assert c.ops.step_s <= c.trace.step_s


def test_the_chart_places_each_op_group(trace, compiled_step, fixed_roofs):
    hlo = compiled_step[0].as_text()
    c = compare(
        XLA_CFG, XLA_BATCH, fixed_roofs, trace=read_trace(trace[0], hlo_text=hlo), hlo_text=hlo
    )
    groups = [g for g in group_alike(c.ops.ops) if g.flops > 0 and g.bytes > 0]
    fig, points = roofline_figure(c)
    drawn = {a.get_gid(): len(a.get_offsets()) for a in fig.axes[0].collections if a.get_gid()}
    assert len(points) == len(groups) == drawn["ops predicted"] > 1
    assert drawn["ops measured"] == sum(1 for p in points if p.measured) == len(groups)
    assert sorted(p.seconds for p in points) == pytest.approx(sorted(g.seconds for g in groups))


def test_cli_lists_its_commands(capsys):
    assert roofline_command(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("chips", "calibrate", "predict", "compare"))


def test_cli_predicts_gpt2_on_an_h100(capsys):
    assert roofline_command(["predict", "--preset", "gpt2", "--batch", "32", "--chip", "h100"]) == 0
    out = capsys.readouterr().out
    # The published GPT-2 (V=50,257): a published model's name wins over the course's.
    cfg = dataclasses.replace(PUBLISHED["gpt2"].model, dtype="bfloat16")
    best = train_flops(cfg, 32) / 989e12  # compute-bound on the H100's bf16 peak
    assert f"best case: {best * 1e3:,.2f} ms per step" in out
    assert f"{32 * 1024 / best:,.0f} tokens/s" in out
    assert "compute-bound" in out and "memory-bound" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--chip", "h1000"],
        ["predict", "--preset", "gpt5"],
        ["predict", "--batch", "0"],
        ["predict", "--batch", "-4"],
        ["predict", "--seq", "many"],
        ["predict", "--chips", "0"],
        ["compare", "/no/such/dir"],
        ["compare"],
        ["launch"],
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, capsys, tmp_path):
    status = roofline_command(argv)
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_compare_of_a_directory_without_a_trace(tmp_path, capsys):
    assert roofline_command(["compare", str(tmp_path), "--preset", "tiny"]) == 2
    assert "no trace" in capsys.readouterr().err


def test_cli_entry_point_exits_2_on_one_line():
    result = subprocess.run(
        [PYTHON, "-m", "roofline", "predict", "--chip", "h1000"],
        cwd=REPO,
        env=subprocess_env(1),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    stderr = without_plugin_noise(result.stderr)
    assert stderr.startswith("error: unknown chip 'h1000'")
    assert len(stderr.strip().splitlines()) == 1


def test_the_readme_ledger_is_the_code_s():
    """roofline/README.md quotes the ledger of the cpu preset; it must still be true."""
    with open(f"{REPO}/roofline/README.md") as f:
        readme = f.read().splitlines()
    cfg, B = PRESETS["cpu"].model, PRESETS["cpu"].train.batch
    rows = ledger_lines(cfg, B)[1:7]  # the six counts, without the title and the note
    start = readme.index(rows[0])
    assert readme[start : start + 6] == rows

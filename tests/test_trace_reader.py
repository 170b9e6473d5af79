"""Traces from any chip: roofline/measured/trace.py finds the steps and ops of GPU- and
TPU-shaped traces (built here as the runtimes write them, from their sources),
the profiler's window drains each traced step on a real CPU, and `python -m
roofline compare DIR` holds a trace against the chip it was captured on.

What the fixtures copy, and from where:

  GPU  xla/backends/profiler/gpu/cupti_collector.cc (CreateXEvent, GetDeviceXLineName,
       Export): plane "/device:GPU:0", one line per CUDA stream named "Stream #N(Kernel)",
       events named by the kernel, with correlation_id (uint64), context_id ("$$1"),
       kernel_details, and the annotation stack parsed into stats, innermost first,
       strings written as references (xplane_builder.h, ParseAndAddStatValue).
       The stack is the "XlaModule:#hlo_module=..,program_id=..#" and
       "Thunk:#name=..,hlo_op=..,unique_hlo_op_id=..#" annotations of
       xla/backends/gpu/runtime/annotation.cc: hlo_op, hlo_module, program_id, and
       no run_id. Driver API callbacks (cuLaunchKernel) land on the host plane's
       "Host Threads/<tid>" lines (MergeHostPlanesAndSortLines,
       xla/tsl/profiler/convert/post_process_single_host_xplane.cc).
  TPU  a real v6e capture in xprof's tests (xprof/convert/test_xplanes/
       tpu_inference_2.xplane.pb; its bytes, decoded: lines "XLA Modules", "XLA Ops",
       "Async XLA Ops", "XLA TraceMe"; module events named "jit_f(<fingerprint>)" with
       run_id, replica_id, queue_id, core_type; op metadata named by the HLO
       instruction's text, display name the instruction's name, with hlo_category,
       program_id (the fingerprint), symbol_id, flops, bytes_accessed on the metadata;
       op events with device_offset_ps and device_duration_ps only; async events with
       an hlo_op stat) and xprof/convert/xplane_to_step_events_test.cc (the "Steps" line).
  host jax.profiler.StepTraceAnnotation("train", step_num=n): an event "train" with
       stats _r=1 and step_num=n on the Python thread's line of "/host:CPU", as any
       capture on this machine shows.
"""

import json
import os

import jax
import jax.numpy as jnp
import pytest
from helpers import roofline_command
from xspace_fixtures import Plane, Ref, U, write_run

from roofline.chip import Roofs
from roofline.flops import train_flops
from roofline.measured import compare as compare_module
from roofline.measured import record
from roofline.measured.compare import local_comparison
from roofline.measured.profile import TraceWindow, capture
from roofline.measured.trace import read_trace
from roofline.measured.trace_ops import latest_run, load_ops
from sessions.model.config import ModelConfig

# ---------------------------------------------------------------- a GPU's trace

GPU_GAPS = {1: 10, 2: 30, 3: 15}  # µs the device idled inside each step
# (hlo_op, kernel, stream, start after the step's first kernel and duration, µs). XLA
# names a kernel after its fusion ("fusion.7" launches "fusion_7"); libraries their own.
GPU_KERNELS = [
    ("fusion.7", "fusion_7", 13, 0, 400),  # a dot inside, which its name does not say
    ("loop_add_fusion", "loop_add_fusion", 13, 400, 100),  # + the step's gap before it
    (
        "cublas-gemm.2",
        "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32_cublas",
        13,
        500,
        300,
    ),
    ("input_reduce_fusion.1", "input_reduce_fusion_1", 13, 800, 50),
    ("all-reduce-start.1", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 21, 690, 200),
]
GPU_HLO = """HloModule jit_train_step

%fused_dot (p0: f32[64,64], p1: f32[64,64]) -> f32[64,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  %p1 = f32[64,64]{1,0} parameter(1)
  ROOT %d = f32[64,64]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[64,64], b: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %b = f32[64,64]{1,0} parameter(1)
  %fusion.7 = f32[64,64]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %loop_add_fusion = f32[64,64]{1,0} add(%fusion.7, %a)
  %cublas-gemm.2 = f32[64,64]{1,0} custom-call(%loop_add_fusion, %b), custom_call_target="__cublas$gemm"
  %input_reduce_fusion.1 = f32[64,64]{1,0} tanh(%cublas-gemm.2)
  ROOT %all-reduce-start.1 = f32[64,64]{1,0} all-reduce-start(%input_reduce_fusion.1), replica_groups={}, to_apply=%fused_dot
}
"""


def gpu_run(logdir):
    """Three drained training steps on one GPU, traced (steps 1-3, as TraceWindow
    traces them). Per step, µs after its first kernel: a dot fusion [0, 400), then
    the step's idle gap g, an add [400+g, 500+g), a cuBLAS GEMM [500+g, 800+g), a
    reduction [800+g, 850+g) on the compute stream, and an NCCL all-reduce
    [690+g, 890+g) on its own stream. The host stamps step k's marker 80 µs before
    its first kernel, and the next marker 300 µs after its last kernel ends (the
    drain returned, Python dispatched). A batch copy (no XLA op) precedes each
    step, and another program's kernel runs between steps 2 and 3."""
    host = Plane("/host:CPU")
    python = host.line("python")
    driver = host.line("Host Threads/4242")
    gpu = Plane("/device:GPU:0", {"device_vendor": "Nvidia"})
    # Device lines' timestamps are the GPU clock's start, normalized to the host's
    # (cupti_collector.cc, Export): not 0, so offsets are relative to them.
    streams = {n: gpu.line(f"Stream #{n}(Kernel)", 500_000, line_id=n) for n in (13, 21)}
    copies = gpu.line("Stream #14(MemcpyH2D)", 500_000, line_id=14)
    marker, correlation = 1000, 100
    for step, gap in GPU_GAPS.items():
        python.event("train", marker, 60, {"_r": 1, "step_num": step})
        copies.event(
            "MemcpyH2D",
            marker + 20,
            30,
            {"correlation_id": U(correlation), "memcpy_details": Ref("kind_src:pinned")},
        )
        first = marker + 80
        for hlo_op, kernel, stream, start, duration in GPU_KERNELS:
            correlation += 1
            start = first + start + (gap if start >= 400 else 0)
            driver.event(
                "cuLaunchKernel", marker + 10, 2, {"device_id": 0, "correlation_id": U(correlation)}
            )
            streams[stream].event(
                kernel,
                start,
                duration,
                {
                    "correlation_id": U(correlation),
                    "context_id": "$$1",
                    "theoretical_occupancy_pct": 50.0,
                    "kernel_details": Ref("regs:64"),
                    "tf_op": Ref("XlaModule"),
                    "name": Ref("jit(train_step)/op"),
                    "hlo_op": Ref(hlo_op),
                    "unique_hlo_op_id": correlation,
                    "hlo_module": Ref("jit_train_step"),
                    "program_id": 12,
                },
            )
        end = first + 890 + gap
        if step == 2:
            streams[13].event(
                "loop_convert_fusion",
                end + 100,
                5,
                {
                    "correlation_id": U(999),
                    "tf_op": Ref("XlaModule"),
                    "hlo_op": Ref("convert_element_type.1"),
                    "hlo_module": Ref("jit_convert_element_type"),
                    "program_id": 3,
                },
            )
        marker = end + 300
    return write_run(logdir, {"gpu-host": [host, gpu]})


def test_a_gpu_trace_reads_into_drained_steps(tmp_path):
    """Per step, by hand: busy = [0, 400) and [400+g, 890+g) = 890 µs, wall = 890 + g,
    idle = g. Own times 400 + 100 + 300 + 50 + 200 = 1050 µs share the busy time:
    matmul (dot fusion, GEMM) 700/1050, elementwise (add, reduction) 150/1050,
    collective 200/1050."""
    gpu_run(tmp_path)
    profile = read_trace(str(tmp_path), hlo_text=GPU_HLO)
    assert (profile.platform, profile.module, profile.devices) == ("gpu", "jit_train_step", 1)
    assert profile.other_modules == ("jit_convert_element_type",)
    assert profile.classified_by == "HLO"
    assert [s.step for s in profile.steps] == [1, 2, 3]
    for s, gap in zip(profile.steps, GPU_GAPS.values()):
        assert s.wall_s == pytest.approx((890 + gap) * 1e-6)
        assert s.busy_s == pytest.approx(890e-6)
        assert s.by_kind["matmul"] == pytest.approx(700 / 1050 * 890e-6)
        assert s.by_kind["elementwise"] == pytest.approx(150 / 1050 * 890e-6)
        assert s.by_kind["collective"] == pytest.approx(200 / 1050 * 890e-6)
        assert s.by_kind["idle"] == pytest.approx(gap * 1e-6)
        assert s.by_kind["copy/transpose"] == s.by_kind["other"] == 0
    assert profile.step_s == pytest.approx(905e-6)  # the median of 900, 920 and 905 µs


def test_without_its_hlo_a_gpu_trace_is_classified_by_op_names(tmp_path):
    """fusion.7 says nothing of the dot inside it: by name it is elementwise work."""
    gpu_run(tmp_path)
    profile = read_trace(str(tmp_path))
    assert profile.classified_by == "op names"
    s = profile.steps[0]
    assert s.by_kind["matmul"] == pytest.approx(300 / 1050 * 890e-6)  # the GEMM alone
    assert s.by_kind["elementwise"] == pytest.approx(550 / 1050 * 890e-6)


# ---------------------------------------------------------------- a TPU's trace

TPU_GAPS = {1: 15, 2: 25, 3: 15}
FINGERPRINT = 2433868464432466958  # the program's id on a TPU: a fingerprint, uint64
TPU_OPS = [  # (name, hlo_category, start after the module's start, µs; duration, µs)
    ("fusion.1", "convolution fusion", 5, 400),  # + e: TPU 1 runs it e = 5 µs longer
    ("fusion.2", "loop fusion", 405, 100),
    ("all-reduce.1", "all-reduce", 505, 200),
    ("copy.3", "data formatting", 705, 50),  # + the step's gap before it, and after
    ("convolution.4", "convolution", 755, 200),
    ("while.5", "while", 955, 100),
    ("fusion.6", "loop fusion", 965, 80),  # the while loop's body, nested in its event
]


def tpu_run(logdir):
    """Three training steps on two TPU cores, traced. Per step and core, µs after the
    XLA Modules event's start: the ops of TPU_OPS, TPU 1's first op e = 5 µs longer
    (e = 0 on TPU 0, later ops shifted by e), and an idle gap g before copy.3. An
    "Async XLA Ops" copy spans most of the step and a "Steps" event all of it: neither
    is time an op ran. A SparseCore plane holds ops of its own, on its own lines.
    The host's markers were stamped ahead of the device (all before step 1 ran):
    the TPU says which execution an op belongs to, so markers only number steps."""
    host = Plane("/host:CPU")
    python = host.line("python")
    for step in TPU_GAPS:
        python.event("train", 1000 + 100 * (step - 1), 50, {"_r": 1, "step_num": step})
    planes = [host]
    for core, extra in ((0, 0), (1, 5)):
        tpu = Plane(
            f"/device:TPU:{core}",
            {"peak_teraflops_per_second": 197.0, "peak_hbm_bw_gigabytes_per_second": 819.0},
        )
        steps, modules, ops, async_ops = (
            tpu.line(name, 400_000, line_id=i)
            for i, name in enumerate(("Steps", "XLA Modules", "XLA Ops", "Async XLA Ops"), 1)
        )
        start = 5000 + 3 * core
        for step, gap in TPU_GAPS.items():
            end = start + 1060 + extra + gap
            steps.event(str(step), start - 2, end - start + 4, {"group_id": step})
            modules.event(
                f"jit_train_step({FINGERPRINT})",
                start,
                end - start,
                {"run_id": U(100 + step), "replica_id": 0, "queue_id": U(0), "core_type": U(0)},
            )
            for symbol, (name, category, offset, duration) in enumerate(TPU_OPS, 1):
                shift = (extra if symbol > 1 else 0) + (gap if offset >= 705 else 0)
                duration += extra if symbol == 1 else 0
                ops.event(
                    f"%{name} = f32[1024,1024]{{1,0:T(8,128)}} {category}(...)",
                    start + offset + shift,
                    duration,
                    {"device_offset_ps": U(1), "device_duration_ps": U(duration * 10**6)},
                    display_name=name,
                    metadata_stats={
                        "hlo_category": category,
                        "program_id": U(FINGERPRINT),
                        "symbol_id": U(symbol),
                        "flops": 0,
                        "bytes_accessed": 4096,
                    },
                )
            async_ops.event("copy-start.2", start + 300, 600, {"hlo_op": "copy-start.2", "_a": 1})
            if step == 1 and core == 0:  # another program, between steps 1 and 2
                modules.event(
                    "jit_convert_element_type(1234)",
                    end + 50,
                    10,
                    {"run_id": U(7), "replica_id": 0},
                )
                ops.event(
                    "%convert_element_type.1 = f32[8]{0} convert(...)",
                    end + 52,
                    3,
                    display_name="convert_element_type.1",
                    metadata_stats={
                        "hlo_category": "non-fusion elementwise",
                        "program_id": U(1234),
                    },
                )
            start = end + 200
        planes.append(tpu)
    sparse = Plane("/device:TPU:0 SparseCore 0")  # xplane_schema.cc, kSparseCorePlaneRegex
    sparse.line("Sparse Core Ops").event("sparse_op", 5100, 500)
    planes.append(sparse)
    return write_run(logdir, {"tpu-host": planes})


def test_a_tpu_trace_reads_into_its_executions(tmp_path):
    """Per step and core, by hand: the ops run back to back from 5 to 1055 + e + g µs
    but for the gap g, so wall = 1050 + e + g, busy = 1050 + e, idle = g; nothing
    overlaps, so each kind gets its ops' own times: matmul (the convolution fusion
    and the convolution) 600 + e, elementwise (two loop fusions) 180, collective 200,
    copy 50, other (the while loop less its body) 20. Averaged over e = 0 and 5."""
    tpu_run(tmp_path)
    profile = read_trace(str(tmp_path))
    assert (profile.platform, profile.module, profile.devices) == ("tpu", "jit_train_step", 2)
    assert profile.other_modules == ("jit_convert_element_type",)
    assert profile.classified_by == "the TPU's op categories"
    assert [s.step for s in profile.steps] == [1, 2, 3]
    for s, gap in zip(profile.steps, TPU_GAPS.values()):
        assert s.wall_s == pytest.approx((1052.5 + gap) * 1e-6)
        assert s.busy_s == pytest.approx(1052.5e-6)
        expected = {
            "matmul": 602.5,
            "elementwise": 180,
            "collective": 200,
            "copy/transpose": 50,
            "other": 20,
            "idle": gap,
        }
        assert s.by_kind == pytest.approx({k: v * 1e-6 for k, v in expected.items()})
    assert profile.step_s == pytest.approx(1067.5e-6)  # the median of 1067.5, 1077.5, 1067.5


def test_the_compiled_hlo_finds_tpu_ops_by_their_instruction_names(tmp_path):
    """Given the step's HLO, TPU ops are looked up by the names the runtime displays
    (the metadata's display name), not by the instruction text it is named by."""
    tpu_run(tmp_path)
    hlo = (
        "ENTRY %main () -> f32[] {\n"
        + "".join(
            f"  %{name} = f32[] {'dot' if name == 'fusion.2' else 'add'}()\n"
            for name, *_ in TPU_OPS
        )
        + "}\n"
    )
    profile = read_trace(str(tmp_path), hlo_text=hlo)
    assert profile.classified_by == "HLO"
    assert profile.steps[0].by_kind["matmul"] == pytest.approx(100e-6)  # fusion.2, a dot here


# ---------------------------------------------------------------- traced steps run alone


def slow_step(state, batch):
    """Eight 512 x 512 matmuls, about 2 GFLOP: tens of milliseconds on a CPU, long
    beside the host's dispatch of the next step (well under a millisecond)."""
    x = state
    for _ in range(8):
        x = jnp.tanh(x @ batch) / 8
    return x, {"loss": x.sum()}


def executions_and_markers(logdir):
    """[(start, end) of each execution of the step, in ps], [marker starts], from the
    trace's own run ids (a CPU writes them) and StepTraceAnnotation markers."""
    _, ops, markers = load_ops(latest_run(logdir))
    runs = {}
    for op in ops:
        if op.module == "jit_slow_step":
            start, end = runs.get(op.execution, (op.start_ps, op.end_ps))
            runs[op.execution] = (min(start, op.start_ps), max(end, op.end_ps))
    return sorted(runs.values()), [t for t, _ in markers[0]]


def test_trace_window_drains_each_traced_step(tmp_path):
    """As s2_train.py's loop uses it: steps 1-3 of 5 are traced, and each ends on
    the device before the host stamps the next step's marker (with the host left
    to run ahead, the next marker comes while the step still runs)."""
    step = jax.jit(slow_step)
    state = batch = jnp.eye(512) + 0.01
    window = TraceWindow(str(tmp_path), start=0, steps=5)
    for i in range(5):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            state, _ = step(state, batch)
        window(i, state)
    runs, markers = executions_and_markers(str(tmp_path))
    assert len(runs) == len(markers) == 3
    for (_, end), next_marker in zip(runs, markers[1:]):
        assert end <= next_marker


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """capture() of three steps of slow_step on this CPU: the logdir."""
    logdir = str(tmp_path_factory.mktemp("cpu_trace"))
    batch = jnp.eye(512) + 0.01
    capture(jax.jit(slow_step), batch, iter([batch] * 4), logdir, steps=3)
    return logdir


def test_capture_drains_each_step(cpu_trace):
    runs, markers = executions_and_markers(cpu_trace)
    assert len(runs) == len(markers) == 3
    for (_, end), next_marker in zip(runs, markers[1:]):
        assert end <= next_marker
    assert [s.step for s in read_trace(cpu_trace).steps] == [0, 1, 2]


# ---------------------------------------------------------------- the chip a trace ran on

COMPARED = ModelConfig(
    embed=512, ff=2048, heads=8, head_dim=64, layers=4, seq=256, dtype="bfloat16"
)


def roofs_here(monkeypatch, peak, bandwidth):
    """This machine's measured roofs, fixed (no calibration runs in a test)."""

    def local_roofs(dtype, **_):
        return Roofs("measured on this machine", peak, "fixed", bandwidth, "fixed", measured=True)

    monkeypatch.setattr(compare_module, "local_roofs", local_roofs)
    monkeypatch.setattr(record, "local_roofs", local_roofs)


def row(out, label):
    return next(line for line in out.splitlines() if line.startswith(label))


def test_compare_holds_a_tpu_trace_against_the_tpu_datasheet(tmp_path, monkeypatch, capsys):
    """A TPU VM's trace directory read on this CPU: the roof is the v5e's datasheet
    (https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 819 GB/s), MFU is
    against it and against the ceiling measured on the TPU, never this CPU's."""
    tpu_run(tmp_path)
    chip = {
        "platform": "tpu",
        "device_kind": "TPU v5 lite",
        "devices": 2,
        "dtype": "bfloat16",
        "datasheet": "tpu-v5e",
        "host": "t1v-n-0",
        "measured_peak": 1.5e14,
        "measured_bandwidth": 7.5e11,
    }
    with open(tmp_path / "roofline.json", "w") as f:
        json.dump(
            {
                "model": {**vars(COMPARED)},
                "batch": 16,
                "devices": 2,
                "xla_flops": None,
                "xla_bytes": None,
                "chip": chip,
            },
            f,
        )
    roofs_here(monkeypatch, 3e11, 2e10)
    assert roofline_command(["compare", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    roof = row(out, "roof:")
    assert "datasheet" in roof and "197.000 TFLOP/s" in roof and "819.0 GB/s" in roof
    assert "0.300 TFLOP/s" not in out and "this machine" not in out
    flops_per_s = train_flops(COMPARED, 16) / 1067.5e-6 / 2  # per core, the median step
    assert row(out, "MFU vs tpu").split()[-1] == f"{100 * flops_per_s / 197e12:.1f}%"
    assert row(out, "MFU vs measured").split()[-1] == f"{100 * flops_per_s / 1.5e14:.1f}%"


def test_a_cpu_trace_read_elsewhere_keeps_the_capture_machine_s_roofs(
    cpu_trace, monkeypatch, capsys
):
    """local_comparison records this CPU and the roofs measured on it; read on
    another machine, `compare` holds the trace against those, and says whose."""
    roofs_here(monkeypatch, 1e11, 1e10)
    local_comparison(COMPARED, 16, devices=1, logdir=cpu_trace)
    with open(os.path.join(cpu_trace, "roofline.json")) as f:
        chip = json.load(f)["chip"]
    device = jax.local_devices()[0]
    assert chip == {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": 1,
        "dtype": "bfloat16",
        "datasheet": None,
        "host": record.socket.gethostname(),
        "measured_peak": 1e11,
        "measured_bandwidth": 1e10,
        "measured_cache": None,  # roofs_here has no cache figure
        "matmul_rates": {},  # no compiled step given, so no matmul shapes to time
    }
    roofs_here(monkeypatch, 5e11, 4e10)  # the other machine's, which must not be used
    monkeypatch.setattr(record.socket, "gethostname", lambda: "another-laptop")
    assert roofline_command(["compare", cpu_trace]) == 0
    roof = row(capsys.readouterr().out, "roof:")
    assert "0.100 TFLOP/s and 10.0 GB/s" in roof
    assert f"measured on {chip['host']}" in roof


def test_a_record_without_its_chip_says_the_roof_is_this_machine_s(tmp_path, monkeypatch, capsys):
    """A roofline.json written before chips were recorded: this machine's roof, labelled."""
    tpu_run(tmp_path)
    with open(tmp_path / "roofline.json", "w") as f:
        json.dump({"model": {**vars(COMPARED)}, "batch": 16, "devices": 2}, f)
    roofs_here(monkeypatch, 3e11, 2e10)
    assert roofline_command(["compare", str(tmp_path)]) == 0
    roof = row(capsys.readouterr().out, "roof:")
    assert "0.300 TFLOP/s" in roof and "measured on this machine" in roof
    assert "the trace ran on a tpu" in roof


def test_a_trace_with_no_xla_ops_is_one_line_and_exit_2(tmp_path, capsys):
    host = Plane("/host:CPU")
    host.line("python").event("train", 10, 5, {"_r": 1, "step_num": 0})
    write_run(tmp_path, {"idle-host": [host]})
    assert roofline_command(["compare", str(tmp_path), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "holds no XLA ops" in err


def test_a_file_that_is_not_a_trace_is_one_line_and_exit_2(tmp_path, capsys):
    run_dir = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    run_dir.mkdir(parents=True)
    (run_dir / "host.xplane.pb").write_bytes(b"\xff" * 64)  # a truncated download, say
    assert roofline_command(["compare", str(tmp_path), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is not a profiler trace" in err

"""Chips by capability: the table matches whole product names, pre-Ampere GPUs get
float32 and XLA's attention, an accelerator JAX cannot see stops the run, an
unknown chip is measured and says so, an impossible MFU is flagged, and a
calibration never passes for the step's memory. Devices, compiled steps and
machines are faked (tests/hardware_fakes.py): no accelerator here."""

import json
import threading

import pytest
from hardware_fakes import FakeCompiled, FakeDevice, fake_root

from roofline import calibrate, memory
from roofline.hardware import (
    CHIPS,
    chip_for_kind,
    datasheet_chip,
    local_peak_flops,
    local_roofs,
)
from sessions.errors import UsageError, run_main
from sessions.run import accelerator
from sessions.run.accelerator import check_accelerator_visible
from sessions.run.defaults import Defaults, capability_defaults, configs_for
from sessions.run.report import summarize, summary_lines
from sessions.train.meter import format_record, make_record

T, G, GiB, MiB = 1e12, 1e9, 2**30, 2**20

# Device names as the runtimes print them, each written down from where it was seen
# (issue threads, nvidia-smi output, XLA's GPU spec files, jax's tests), with the
# entry the datasheet says it is. None: not in the table, so measured.
KINDS = [
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),  # jax-ml/jax#11705, a newer driver
    ("A100-SXM4-40GB", "a100-40gb"),  # jax-ml/jax#11705, the same GPU in 2022: no "NVIDIA"
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),  # XLA's a100_sxm_80.txtpb
    ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),  # RunPod's GPU ids, nvidia-smi's names
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # XLA's h100_sxm.txtpb
    ("NVIDIA H100 PCIe", "h100-pcie"),  # XLA's h100_pcie.txtpb
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 141GB HBM3e", "h200"),  # XLA's h200.txtpb
    ("NVIDIA GH200 480GB", "gh200"),  # nvidia-smi on Grace Hopper: 96 GB HBM3, not an H200
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),  # nvidia-smi on the HBM3e part
    ("NVIDIA B200", "b200"),  # CoreWeave's B200 node labels
    ("Tesla T4", "t4"),  # Colab
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("NVIDIA V100-SXM2-32GB", "v100-sxm2-32gb"),  # the same part, a driver that says NVIDIA
    ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
    ("NVIDIA A10G", "a10g"),  # AWS G5
    ("NVIDIA L4", "l4"),  # GCP G2
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("TPU v2", "tpu-v2"),
    ("TPU v3", "tpu-v3"),
    ("TPU v4", "tpu-v4"),
    ("TPU v5 lite", "tpu-v5e"),  # jax's test_util: v5e reports "v5 lite"
    ("TPU v5", "tpu-v5p"),  # ... and v5p a kind ending in "v5"
    ("TPU v5p", "tpu-v5p"),
    ("TPU v6 lite", "tpu-v6e"),
    # The traps: names that contain a known name and are another part.
    ("NVIDIA RTX A1000", None),  # contains "A100": a laptop/workstation Ampere, 8.6
    ("NVIDIA RTX A1000 6GB Laptop GPU", None),
    ("NVIDIA L40S", None),  # contains "L4"
    ("NVIDIA A10", None),  # the A10G's sibling with twice its tensor rate; inside "A100"
    ("NVIDIA H100 NVL", None),  # another H100 part, other figures
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a slice: a seventh of the chip
    ("TPU v4 lite", None),
    ("TPU7x", None),
    ("cpu", None),
]


@pytest.mark.parametrize("kind, name", KINDS)
def test_device_kinds_name_their_chip_by_whole_product_name(kind, name):
    chip = chip_for_kind(kind)
    assert (chip.name if chip else None) == name


def test_the_gh200_is_not_read_as_an_h200_nor_the_a1000_as_an_a100():
    gh200 = chip_for_kind("NVIDIA GH200 480GB")
    assert gh200.hbm_bytes == 96 * GiB and gh200.hbm_bandwidth == 4000 * G  # not the H200's 141
    assert local_peak_flops("bfloat16", FakeDevice("gpu", "NVIDIA H200"))[0] == 989 * T


# Typed from the datasheet each new entry cites (dense TFLOP/s by dtype, memory GB/s and
# GiB, interconnect GB/s or None) and NVIDIA's compute-capability table, not from the table.
FIGURES = {
    "t4": ({"float16": 65, "bfloat16": 8.1, "float32": 8.1}, 320, 16, None, "7.5"),
    "v100-sxm2-16gb": ({"float16": 125, "bfloat16": 15.7, "float32": 15.7}, 900, 16, 300, "7.0"),
    "v100-pcie-32gb": ({"float16": 112, "bfloat16": 14, "float32": 14}, 900, 32, None, "7.0"),
    "a10g": ({"bfloat16": 70, "tf32": 35, "float32": 35}, 600, 24, None, "8.6"),
    "l4": ({"bfloat16": 121, "tf32": 60, "float32": 30.3}, 300, 24, None, "8.9"),
    "rtx3090": ({"bfloat16": 71, "tf32": 35.6, "float32": 35.6}, 936, 24, 112.5, "8.6"),
    "rtx4090": ({"bfloat16": 165.2, "tf32": 82.6, "float32": 82.6}, 1008, 24, None, "8.9"),
    "a100-80gb-pcie": ({"bfloat16": 312, "tf32": 156, "float32": 19.5}, 1935, 80, 600, "8.0"),
    "gh200": ({"bfloat16": 989, "tf32": 494.5, "float32": 67}, 4000, 96, None, "9.0"),
    "gh200-144gb": ({"bfloat16": 989, "tf32": 494.5, "float32": 67}, 4900, 144, None, "9.0"),
    "b200": ({"bfloat16": 2250, "tf32": 1125, "float32": 75}, 8000, 180, 1800, "10.0"),
    "tpu-v3": ({"bfloat16": 123}, 900, 32, None, None),
    "tpu-v2": ({"bfloat16": 46}, 700, 16, None, None),
}


# NVIDIA's memory in its own unit: the "80GB" of an H100 is 80 GiB (nvidia-smi on one read
# 81,559 MiB, past 80e9 bytes: docs/h100-run-2/nvidia-smi.csv), as each datasheet's "GB" of
# memory is; written out here, not read from the table. A new NVIDIA row must join this list.
NVIDIA_HBM = {
    "t4": 16 * 2**30,
    "v100-sxm2-16gb": 16 * 2**30,
    "v100-sxm2-32gb": 32 * 2**30,
    "v100-pcie-16gb": 16 * 2**30,
    "v100-pcie-32gb": 32 * 2**30,
    "a100-40gb": 40 * 2**30,
    "a100-80gb": 80 * 2**30,
    "a100-80gb-pcie": 80 * 2**30,
    "h100-sxm": 80 * 2**30,  # 85,899,345,920 bytes
    "h100-pcie": 80 * 2**30,
    "h200": 141 * 2**30,
    "gh200": 96 * 2**30,
    "gh200-144gb": 144 * 2**30,
    "b200": 180 * 2**30,  # nvidia-smi: 183,359 MiB of 184,320
    "l4": 24 * 2**30,
    "a10g": 24 * 2**30,
    "rtx3090": 24 * 2**30,
    "rtx4090": 24 * 2**30,
}


def test_every_nvidia_row_holds_the_vendor_s_gib():
    rows = {name: chip.hbm_bytes for name, chip in CHIPS.items() if name == chip.name}
    gpus = {name: hbm for name, hbm in rows.items() if CHIPS[name].platform == "gpu"}
    assert gpus == NVIDIA_HBM


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_new_entries_carry_their_datasheet_figures(name):
    tflops, bandwidth, gib, link, cc = FIGURES[name]
    chip = CHIPS[name]
    assert {k: v / T for k, v in chip.flops.items()} == pytest.approx(tflops, rel=0.01)
    assert chip.hbm_bandwidth / G == pytest.approx(bandwidth, rel=0.01)
    assert chip.hbm_bytes == gib * GiB
    assert (chip.interconnect and chip.interconnect / G) == pytest.approx(link)
    assert chip.compute_capability == cc


def test_every_entry_cites_a_public_source_and_owns_its_names():
    for name, chip in CHIPS.items():
        assert chip.source.startswith("https://"), name
        assert chip.platform in ("gpu", "tpu") and chip.host_shape, name
        assert (chip.compute_capability is not None) == (chip.platform == "gpu"), name
        for kind in chip.kinds:  # no name claimed by two entries: the first would win
            assert chip_for_kind(kind) is chip, (name, kind)


def test_pre_ampere_gpus_take_fp16_on_their_tensor_cores_and_nothing_else():
    """T4 and V100: bf16 and float32 matmuls both run on the CUDA cores (no bf16
    tensor cores, no TF32), so both peaks are the float32 rate; fp16 is the fast one."""
    for name, fp16, fp32 in (("t4", 65 * T, 8.1 * T), ("v100-sxm2-16gb", 125 * T, 15.7 * T)):
        chip = CHIPS[name]
        assert chip.peak("bfloat16") == chip.peak("float32") == fp32, name
        assert chip.peak("float32", precision="highest") == fp32
        assert chip.peak("float16") == fp16
    a100 = CHIPS["a100-80gb"]  # from Ampere on: TF32 under default precision, fp16 = bf16
    assert (a100.peak("float32"), a100.peak("float16")) == (156 * T, 312 * T)


def test_a_tpu_v3_device_is_one_tensorcore_half_a_chip():
    v3 = FakeDevice("tpu", "TPU v3")
    peak = (61.5 * T, "tpu-v3 datasheet, one of its 2 TensorCores")
    assert local_peak_flops("bfloat16", v3) == peak
    chip = datasheet_chip(v3)
    assert (chip.hbm_bytes, chip.hbm_bandwidth) == (16 * GiB, 450 * G)
    assert datasheet_chip(FakeDevice("tpu", "TPU v5 lite")) is CHIPS["tpu-v5e"]


def test_an_unknown_accelerator_is_measured_and_says_so(monkeypatch):
    monkeypatch.setattr(calibrate, "measured", lambda dtype: {"matmul_flops": 5 * T})
    a1000 = FakeDevice("gpu", "NVIDIA RTX A1000 6GB Laptop GPU", "8.6")
    peak, source = local_peak_flops("bfloat16", a1000)
    assert peak == 5 * T
    assert source.startswith("unknown chip 'NVIDIA RTX A1000 6GB Laptop GPU': not in the table")
    assert source.endswith("so measured: bfloat16 matmul on this gpu")

    def no_measuring(dtype):
        raise AssertionError("a chip in the table is never measured")

    monkeypatch.setattr(calibrate, "measured", no_measuring)
    assert local_peak_flops("bfloat16", FakeDevice("gpu", "Tesla T4", "7.5")) == (
        8.1 * T,
        "t4 datasheet",
    )


def test_this_machine_s_roofs_per_device(monkeypatch):
    """local_roofs: a table chip's datasheet (one TensorCore's share of a TPU v3),
    whichever stream is asked for; a CPU's measured figures, the copy or the
    read-only stream, shared by simulated devices; measured=True measures a table
    chip too."""
    figures = {"matmul_flops": 8 * T, "copy_bandwidth": 40 * G}
    monkeypatch.setattr(calibrate, "measured", lambda dtype: figures)
    monkeypatch.setattr(calibrate, "read_bandwidth", lambda: 80 * G)
    v3 = FakeDevice("tpu", "TPU v3")
    for stream in ("copy", "read"):
        roofs = local_roofs("bfloat16", stream=stream, device=v3)
        assert (roofs.peak_flops, roofs.bandwidth) == (61.5 * T, 450 * G)
        assert roofs.bandwidth_source == "tpu-v3 datasheet" and roofs.datasheet.name == "tpu-v3/2"
    measured = local_roofs("bfloat16", measured=True, device=v3)
    assert (measured.peak_flops, measured.bandwidth) == (8 * T, 40 * G)
    assert measured.datasheet.name == "tpu-v3/2"  # still named, beside the measurement
    cpu = FakeDevice("cpu", "cpu")
    copy = local_roofs("float32", devices=4, device=cpu)
    assert (copy.peak_flops, copy.bandwidth, copy.share) == (2 * T, 10 * G, 4)
    assert copy.datasheet is None and copy.bandwidth_source.startswith("measured copy")
    read = local_roofs("float32", stream="read", devices=1, device=cpu)
    assert (read.bandwidth, read.bandwidth_source) == (
        80 * G,
        "measured read-only stream on this cpu",
    )
    assert local_peak_flops("float32", cpu, devices=4) == (2 * T, copy.peak_source)
    with pytest.raises(ValueError, match="stream"):
        local_roofs(stream="write")


PRE_AMPERE = "cuDNN flash attention and bf16 matmuls need 8.0+"


@pytest.mark.parametrize("kind, cc", [("Tesla T4", "7.5"), ("Tesla V100-SXM2-16GB", "7.0")])
def test_below_compute_capability_8_runs_default_to_float32_and_xla_attention(kind, cc):
    gpu = FakeDevice("gpu", kind, cc)
    assert capability_defaults(gpu) == Defaults(
        "float32",
        "fused",
        f"{kind} is compute capability {cc}: {PRE_AMPERE}; float32 and XLA's attention",
    )
    einsum = capability_defaults(gpu, "float32", "einsum")
    assert (einsum.dtype, einsum.attention_impl) == ("float32", "einsum")
    assert einsum.note.endswith("float32 and einsum attention")
    bf16 = capability_defaults(gpu, "bfloat16")  # honoured, with the reason it is slow
    assert (bf16.dtype, bf16.attention_impl) == ("bfloat16", "fused")
    assert "no bf16 tensor cores, so XLA computes the bfloat16 matmuls in float32" in bf16.note
    with pytest.raises(UsageError, match=f"cudnn: {kind} is compute capability {cc}; .* 8.0"):
        capability_defaults(gpu, "bfloat16", "cudnn")


def test_a_run_on_a_t4_takes_the_chip_s_preset_and_corpus_and_the_capability_s_choices():
    """The whole decision for a run on the GPU itself (s2_train.py there): preset and
    corpus by platform, dtype and attention by compute capability, the note for the header."""
    t4 = FakeDevice("gpu", "Tesla T4", "7.5")
    run = configs_for("gpu", t4)
    assert (run.preset, run.data) == ("course", "stdlib")
    assert (run.model.dtype, run.model.attention_impl) == ("float32", "fused")
    assert run.attention_note == f"Tesla T4 is compute capability 7.5: {PRE_AMPERE}; " + (
        "float32 and XLA's attention"
    )
    asked = configs_for("gpu", t4, preset="tiny", dtype="bfloat16", data="docs")
    assert (asked.preset, asked.data, asked.model.dtype) == ("tiny", "docs", "bfloat16")
    assert asked.model.attention_impl == "fused" and "no bf16 tensor cores" in asked.attention_note


@pytest.mark.parametrize(
    "device",
    [
        FakeDevice("gpu", "NVIDIA A100-SXM4-40GB", "8.0"),  # Ampere itself
        FakeDevice("gpu", "NVIDIA L4", "8.9"),
        FakeDevice("gpu", "NVIDIA B200", "10.0"),  # "10.0" < "8.0" as text: compared as numbers
        FakeDevice("gpu", "NVIDIA GeForce RTX 5090", "12.0"),
        FakeDevice("gpu", "AMD Instinct MI250X", "gfx90a"),  # ROCm's is no number
        FakeDevice("tpu", "TPU v5 lite"),  # no compute_capability attribute
        FakeDevice("cpu", "cpu"),
        None,  # --target: a chip this machine lacks
    ],
)
def test_ampere_and_later_and_other_platforms_keep_the_usual_defaults(device):
    assert capability_defaults(device) == Defaults(None, None, None)
    assert capability_defaults(device, "bfloat16", "cudnn") == Defaults("bfloat16", None, None)


MACHINES = {  # the files of a machine's root, and what is on it
    "nothing": ({}, [], None),
    "an NVIDIA GPU's node": ({"dev/nvidia0": ""}, [], ("nvidia", "/dev/nvidia0")),
    "the driver's GPU list": (
        {},
        ["proc/driver/nvidia/gpus/0000:00:04.0"],
        ("nvidia", "/proc/driver/nvidia/gpus/0000:00:04.0"),
    ),
    "the driver alone (a container with no GPU)": (
        {"dev/nvidiactl": ""},
        ["proc/driver/nvidia"],
        None,
    ),
    "a TPU v5e's PCI function": (
        {
            "sys/bus/pci/devices/0000:00:05.0/vendor": "0x1ae0\n",
            "sys/bus/pci/devices/0000:00:05.0/device": "0x0063\n",
        },
        [],
        ("tpu", "/sys/bus/pci/devices/0000:00:05.0"),
    ),
    "Google's virtual NIC (every GCE VM)": (
        {
            "sys/bus/pci/devices/0000:00:04.0/vendor": "0x1ae0\n",
            "sys/bus/pci/devices/0000:00:04.0/device": "0x0042\n",
        },
        [],
        None,
    ),
    "a TPU v4 VM's accel node": ({"dev/accel0": ""}, [], ("tpu", "/dev/accel0")),
    "an Intel NPU's accel node": ({"dev/accel/accel0": ""}, [], None),
}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_an_accelerator_jax_cannot_see_stops_the_run_unless_the_cpu_is_asked_for(
    machine, tmp_path, monkeypatch
):
    files, dirs, found = MACHINES[machine]
    root = fake_root(tmp_path, files, dirs)
    assert accelerator.unseen_accelerator(root) == found
    monkeypatch.setattr(accelerator, "_installed", lambda module: False)
    if found is None:
        check_accelerator_visible(root, backend="cpu", environ={})
        return
    extra = {"nvidia": "requirements-gpu.txt", "tpu": "requirements-tpu.txt"}[found[0]]
    with pytest.raises(UsageError) as e:
        check_accelerator_visible(root, backend="cpu", environ={})
    message = str(e.value)
    assert f"({found[1]}) but JAX sees only the CPU: " in message and "\n" not in message
    assert f"pip install -r requirements.txt -r {extra}, or set JAX_PLATFORMS=cpu" in message
    check_accelerator_visible(root, backend="cpu", environ={"JAX_PLATFORMS": "cpu"})  # opt-in
    check_accelerator_visible(root, backend="gpu" if found[0] == "nvidia" else "tpu", environ={})


def test_the_scripts_turn_the_stop_into_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    root = fake_root(tmp_path, {"dev/nvidia0": ""})
    cuda_plugin = "jax_plugins.xla_cuda12"
    monkeypatch.setattr(accelerator, "_installed", lambda module: module == cuda_plugin)
    status = run_main(lambda argv: check_accelerator_visible(root, backend="cpu", environ={}))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert err.startswith(
        "error: this machine has an NVIDIA GPU (/dev/nvidia0) but JAX sees only "
        "the CPU (its jax plugin is installed but did not start"
    )


def test_an_impossible_mfu_is_flagged_never_printed_as_a_result():
    history = [{"step": 10, "loss": 2.0}]
    args = {
        "train_seconds": 1.0,
        "tokens_per_step": 1024,
        "peak": (1e10, "t4 datasheet"),
        "n_devices": 1,
        "unigram": 3.3,
        "first_step": 9,
    }  # one step in one second
    s = summarize(history, flops_per_step=1.31e10, **args)  # 1.31e10 FLOP/s on a 1e10 peak
    s = json.loads(json.dumps(s))  # what --summary-out writes
    assert s["mfu"] == pytest.approx(1.31) and s["mfu_exceeds_peak"] is True
    text = "\n".join(summary_lines(s))
    assert (
        "  MFU         n/a: 131% of the assumed 0.010 TFLOP/s per device is impossible, "
        "so the peak (t4 datasheet) is wrong for this chip"
    ) in text
    assert "131.0%" not in text
    fine = summarize(history, flops_per_step=1e9, **args)  # 10%: a result
    assert fine["mfu_exceeds_peak"] is False and "MFU         10.0% of" in "\n".join(
        summary_lines(fine)
    )
    assert summarize(history, flops_per_step=1e10, **args)["mfu_exceeds_peak"] is False  # 100%

    record = make_record(10, 2.0, 0.1, 1024, 1.31e9, 1e10, 1)  # each log line likewise
    assert record["mfu"] == pytest.approx(1.31) and record["mfu_exceeds_peak"] is True
    assert format_record(record).endswith("| MFU n/a (131% of a wrong peak)")
    assert "MFU  30.0%" in format_record(make_record(10, 2.0, 0.1, 1024, 3e8, 1e10, 1))


def test_a_calibration_never_passes_for_the_step_s_memory(monkeypatch):
    """The allocator's peak is the process's: a calibration (2.9 GiB here) leaves its
    own in it for good. The plan is the step's; the peak is reported beside it, as
    what it is, and alone only once the step has gone past what calibration left."""
    monkeypatch.setattr(memory, "_raised_outside_the_step", {})
    gpu = FakeDevice("gpu", "NVIDIA RTX A1000", "8.6", peak=100 * MiB)
    step = FakeCompiled(arguments=30 * MiB, outputs=20 * MiB, temps=5 * MiB, aliased=15 * MiB)
    with memory.outside_the_step(gpu):
        gpu.peak = 3 * GiB  # the matmul operands and the copy, freed since
    assert memory.step_memory(step, gpu) == (40 * MiB, "XLA's memory plan of the compiled step")
    assert memory.step_memory(None, gpu) == (
        None,
        (
            "not known: the allocator peak over the process, set by calibration (2,972.0 MiB above "
            "what came before), and there is no compiled step to plan"
        ),
    )
    allocator = memory.allocator_peak(gpu)
    s = summarize(
        [{"step": 1, "loss": 2.0}],
        train_seconds=1.0,
        tokens_per_step=1,
        flops_per_step=1,
        peak=(1e10, "measured"),
        n_devices=1,
        unigram=3.3,
        first_step=0,
        memory=memory.step_memory(step, gpu),
        allocator=allocator,
    )
    lines = summary_lines(s)
    assert "  memory      40.0 MiB per device (XLA's memory plan of the compiled step)" in lines
    assert (
        "  allocator   3,072.0 MiB per device (allocator peak over the process, set by "
        "calibration (2,972.0 MiB above what came before))"
    ) in lines
    gpu.peak = 4 * GiB  # the step itself went higher: now the peak is the run's own
    assert memory.step_memory(None, gpu) == (4 * GiB, "allocator peak over the process")


def test_calibration_runs_outside_the_step(monkeypatch):
    """calibrate.measure does its allocating inside memory.outside_the_step."""
    inside = []

    class Watch:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            inside.append(self.device)

        def __exit__(self, *exc):
            inside.append("exit")

    monkeypatch.setattr(calibrate, "outside_the_step", Watch)
    monkeypatch.setattr(calibrate, "best_time", lambda fn, *args: inside.append("timed") or 1.0)
    calibrate.measure("float32", n=16)
    assert inside[0].platform == "cpu" and inside[1:] == ["timed", "timed", "exit"]


def test_processes_sharing_the_calibration_measure_one_at_a_time(monkeypatch, tmp_path):
    """Three callers at once, as a pod's hosts on one machine or pytest's workers
    (threads here: each opens the lock file itself, as a process would). The
    second waits for the first: it never measures while the first loads the
    cores, and it keeps what the first wrote. The third, asking for the first's
    figure, reads it instead of measuring it again."""
    monkeypatch.setattr(calibrate, "CACHE", str(tmp_path / "calibration.json"))
    first_measures, second_measures = threading.Event(), threading.Event()
    seen = []

    def first():
        first_measures.set()
        if second_measures.wait(timeout=0.5):  # never set meanwhile, if one at a time
            seen.append("the second measured during the first")
        return {"flops": 1.0}

    def second():
        second_measures.set()
        return {"flops": 2.0}

    def again():
        seen.append("the first's figure measured twice")
        return {"flops": 3.0}

    def ask(key, measure):
        first_measures.wait(timeout=5)
        return calibrate._cached_best(key, measure, refresh=False)

    callers = [
        threading.Thread(target=calibrate._cached_best, args=("one", first, False)),
        threading.Thread(target=ask, args=("two", second)),
        threading.Thread(target=ask, args=("one", again)),
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=10)
    assert seen == []
    with open(calibrate.CACHE) as f:
        assert json.load(f) == {"one": {"flops": 1.0}, "two": {"flops": 2.0}}


def test_a_tpu_v3_trace_read_elsewhere_is_held_against_one_core():
    """A TPU v3 chip is two jax devices (two TensorCores), and a trace's devices
    are jax's: roofline.json's chip gives each device half of the chip's 123
    TFLOP/s and 900 GB/s (cloud.google.com/tpu/docs/v3), on any reader."""
    from roofline.measured.record import roofs_for

    recorded = {
        "platform": "tpu",
        "device_kind": "TPU v3",
        "devices": 8,
        "dtype": "bfloat16",
        "datasheet": "tpu-v3/2",
        "host": "a-tpu-vm",
        "measured_peak": None,
    }
    roofs = roofs_for(recorded, "bfloat16", 8)
    assert roofs.datasheet.peak("bfloat16") == 123e12 / 2
    assert roofs.datasheet.hbm_bandwidth == 900e9 / 2

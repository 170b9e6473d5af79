"""The chip table, and the local device against it: peak dense FLOP/s per dtype, memory
bandwidth and size, interconnect bandwidth and the names the runtimes give each chip,
every entry with its public source (the TPUs in roofline/tpus.py, the NVIDIA GPUs in
roofline/gpus.py; `python -m roofline chips` prints them); which entry this device is,
and the peak FLOP/s a run divides by to get MFU.

A device is matched by whole product name (chip_for_kind): the strings jax reports as
`device.device_kind`. On NVIDIA that is the CUDA device name; on a TPU, libtpu's own.

A CPU has no datasheet figure worth trusting for this (turbo clocks, AVX
frequency drops, shared cores), so its figures are always measured
(roofline/calibrate.py); so are those of an accelerator the table lacks.
"""

import os

import jax

from roofline import calibrate
from roofline.chip import Chip, Roofs
from roofline.gpus import GPUS
from roofline.tpus import TPUS
from roofline.units import capacity

__all__ = [
    "CHIPS",
    "Chip",
    "Roofs",
    "chip_for_kind",
    "chips_lines",
    "datasheet_chip",
    "find_chip",
    "local_memory_chip",
    "local_peak_flops",
    "local_roofs",
    "measured_chip",
    "product_name",
]

CHIPS = {chip.name: chip for chip in [*TPUS, *GPUS]}
# "h100" alone means the SXM part, the one in most clusters; "a100" the 80 GB one;
# "v100" the 16 GB SXM2 (AWS p3's).
CHIPS["h100"] = CHIPS["h100-sxm"]
CHIPS["a100"] = CHIPS["a100-80gb"]
CHIPS["v100"] = CHIPS["v100-sxm2-16gb"]

# Words a driver may or may not print before the product: jax on one A100 reported
# "A100-SXM4-40GB" in 2022 and "NVIDIA A100-SXM4-40GB" with a later driver (both in
# github.com/jax-ml/jax/issues/11705); pre-Ampere data-center parts say "Tesla" ("Tesla T4").
VENDOR_WORDS = ("nvidia", "tesla")


def product_name(device_kind):
    """device_kind with case and spacing folded and the vendor word in front dropped:
    'NVIDIA A100-SXM4-40GB' -> 'a100-sxm4-40gb'."""
    words = device_kind.casefold().split()
    while words and words[0] in VENDOR_WORDS:
        words = words[1:]
    return " ".join(words)


def chip_for_kind(device_kind):
    """jax's device_kind string (e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5 lite') -> Chip or None.

    By whole product name, never a part of one: 'NVIDIA GH200 480GB' contains 'H200'
    and 'NVIDIA RTX A1000' contains 'A100', and neither is that chip. A name the table
    lacks is None, so its peak is measured; that includes a MIG slice of a known GPU
    ('NVIDIA A100-SXM4-40GB MIG 1g.5gb'), which has a fraction of the chip's units."""
    name = product_name(device_kind)
    for chip in CHIPS.values():
        if any(product_name(kind) == name for kind in chip.kinds):
            return chip
    return None


def find_chip(name):
    """A chip of the table by name ('h100', 'tpu-v5e', ...); KeyError names the known ones."""
    chip = CHIPS.get(name.lower())
    if chip is None:
        raise KeyError(f"unknown chip '{name}' (known: {', '.join(sorted(CHIPS))}, local)")
    return chip


def measured_chip(dtype="float32"):
    """The first local device, whole, as a Chip whose figures are measured, not
    read off a datasheet (local_roofs(measured=True)): the ceilings this machine
    actually reaches, for predictions that take a Chip."""
    roofs = local_roofs(dtype, measured=True, devices=1)
    device = jax.local_devices()[0]
    return Chip(
        f"{device.platform} ({device.device_kind}, measured)",
        {dtype: roofs.peak_flops},
        roofs.bandwidth,
        0,
        None,
        f"measured on this machine by roofline/calibrate.py ({dtype} matmul, copy)",
    )


def local_memory_chip():
    """This machine's first device, for the memory napkin: the table's entry for an
    accelerator it knows, else a chip whose memory is this machine's RAM (where a CPU's
    arrays live) and whose peak is not known."""
    chip = datasheet_chip()
    if chip is not None:
        return chip
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Chip("local-cpu", {}, 0, ram, None, "this machine's RAM: os.sysconf's physical pages")


def datasheet_chip(device=None):
    """The table's entry for a local device (the first by default), or None (a CPU, an
    unknown chip). Its figures are that one device's share: a TPU v3 chip is two jax
    devices, so each gets half (Chip.per_device)."""
    device = device or jax.local_devices()[0]
    chip = chip_for_kind(device.device_kind) if device.platform != "cpu" else None
    return chip.per_device() if chip else None


def local_roofs(
    dtype="float32", *, stream="copy", measured=False, devices=None, fresh=False, device=None
):
    """This machine's roofs per jax device: peak FLOP/s of matmuls in dtype and
    memory bandwidth, each with where it comes from (a roofline.chip.Roofs).

    A device the chip table knows: its datasheet (a TPU v3's TensorCore gets half
    the chip). A CPU, or an accelerator the table lacks: measured on the first
    device (roofline/calibrate.py, cached once per machine; fresh=True measures
    now, under the caller's own load). measured=True measures even where there is
    a datasheet: the ceiling the device really reaches, beside the datasheet's.

    stream says which bandwidth is measured: "copy", a read and a write of every
    byte (a training step's bound: it writes what it reads), or "read", a
    read-only stream (decode's: it reads weights and cache, writes hardly
    anything). A datasheet has one figure for both.

    Simulated CPU devices (--xla_force_host_platform_device_count) share one
    host, so each gets 1/devices of the measured figures (devices: default, the
    local device count; `share` says by how many).

    Callers: training's MFU and the roofline table (local_roofs(cfg.dtype));
    decode's roofline (local_roofs(cfg.dtype, stream="read"), times the mesh's
    device count for the whole mesh); a decode benchmark timing one device
    (local_roofs("float32", stream="read", devices=1, fresh=True))."""
    if stream not in ("copy", "read"):
        raise ValueError(f"stream is 'copy' or 'read', not {stream!r}")
    device = device or jax.local_devices()[0]
    chip = datasheet_chip(device)
    share = (devices or jax.local_device_count()) if device.platform == "cpu" else 1
    peak, peak_source = local_peak_flops(
        dtype, device, devices=devices, measured=measured, fresh=fresh
    )
    if chip is not None and not measured:
        bandwidth, source = (
            chip.hbm_bandwidth,
            f"{chip_for_kind(device.device_kind).name} datasheet",
        )
    elif stream == "copy":
        figures = calibrate.measure(dtype) if fresh else calibrate.measured(dtype)
        bandwidth, source = figures["copy_bandwidth"] / share, "copy (read + write)"
    else:
        read = calibrate.measure_read_bandwidth if fresh else calibrate.read_bandwidth
        bandwidth, source = read() / share, "read-only stream"
    if chip is None or measured:
        shared = f", shared by {share} simulated devices" if share > 1 else ""
        source = f"measured {source} on this {device.platform}{shared}"
    cache = None
    if device.platform == "cpu":
        cache_bandwidth, cache_bytes = calibrate.cache_roof()
        cache = (cache_bandwidth / share, cache_bytes / share) if cache_bandwidth else None
    measured = measured or chip is None
    return Roofs(
        "measured on this machine"
        if measured
        else f"{chip_for_kind(device.device_kind).name} datasheet",
        peak,
        peak_source,
        bandwidth,
        source,
        measured=measured,
        datasheet=chip,
        cache=cache,
        share=share,
    )


def local_peak_flops(dtype="float32", device=None, *, devices=None, measured=False, fresh=False):
    """(peak FLOP/s of one local device for matmuls in dtype, where the figure comes from):
    the peak of `local_roofs` (arguments as there), what a training log divides by for MFU.

    An accelerator with a table entry: the datasheet. A CPU, or an accelerator the
    table lacks (the source then says so, for the run's header): measured with a
    matmul (roofline/calibrate.py)."""
    device = device or jax.local_devices()[0]
    chip = chip_for_kind(device.device_kind) if device.platform != "cpu" else None
    if chip is not None and not measured:
        n = chip.devices_per_chip
        share = f", one of its {n} TensorCores" if n > 1 else ""
        return chip.peak(dtype) / n, f"{chip.name} datasheet{share}"
    flops = (calibrate.measure if fresh else calibrate.measured)(dtype)["matmul_flops"]
    if device.platform != "cpu":
        if chip is not None:
            return flops, f"measured {dtype} matmul on this {device.platform}"
        return flops, (
            f"unknown chip '{device.device_kind}': not in the table (python -m "
            f"roofline chips), so measured: {dtype} matmul on this {device.platform}"
        )
    n = devices or jax.local_device_count()
    share = f", shared by {n} simulated devices" if n > 1 else ""
    return flops / n, f"measured {dtype} matmul on this cpu{share}"


def chips_lines():
    """The table as `python -m roofline chips` prints it, and this machine's measured line."""

    def tflops(chip, dtype):
        return f"{chip.flops[dtype] / 1e12:,.1f}" if dtype in chip.flops else "-"

    row = "{:<15}{:>7}{:>8}{:>7}{:>10}{:>10}{:>9}{:>8}{:>7}{:>6}  {}".format
    lines = [
        "peak dense TFLOP/s per chip, memory, interconnect (bidirectional, per chip); "
        + "ridge = bf16 peak / HBM bandwidth; host = one host's worth, the default "
        + "of s2_train.py --target CHIP[:SHAPE]; cc = NVIDIA compute capability",
        row(
            "chip",
            "bf16",
            "tf32",
            "fp32",
            "HBM GB/s",
            "HBM",
            "ICI GB/s",
            "ridge",
            "host",
            "cc",
            "source",
        ),
    ]
    for name, chip in CHIPS.items():
        if name != chip.name:
            lines.append(f"{name:<15}the same as {chip.name}")
            continue
        link = f"{chip.interconnect / 1e9:,.0f}" if chip.interconnect else "-"
        lines.append(
            row(
                name,
                tflops(chip, "bfloat16"),
                tflops(chip, "tf32"),
                tflops(chip, "float32"),
                f"{chip.hbm_bandwidth / 1e9:,.0f}",
                capacity(chip.hbm_bytes, decimal=False),
                link,
                f"{chip.ridge('bfloat16'):,.0f}",
                chip.host_shape or "-",
                chip.compute_capability or "-",
                chip.source,
            )
        )
    fp16 = [
        f"{n} {c.flops['float16'] / 1e12:,.0f}"
        for n, c in CHIPS.items()
        if n == c.name and "float16" in c.flops
    ]
    lines.append(
        "below cc 8.0, no bf16 or tf32 tensor cores: bf16 matmuls run at the fp32 "
        f"rate; fp16 tensor TFLOP/s: {', '.join(fp16)}"
    )
    local = calibrate.cached("float32")
    if local:
        lines.append(
            f"local          {local['matmul_flops'] / 1e12:.3f} TFLOP/s float32 matmul, "
            f"{local['copy_bandwidth'] / 1e9:,.1f} GB/s copy: measured, cached in "
            f"{calibrate.CACHE}"
        )
    else:
        lines.append("local          not measured yet: python -m roofline calibrate")
    return lines

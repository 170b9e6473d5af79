"""The chip table: peak dense FLOP/s per dtype, memory bandwidth and size,
interconnect bandwidth, and the names the runtimes give each chip; every
entry names its public source. The TPUs are in roofline/tpus.py, the NVIDIA
GPUs in roofline/gpus.py; `python -m roofline chips` prints them.

Matched to a device by `roofline.hardware.chip_for_kind`, by whole product
name (`kinds`): the strings jax reports as `device.device_kind`. On NVIDIA
that is the CUDA device name; on a TPU, libtpu's own.
"""

from roofline import calibrate
from roofline.gpus import GPUS
from roofline.tpus import TPUS

CHIPS = {chip.name: chip for chip in [*TPUS, *GPUS]}
# "h100" alone means the SXM part, the one in most clusters; "a100" the 80 GB one;
# "v100" the 16 GB SXM2 (AWS p3's).
CHIPS["h100"] = CHIPS["h100-sxm"]
CHIPS["a100"] = CHIPS["a100-80gb"]
CHIPS["v100"] = CHIPS["v100-sxm2-16gb"]


def chips_lines():
    """The table as `python -m roofline chips` prints it, and this machine's measured line."""

    def tflops(chip, dtype):
        return f"{chip.flops[dtype] / 1e12:,.1f}" if dtype in chip.flops else "-"

    row = "{:<15}{:>7}{:>8}{:>7}{:>10}{:>8}{:>9}{:>8}{:>7}{:>6}  {}".format
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
            "HBM GB",
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
                f"{chip.hbm_bytes / 1e9:,.0f}",
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

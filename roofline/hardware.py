"""The chips: peak dense FLOP/s per dtype, memory bandwidth and size,
interconnect bandwidth. Per chip, dense (never the 2:4-sparsity figure that
NVIDIA prints beside it), each with its public source.

A CPU has no datasheet figure worth trusting for this (turbo clocks, AVX
frequency drops, shared cores), so its figures are always measured
(roofline/calibrate.py).
"""

import dataclasses

import jax

T = 1e12
G = 1e9
GiB = 2**30

A100_DATASHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    flops: dict  # dtype name -> peak dense FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    interconnect: float | None  # bytes/s per chip, bidirectional (ICI or NVLink)
    source: str
    kinds: tuple = ()  # substrings of jax's device_kind that identify the chip
    platform: str = "cpu"  # "tpu" or "gpu": which compiler builds programs for it
    host_shape: str | None = None  # one host's worth: a TPU topology ("2x4") or a GPU count

    def peak(self, dtype, precision="default"):
        """Peak FLOP/s for matmuls in dtype, at the precision the matmuls really run.

        Under JAX's default matmul precision a float32 matmul is not a float32
        matmul on an accelerator: a TPU runs it as bf16 passes (its bf16 peak is
        the ceiling), and an NVIDIA GPU from Ampere on runs it on the tensor
        cores as TF32 (JAX docs, "Matmul precision"; jax.default_matmul_precision).
        precision="highest" asks for true float32: on NVIDIA, the CUDA cores' peak."""
        if dtype == "float32" and precision not in ("highest", "float32"):
            dtype = "tf32" if "tf32" in self.flops else dtype
        return self.flops.get(dtype) or self.flops["bfloat16"]

    def ridge(self, dtype):
        """The ridge point, FLOPs per byte: a kernel doing fewer FLOPs per byte it
        moves than this waits on memory; more, and it waits on the arithmetic
        units (Williams, Waterman and Patterson 2009, "Roofline: an insightful
        visual performance model for multicore architectures", CACM 52(4))."""
        return self.peak(dtype) / self.hbm_bandwidth


CHIPS = {
    chip.name: chip
    for chip in [
        # https://cloud.google.com/tpu/docs/v4 : 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s.
        # ICI: not given per chip on that page.
        Chip("tpu-v4", {"bfloat16": 275 * T}, 1200 * G, 32 * GiB, None,
             "https://cloud.google.com/tpu/docs/v4", ("TPU v4",), "tpu", "2x2x1"),
        # https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, 16 GB at 819 GB/s, ICI 400 GB/s.
        Chip("tpu-v5e", {"bfloat16": 197 * T}, 819 * G, 16 * G, 400 * G,
             "https://cloud.google.com/tpu/docs/v5e", ("TPU v5 lite", "TPU v5e"), "tpu", "2x4"),
        # https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, 95 GiB at 2765 GB/s, ICI 1200 GB/s.
        Chip("tpu-v5p", {"bfloat16": 459 * T}, 2765 * G, 95 * GiB, 1200 * G,
             "https://cloud.google.com/tpu/docs/v5p", ("TPU v5p", "TPU v5"), "tpu", "2x2x1"),
        # https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, 32 GB at 1638 GB/s, ICI 800 GB/s.
        Chip("tpu-v6e", {"bfloat16": 918 * T}, 1638 * G, 32 * G, 800 * G,
             "https://cloud.google.com/tpu/docs/v6e", ("TPU v6 lite", "TPU v6e"), "tpu", "2x4"),
        # NVIDIA A100 datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
        # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): bf16 312, tf32 156, fp32 19.5
        # TFLOP/s dense; 40 GB at 1555 GB/s; 80 GB SXM at 2039 GB/s; NVLink 600 GB/s.
        Chip("a100-40gb", {"bfloat16": 312 * T, "tf32": 156 * T, "float32": 19.5 * T},
             1555 * G, 40 * G, 600 * G, A100_DATASHEET, ("A100-SXM4-40GB", "A100-PCIE-40GB"), "gpu", "8"),
        Chip("a100-80gb", {"bfloat16": 312 * T, "tf32": 156 * T, "float32": 19.5 * T},
             2039 * G, 80 * G, 600 * G, A100_DATASHEET, ("A100",), "gpu", "8"),
        # NVIDIA H100 datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet):
        # SXM: bf16 989, tf32 494.5, fp32 67 TFLOP/s dense; 80 GB at 3.35 TB/s; NVLink 900 GB/s.
        Chip("h100-sxm", {"bfloat16": 989 * T, "tf32": 494.5 * T, "float32": 67 * T},
             3350 * G, 80 * G, 900 * G, H100_DATASHEET, ("H100 80GB HBM3", "H100 SXM"), "gpu", "8"),
        # PCIe: bf16 756, tf32 378, fp32 51 TFLOP/s dense; 80 GB at 2.0 TB/s; NVLink bridge 600 GB/s.
        Chip("h100-pcie", {"bfloat16": 756 * T, "tf32": 378 * T, "float32": 51 * T},
             2000 * G, 80 * G, 600 * G, H100_DATASHEET, ("H100 PCIe",), "gpu", "8"),
        # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): the H100 SXM's compute,
        # 141 GB of HBM3e at 4.8 TB/s, NVLink 900 GB/s.
        Chip("h200", {"bfloat16": 989 * T, "tf32": 494.5 * T, "float32": 67 * T},
             4800 * G, 141 * G, 900 * G, "https://www.nvidia.com/en-us/data-center/h200/", ("H200",), "gpu", "8"),
    ]
}
# "h100" alone means the SXM part, the one in most clusters; "a100" the 80 GB one.
CHIPS["h100"] = CHIPS["h100-sxm"]
CHIPS["a100"] = CHIPS["a100-80gb"]


def chip_for_kind(device_kind):
    """jax's device_kind string (e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5 lite') -> Chip or None."""
    for chip in CHIPS.values():
        if any(k.lower() in device_kind.lower() for k in chip.kinds):
            return chip
    return None


def find_chip(name):
    """A chip of the table by name ('h100', 'tpu-v5e', ...); KeyError names the known ones."""
    chip = CHIPS.get(name.lower())
    if chip is None:
        raise KeyError(f"unknown chip '{name}' (known: {', '.join(sorted(CHIPS))}, local)")
    return chip


def measured_chip(dtype="float32"):
    """The first local device as a Chip whose figures are measured, not read off a
    datasheet: the matmul FLOP/s and copy bandwidth of roofline/calibrate.py
    (measured once per machine and cached). These are the ceilings this
    machine actually reaches."""
    from roofline.calibrate import measured

    device = jax.local_devices()[0]
    m = measured(dtype)
    return Chip(f"{device.platform} ({device.device_kind}, measured)", {dtype: m["matmul_flops"]},
                m["copy_bandwidth"], 0, None,
                f"measured on this machine by roofline/calibrate.py ({dtype} matmul, copy)")


def datasheet_chip():
    """The table's entry for the first local device, or None (a CPU, an unknown chip)."""
    device = jax.local_devices()[0]
    return chip_for_kind(device.device_kind) if device.platform != "cpu" else None


def local_peak_flops(dtype="float32"):
    """(peak FLOP/s of one local device for matmuls in dtype, where the figure comes from).

    An accelerator with a table entry: the datasheet. A CPU, or anything
    unknown: measured with a matmul, once, and cached (roofline/calibrate.py).
    Simulated CPU devices share the host's cores, so each gets its share."""
    device = jax.local_devices()[0]
    chip = datasheet_chip()
    if chip is not None:
        return chip.peak(dtype), f"{chip.name} datasheet"
    from roofline.calibrate import measured

    flops = measured(dtype)["matmul_flops"]
    n = jax.local_device_count() if device.platform == "cpu" else 1
    share = f", shared by {n} simulated devices" if n > 1 else ""
    return flops / n, f"measured {dtype} matmul on this {device.platform}{share}"

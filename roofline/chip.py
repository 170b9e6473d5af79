"""What a chip is, to the roofline: peak dense FLOP/s per dtype (at the
precision matmuls really run), memory bandwidth and size, interconnect, and
the ridge point between them (Chip); and the ceilings one device of it is
held against, each figure with its source (Roofs): read off the chip's
datasheet (chip_roofs), or measured on it (roofline/hardware.py's
local_roofs, roofline/measured/record.py's roofs_for). The table of real
chips is roofline/hardware.py.
"""

import dataclasses

# The units the chip table (roofline/tpus.py, roofline/gpus.py) writes its figures in.
TFLOPS, GB, GIB = 1e12, 1e9, 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    flops: dict  # dtype name -> peak dense FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    interconnect: float | None  # bytes/s per chip, bidirectional (ICI or NVLink)
    source: str
    kinds: tuple = ()  # jax's device_kind strings (whole product names) for this chip
    platform: str = "cpu"  # "tpu" or "gpu": which compiler builds programs for it
    host_shape: str | None = None  # one host's worth: a TPU topology ("2x4") or a GPU count
    compute_capability: str | None = None  # NVIDIA's "major.minor", as jax's device reports it
    devices_per_chip: int = 1  # TPU v2, v3: each TensorCore is a jax device of its own

    def peak(self, dtype, precision="default"):
        """Peak FLOP/s for matmuls in dtype, at the precision the matmuls really run.

        Under JAX's default matmul precision a float32 matmul is not a float32
        matmul on an accelerator: a TPU runs it as bf16 passes (its bf16 peak is
        the ceiling), and an NVIDIA GPU from Ampere on runs it on the tensor
        cores as TF32 (JAX docs, "Matmul precision"; jax.default_matmul_precision).
        precision="highest" asks for true float32: on NVIDIA, the CUDA cores' peak.
        Before Ampere (T4, V100) there is no TF32, so float32 is the CUDA cores'
        rate, and the "bfloat16" entry is that rate too (see the T4's entry)."""
        if dtype == "float32" and precision not in ("highest", "float32"):
            dtype = "tf32" if "tf32" in self.flops else dtype
        return self.flops.get(dtype) or self.flops["bfloat16"]

    @property
    def link(self):
        """Bytes/s a chip sends one way over its links: half the datasheet's interconnect,
        which counts both directions; None where the table has no figure."""
        return self.interconnect / 2 if self.interconnect else None

    def ridge(self, dtype):
        """The ridge point, FLOPs per byte: a kernel doing fewer FLOPs per byte it
        moves than this waits on memory; more, and it waits on the arithmetic
        units (Williams, Waterman and Patterson 2009, "Roofline: an insightful
        visual performance model for multicore architectures", CACM 52(4))."""
        return self.peak(dtype) / self.hbm_bandwidth

    def per_device(self):
        """The share of one jax device: the chip itself, or for a chip that jax
        shows as several devices (a TPU v3's two TensorCores, each with half the
        HBM), each figure divided among them."""
        n = self.devices_per_chip
        if n == 1:
            return self
        return dataclasses.replace(
            self,
            name=f"{self.name}/{n}",
            flops={k: v / n for k, v in self.flops.items()},
            hbm_bandwidth=self.hbm_bandwidth / n,
            hbm_bytes=self.hbm_bytes / n,
            devices_per_chip=1,
        )


# What each chip's matmul units work on, as (M, N, K): a dimension of a dot is
# padded up to a multiple of these before the units multiply it.
#  TPU v2-v5: a 128x128 systolic array (MXU) holds a 128x128 tile of one operand
#    (cloud.google.com/tpu/docs/system-architecture-tpu-vm, "TensorCore"); the
#    other streams through in rows of 8 sublanes (a vreg is 8x128). v6e's MXU
#    is 256x256 (cloud.google.com/tpu/docs/v6e, "System architecture").
#  NVIDIA Hopper: wgmma multiplies m64 x n(8..256) x k16 for 16-bit inputs;
#    Ampere and Ada: mma.sync m16 x n8 x k16 (PTX ISA, "Warpgroup MMA: matrix
#    shape" and "Matrix fragments for mma.m16n8k16":
#    docs.nvidia.com/cuda/parallel-thread-execution).
MATMUL_TILES = {
    "tpu-v6e": (8, 256, 256),
    "tpu": (8, 128, 128),
    "9.0": (64, 8, 16),
    "8.0": (16, 8, 16),
    "8.6": (16, 8, 16),
    "8.9": (16, 8, 16),
}


def matmul_tile(chip):
    """(M, N, K) the chip's matmul units pad a dot's dimensions to, or None."""
    if chip.platform == "tpu":
        return MATMUL_TILES.get(chip.name, MATMUL_TILES["tpu"])
    return MATMUL_TILES.get(chip.compute_capability or "")


@dataclasses.dataclass(frozen=True)
class Roofs:
    """The ceilings of one jax device for matmuls in one dtype, each figure
    with its source: what MFU divides by, what the napkin, the roofline table
    and the per-op model (roofline/compiled/op_roofline.py) stand on."""

    name: str  # whose they are: "h100-sxm datasheet", "measured on this machine", ...
    peak_flops: float | None  # FLOP/s of a matmul in the dtype, at the precision it runs
    peak_source: str
    bandwidth: float | None  # HBM bytes/s
    bandwidth_source: str
    measured: bool = False  # peak_flops and bandwidth measured on the chip, not its datasheet's
    datasheet: Chip | None = None  # the chip table's entry, one device's share; None on a CPU
    vector_peak: float | None = None  # FLOP/s of elementwise arithmetic; None: peak_flops
    link: float | None = None  # bytes/s a device sends, one direction; None: no figure
    tile: tuple | None = None  # (M, N, K) the matmul units pad to
    cache: tuple | None = None  # a CPU's (bytes/s, bytes) of its last-level cache, measured
    matmul_rates: dict | None = None  # {(batch, M, N, K, dtype): FLOP/s measured at that shape}
    share: int = 1  # simulated CPU devices sharing one host's measured figures

    def __post_init__(self):
        if self.vector_peak is None:  # a measured roof: the matmul peak stands in
            object.__setattr__(self, "vector_peak", self.peak_flops)

    def matmul_seconds(self, work):
        """Its matmuls' time: at the rate measured for each one's shape where there
        is one (a CPU's rate depends on the shape), else at the peak."""
        if not self.matmul_rates or not work.matmul_shapes:
            return work.matmul_flops / self.peak_flops
        seconds = 0.0
        for b, m, n, k, dtype in work.matmul_shapes:
            rate = self.matmul_rates.get((b, m, n, k, dtype), self.peak_flops)
            seconds += 2 * b * m * n * k / rate
        shaped = sum(2 * b * m * n * k for b, m, n, k, _ in work.matmul_shapes)
        return seconds + max(work.matmul_flops - shaped, 0.0) / self.peak_flops  # a kernel's

    def memory_seconds(self, moved):
        """The least time to move `moved` bytes: as many as the cache holds at its
        bandwidth (the op before may have left them there), the rest at the
        memory's. Without a cache figure, all at the memory's."""
        cache_bandwidth, cache_bytes = self.cache or (None, None)
        if not cache_bandwidth or not cache_bytes:
            return moved / self.bandwidth
        cached = min(moved, cache_bytes)
        return cached / cache_bandwidth + (moved - cached) / self.bandwidth


def chip_roofs(chip, dtype, precision="default", devices_per_chip=1):
    """The Roofs of one device of a chip, from its datasheet. Elementwise work
    runs on the vector units: NVIDIA's float32 (CUDA core) rate; a TPU's
    VPU rate is not published, so its matmul peak stands in (a best case)."""
    matmul = chip.peak(dtype, precision) / devices_per_chip  # a TPU v3's TensorCore: half
    source = f"{chip.name} datasheet"
    return Roofs(
        name=source,
        peak_flops=matmul,
        peak_source=source,
        bandwidth=chip.hbm_bandwidth / devices_per_chip,
        bandwidth_source=source,
        datasheet=chip,
        vector_peak=chip.flops.get("float32", matmul) / devices_per_chip
        if chip.platform == "gpu"
        else matmul,
        link=chip.link,
        tile=matmul_tile(chip),
    )

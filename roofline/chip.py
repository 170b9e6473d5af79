"""What a chip is, to the roofline: peak dense FLOP/s per dtype (at the
precision matmuls really run), memory bandwidth and size, interconnect, and
the ridge point between them. The table of real chips is roofline/chips.py.
"""

import dataclasses


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

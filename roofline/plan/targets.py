"""Chips this machine lacks: compile-only devices of a real TPU slice or NVIDIA GPU.

Both production compilers run on a plain Linux CPU:

    TPU     libtpu (what `jax[tpu]` installs) describes a slice by its topology
            name, e.g. "v5e:2x4", through `jax.experimental.topologies`.
    NVIDIA  the CUDA plugin (`jax[cuda12-local]`) compiles deviceless from a GPU
            target description: the device facts XLA keeps for each GPU in its
            own source tree (openxla/xla, xla/backends/gpu/target_config/specs),
            given as a GpuTargetConfig text proto.

`jax.jit(f).lower(...).compile()` over a mesh of these devices runs the real
compiler for the target: the program it returns is what the chip would run,
so its memory plan, collectives and kernels can be read (roofline/compiled/program.py),
though never executed. Set up with `pip install -r requirements-aot.txt`.
"""

import dataclasses
import importlib.util
import math
import os
import re

from roofline.chip import Chip
from roofline.hardware import CHIPS, chip_for_kind

EXTRAS = "requirements-aot.txt"

# The fields of XLA's GPU target descriptions (xla/backends/gpu/target_config/specs/*.txtpb,
# copied from there) that the compiler needs: SM count and limits, memory and caches,
# clocks and the compute capability. The rest of those files (measured unit rates,
# driver versions) postdates some jaxlib releases, whose parser would reject it.
GPU_SPECS = {
    # chip: (device name, compute capability, SMs, FP32 lanes per SM, clock GHz,
    #        memory bytes/s, memory bytes, L2 bytes, shared memory per SM, per block opt-in)
    "h100-sxm": (
        "NVIDIA H100 80GB HBM3",
        9,
        132,
        128,
        1.98,  # h100_sxm.txtpb
        3352320000000,
        84942979072,
        52428800,
        233472,
        232448,
    ),
    "h100-pcie": (
        "NVIDIA H100 PCIe",
        9,
        114,
        128,
        1.755,  # h100_pcie.txtpb
        2039040000000,
        84942979072,
        52428800,
        233472,
        232448,
    ),
    "h200": (
        "NVIDIA H200 141GB HBM3e",
        9,
        132,
        128,
        1.98,  # h200.txtpb
        4800000000000,
        151397597184,
        52428800,
        233472,
        232448,
    ),
    "a100-80gb": (
        "NVIDIA A100-SXM4-80GB",
        8,
        108,
        64,
        1.41,  # a100_sxm_80.txtpb
        2039040000000,
        85100068864,
        41943040,
        167936,
        166912,
    ),
    "a100-40gb": (
        "NVIDIA A100-SXM4-40GB",
        8,
        108,
        64,
        1.41,  # a100_sxm_40.txtpb
        1555200000000,
        42331013120,
        41943040,
        167936,
        166912,
    ),
}


class TargetError(ValueError):
    """A target this machine cannot compile for, with what to do about it."""


@dataclasses.dataclass(frozen=True)
class Target:
    chip: Chip
    shape: str  # the TPU topology ("2x4") or the GPU count ("8")
    devices: int  # compile-only devices the program is partitioned over
    chips: int  # physical chips (a TPU v4 chip shows its two cores as two devices)

    @property
    def name(self):
        return f"{self.chip.name}:{self.shape}"

    @property
    def hbm_per_device(self):
        return self.chip.hbm_bytes * self.chips / self.devices


def parse_target(text):
    """'tpu-v5e:2x4' or 'h100:8' (or 'h100', one host's worth) -> (Chip, shape)."""
    name, _, shape = text.partition(":")
    chip = CHIPS.get(name.lower())
    # Every TPU of the table (libtpu compiles for each), and the GPUs whose target
    # description XLA ships (GPU_SPECS): a T4 or an L4 can be trained on, not planned for.
    targets = sorted(
        n
        for n, c in CHIPS.items()
        if c.platform == "tpu" or (c.platform == "gpu" and c.name in GPU_SPECS)
    )
    if chip is not None and name.lower() not in targets:
        raise TargetError(f"no compile-only target for {name} here; one of {', '.join(targets)}")
    if name.lower() not in targets:
        raise TargetError(f"unknown chip '{name}' (one of {', '.join(targets)})")
    shape = shape or chip.host_shape
    if chip.platform == "gpu" and not (shape.isdigit() and int(shape) >= 1):
        raise TargetError(f"{text}: a GPU target takes a GPU count, e.g. {name}:8")
    if chip.platform == "tpu" and not re.fullmatch(r"\d+(x\d+){1,2}", shape):
        raise TargetError(f"{text}: a TPU target takes a slice topology, e.g. {name}:2x4")
    return chip, shape


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def missing_extras(platform):
    """None if this machine can compile for platform, else what is missing."""
    if platform == "tpu":
        return None if _installed("libtpu") else "the TPU compiler (libtpu)"
    if not _installed("jax_plugins.xla_cuda12"):
        return "the NVIDIA compiler (jax-cuda12-plugin)"
    if not _installed("nvidia.cudnn"):
        return "cuDNN (nvidia-cudnn-cu12)"
    return None


def gpu_target_config(chip):
    """The GpuTargetConfig text proto XLA compiles against for this NVIDIA chip."""
    name, major, sms, lanes, clock, bandwidth, memory, l2, smem, optin = GPU_SPECS[chip.name]
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {smem}
  threads_per_core_limit: 2048
  core_count: {sms}
  fpus_per_core: {lanes}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock}
  device_memory_size: {memory}
  shared_memory_per_block_optin: {optin}
  cuda_compute_capability {{ major: {major} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "{name}"
"""


def _quiet_libtpu():
    """libtpu looks for the TPU VM it runs on; say there is none, so it does not
    print a page of warnings about missing metadata before compiling. And it
    takes a lock file (/tmp/libtpu_lockfile) so that two processes never drive
    the same chips; with no chips to drive, two compiling processes may share."""
    for var, value in (
        ("TPU_SKIP_MDS_QUERY", "1"),
        ("TPU_ACCELERATOR_TYPE", "v5litepod-8"),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        ("TPU_WORKER_ID", "0"),
        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
    ):
        os.environ.setdefault(var, value)


def compile_only_devices(text):
    """(Target, list of compile-only jax devices) for 'CHIP[:SHAPE]'.

    Raises TargetError, one line, for an unknown chip or topology or missing extras."""
    chip, shape = parse_target(text)
    missing = missing_extras(chip.platform)
    if missing:
        raise TargetError(
            f"{chip.name}: {missing} is not installed; pip install -r {EXTRAS} (Linux x86-64)"
        )
    from jax.experimental import topologies

    try:
        if chip.platform == "tpu":
            _quiet_libtpu()
            generation = chip.name.removeprefix("tpu-")
            topology = topologies.get_topology_desc(
                platform="tpu", topology_name=f"{generation}:{shape}"
            )
            chips = math.prod(int(n) for n in shape.split("x"))
        else:
            os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no driver to check
            topology = topologies.get_topology_desc(
                platform="cuda", target_config=gpu_target_config(chip), topology=f"1x1x{shape}"
            )
            chips = int(shape)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TargetError(f"{text}: {first}") from None
    devices = list(topology.devices)
    return Target(chip, shape, len(devices), chips), devices


def local_target(text, devices):
    """(Target, the first n of `devices`) when `devices` (this machine's:
    jax.devices()) hold n or more of the target's chip, n its GPU count or its
    slice's chips: a chip compiles for itself with its own backend, and needs no
    chip compilers. None otherwise."""
    chip, shape = parse_target(text)
    n = int(shape) if chip.platform == "gpu" else math.prod(int(d) for d in shape.split("x"))
    mine = [d for d in devices if chip_for_kind(d.device_kind) is chip]
    if len(mine) < n:
        return None
    return Target(chip, shape, n, n), mine[:n]

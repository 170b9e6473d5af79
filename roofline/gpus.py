"""The NVIDIA GPUs of the chip table (roofline/hardware.py): dense FLOP/s per
dtype, memory bandwidth and size, NVLink bandwidth, compute capability, each
entry with its public source.

Dense figures only: NVIDIA prints a 2:4-sparsity figure beside each tensor
rate, twice the dense one, and for some parts (L4, B200) only that one; those
are halved here and say so. `kinds` are the CUDA device names
(cudaDeviceProp.name, which XLA's GPU client passes through:
xla/pjrt/gpu/se_gpu_pjrt_client.cc, `desc->name()`).

Memory sizes are binary: NVIDIA's "80GB" on an H100 is 80 GiB (DRAM comes in
power-of-two densities: five 16 GiB HBM3 stacks), so every capacity below is
`n * GiB`. Measured: nvidia-smi on an H100 80GB HBM3 SXM reads 81,559 MiB,
85.5e9 bytes, past 80e9 (docs/h100-run-2/nvidia-smi.csv, 2026-11-27; the rest
of 80 GiB, 81,920 MiB, the driver keeps). Bandwidths and link rates are decimal
(GB/s of 1e9 bytes), as NVIDIA's datasheets give them.
"""

import dataclasses

from roofline.chip import GB as G
from roofline.chip import GIB as GiB
from roofline.chip import TFLOPS as T
from roofline.chip import Chip

A100_DATASHEET = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
V100_DATASHEET = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
GH200_DATASHEET = "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip"
# Compute capabilities: NVIDIA's table, https://developer.nvidia.com/cuda-gpus (V100 on its
# legacy page, https://developer.nvidia.com/cuda-legacy-gpus).

# The cost of one kernel launch in a decode step (roofline/launch_bound.py), every NVIDIA GPU.
# A measured step over the kernels it launches (roofline/compiled/launches.py, on the step
# compiled for h100:1) is an upper bound on one launch, since each kernel also does work: the
# figure is the smallest of the two measured on an H100 SXM, so the roof stays under both.
# The course preset at batch 1: 90.77 us a token (docs/h100-run/accelerator-check/check.json,
# JAX 0.11.2, commit 4a81693), 60 kernels. GPT-2 at batch 1: 0.39 ms, 163 kernels
# (docs/h100-run/s3_gpt2_bf16_random.log, the same run).
H100_COURSE_DECODE_S, H100_COURSE_KERNELS = 90.77e-6, 60
H100_GPT2_DECODE_S, H100_GPT2_KERNELS = 0.39e-3, 163
GPU_LAUNCH_S = min(
    H100_COURSE_DECODE_S / H100_COURSE_KERNELS, H100_GPT2_DECODE_S / H100_GPT2_KERNELS
)
GPU_LAUNCH_SOURCE = (
    "measured on an H100 SXM, the least of two: the course preset's decode at batch 1, "
    "90.77 us a token over the 60 kernels its step launches "
    "(docs/h100-run/accelerator-check/check.json); GPT-2's, 0.39 ms over 163, 2.4 us"
)
HAZY_LAUNCH_S = 1.3e-6  # a published lower reference, never the figure used
HAZY_SOURCE = (
    "Hazy Research, 'Look Ma, No Bubbles!' (2025): about 1.3 us a launch on an H100 "
    "with CUDA graphs, https://hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles"
)


def _gpu(name, flops, bandwidth, memory, link, source, kinds, cc, host="8"):
    return Chip(name, flops, bandwidth, memory, link, source, kinds, "gpu", host, cc)


# Pre-Ampere GPUs (T4: 7.5, V100: 7.0) have fp16 tensor cores and nothing for bf16 or TF32.
# XLA computes their bf16 matmuls in float32 on the CUDA cores ("T4 doesn't support bfloat16,
# XLA should be falling back to float32": github.com/jax-ml/jax/issues/21212, and
# github.com/openxla/xla/issues/12429), so their "bfloat16" entry is the float32 rate: the
# ceiling a bf16 step really has there. The fp16 tensor rate is kept as "float16".
T4 = _gpu(
    "t4",
    {"float16": 65 * T, "bfloat16": 8.1 * T, "float32": 8.1 * T},
    320 * G,
    16 * GiB,
    None,
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
    "t4-tensor-core-datasheet-951643.pdf",
    ("Tesla T4",),
    "7.5",
)
V100_SXM2 = _gpu(
    "v100-sxm2-16gb",
    {"float16": 125 * T, "bfloat16": 15.7 * T, "float32": 15.7 * T},
    900 * G,
    16 * GiB,
    300 * G,
    V100_DATASHEET,
    ("Tesla V100-SXM2-16GB",),
    "7.0",
)
V100_PCIE = _gpu(
    "v100-pcie-16gb",
    {"float16": 112 * T, "bfloat16": 14 * T, "float32": 14 * T},
    900 * G,
    16 * GiB,
    None,
    V100_DATASHEET,
    ("Tesla V100-PCIE-16GB",),
    "7.0",
)
A100_FLOPS = {"bfloat16": 312 * T, "tf32": 156 * T, "float32": 19.5 * T}
H100_SXM_FLOPS = {"bfloat16": 989 * T, "tf32": 494.5 * T, "float32": 67 * T}
GH200 = _gpu(
    "gh200",
    H100_SXM_FLOPS,
    4000 * G,
    96 * GiB,
    None,
    GH200_DATASHEET,
    ("NVIDIA GH200 480GB",),
    "9.0",
    "1",
)

GPUS = [
    # NVIDIA A100 datasheet: bf16 312, tf32 156, fp32 19.5 TFLOP/s dense; 40 GB (GiB) at 1555 GB/s;
    # 80 GB (GiB) SXM at 2039 GB/s, 80 GB PCIe at 1935 GB/s; NVLink 600 GB/s (PCIe: by bridge).
    # Names: "NVIDIA A100-SXM4-40GB" (jax-ml/jax#11705; older drivers drop "NVIDIA "),
    # "NVIDIA A100 80GB PCIe" (what RunPod's API and nvidia-smi list).
    _gpu(
        "a100-40gb",
        A100_FLOPS,
        1555 * G,
        40 * GiB,
        600 * G,
        A100_DATASHEET,
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        "8.0",
    ),
    _gpu(
        "a100-80gb",
        A100_FLOPS,
        2039 * G,
        80 * GiB,
        600 * G,
        A100_DATASHEET,
        ("NVIDIA A100-SXM4-80GB",),
        "8.0",
    ),
    _gpu(
        "a100-80gb-pcie",
        A100_FLOPS,
        1935 * G,
        80 * GiB,
        600 * G,
        A100_DATASHEET,
        ("NVIDIA A100 80GB PCIe",),
        "8.0",
    ),
    # NVIDIA H100 datasheet: SXM: bf16 989, tf32 494.5, fp32 67 TFLOP/s dense; 80 GB (GiB:
    # the 81,559 MiB measured above) at 3.35 TB/s; NVLink 900 GB/s. The name is XLA's own
    # (xla/.../specs/h100_sxm.txtpb).
    _gpu(
        "h100-sxm",
        H100_SXM_FLOPS,
        3350 * G,
        80 * GiB,
        900 * G,
        H100_DATASHEET,
        ("NVIDIA H100 80GB HBM3",),
        "9.0",
    ),
    # PCIe: bf16 756, tf32 378, fp32 51 TFLOP/s dense; 80 GB (GiB) at 2.0 TB/s;
    # NVLink bridge 600 GB/s.
    _gpu(
        "h100-pcie",
        {"bfloat16": 756 * T, "tf32": 378 * T, "float32": 51 * T},
        2000 * G,
        80 * GiB,
        600 * G,
        H100_DATASHEET,
        ("NVIDIA H100 PCIe",),
        "9.0",
    ),
    # NVIDIA H200 page (nvidia.com/en-us/data-center/h200): the H100 SXM's compute, 141 GB
    # (GiB) of HBM3e at 4.8 TB/s, NVLink 900 GB/s. "NVIDIA H200 141GB HBM3e": XLA's h200.txtpb.
    _gpu(
        "h200",
        H100_SXM_FLOPS,
        4800 * G,
        141 * GiB,
        900 * G,
        "https://www.nvidia.com/en-us/data-center/h200/",
        ("NVIDIA H200", "NVIDIA H200 141GB HBM3e"),
        "9.0",
    ),
    # GH200 datasheet: the H100 SXM's compute beside a Grace CPU; "480GB" in the name is
    # the CPU's LPDDR5X, the GPU has 96 GB (GiB) HBM3 at 4 TB/s (nvidia-smi shows about 97 GB);
    # the 144 GB (GiB) HBM3e part runs at 4.9 TB/s. Its 900 GB/s NVLink-C2C goes to its own CPU,
    # not to other GPUs (those links depend on the system), hence no interconnect.
    GH200,
    dataclasses.replace(
        GH200,
        name="gh200-144gb",
        hbm_bandwidth=4900 * G,
        hbm_bytes=144 * GiB,
        kinds=("NVIDIA GH200 144G HBM3e",),
    ),
    # NVIDIA HGX page (nvidia.com/en-us/data-center/hgx), HGX B200, 8 GPUs with sparsity:
    # FP16/BF16 36 PFLOP/s, TF32 18, FP32 0.6 (no sparsity); 1.4 TB of HBM3e at 64 TB/s;
    # NVLink 1.8 TB/s per GPU. Per GPU dense: 2.25 PF, 1.125 PF, 75 TF; 180 GB at 8 TB/s: GiB,
    # nvidia-smi reads 183,359 MiB of 184,320 (github.com/NVIDIA/TensorRT-LLM/issues/10278).
    _gpu(
        "b200",
        {"bfloat16": 2250 * T, "tf32": 1125 * T, "float32": 75 * T},
        8000 * G,
        180 * GiB,
        1800 * G,
        "https://www.nvidia.com/en-us/data-center/hgx/",
        ("NVIDIA B200",),
        "10.0",
    ),
    # NVIDIA L4 datasheet (resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet)
    # prints tensor rates with sparsity only: bf16 242, tf32 120 -> 121, 60 dense; fp32
    # 30.3 TFLOP/s; 24 GB (GiB) at 300 GB/s; PCIe only.
    _gpu(
        "l4",
        {"bfloat16": 121 * T, "tf32": 60 * T, "float32": 30.3 * T},
        300 * G,
        24 * GiB,
        None,
        "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
        ("NVIDIA L4",),
        "8.9",
    ),
    # A10G: AWS's variant of the A10 (G5 instances); NVIDIA publishes no datasheet for it.
    # Baseten's comparison: bf16 70, tf32 35, fp32 35 TFLOP/s dense; 24 GB (GiB) at 600 GB/s
    # (half the A10's tensor rate, as GA102's GeForce parts). PCIe only. GA102: 8.6.
    _gpu(
        "a10g",
        {"bfloat16": 70 * T, "tf32": 35 * T, "float32": 35 * T},
        600 * G,
        24 * GiB,
        None,
        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
        ("NVIDIA A10G",),
        "8.6",
    ),
    # GA102 whitepaper, appendix A, GeForce RTX 3090: bf16 (fp32 accumulate) 71, tf32 35.6,
    # fp32 35.6 TFLOP/s dense; 24 GB (GiB) GDDR6X at 936 GB/s; NVLink bridge 112.5 GB/s.
    _gpu(
        "rtx3090",
        {"bfloat16": 71 * T, "tf32": 35.6 * T, "float32": 35.6 * T},
        936 * G,
        24 * GiB,
        112.5 * G,
        "https://www.nvidia.com/content/PDF/"
        "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
        ("NVIDIA GeForce RTX 3090",),
        "8.6",
        "1",
    ),
    # Ada whitepaper, GeForce RTX 4090: bf16 (fp32 accumulate) 165.2, tf32 82.6, fp32 82.6
    # TFLOP/s dense; 24 GB (GiB) GDDR6X at 1008 GB/s; no NVLink.
    _gpu(
        "rtx4090",
        {"bfloat16": 165.2 * T, "tf32": 82.6 * T, "float32": 82.6 * T},
        1008 * G,
        24 * GiB,
        None,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
        ("NVIDIA GeForce RTX 4090",),
        "8.9",
        "1",
    ),
    # T4 datasheet: fp16 (fp32 accumulate) 65, fp32 8.1 TFLOP/s; 16 GB (GiB) GDDR6 at 320 GB/s
    # (its board brief, PB-09256: "up to 320 GBytes/s"); PCIe only. Colab's name: "Tesla T4".
    T4,
    # V100 datasheet: SXM2: tensor (fp16) 125, fp32 15.7 TFLOP/s; PCIe: 112, 14; 16 or
    # 32 GB (GiB) HBM2 at 900 GB/s; NVLink 300 GB/s (SXM2 only). Names as "Tesla V100-SXM2-16GB".
    V100_SXM2,
    dataclasses.replace(
        V100_SXM2, name="v100-sxm2-32gb", hbm_bytes=32 * GiB, kinds=("Tesla V100-SXM2-32GB",)
    ),
    V100_PCIE,
    dataclasses.replace(
        V100_PCIE, name="v100-pcie-32gb", hbm_bytes=32 * GiB, kinds=("Tesla V100-PCIE-32GB",)
    ),
]

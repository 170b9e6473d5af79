"""The third roof of a decode step: its kernel launches.

    step >= max(bytes / bandwidth, FLOPs / peak, kernels x per-launch cost)

A GPU runs a compiled step as a chain of kernels, one after the other. Between
two of them it moves no weight: the next one is launched, its blocks start, the
last blocks of the one before drain. At batch 1 a decode step's kernels are
tiny (GPT-2's 163 read 208 MB, about 1.3 MB each: 0.4 us each at 3.35 TB/s),
so that gap, paid once a kernel, can cost more than the bytes. Whichever of the
three times is largest binds: "bytes", "FLOPs" or "launches".

The per-launch cost, by chip family (launch_cost), each with its source:

  NVIDIA GPUs  1.5 us, measured: the smallest step over its kernels of two decodes on
               an H100 SXM (JAX 0.11.2, commit 4a81693). The course preset at batch 1 took
               90.77 us a token (docs/h100-run/accelerator-check/check.json) and its step,
               compiled for h100:1, launches 60 kernels (roofline/compiled/launches.py):
               1.51 us. GPT-2 at batch 1 took 0.39 ms over 163 kernels
               (docs/h100-run/s3_gpt2_bf16_random.log): 2.4 us. Each ratio charges a
               kernel's own work to its launch too, so each is an upper bound on a launch;
               the least keeps kernels x cost under every step measured, as a roof must.
               Other NVIDIA GPUs: carried over from the H100, not measured on them. The
               published reference: about 1.3 us a launch on an H100 even inside CUDA
               graphs (Hazy Research, "Look Ma, No Bubbles!", 2025). The three agree that
               a launch costs 1.3-2.4 us.
  TPUs         none: the term does not apply. A TPU's compiled step is one program its
               TensorCore runs from start to end, its fusions in sequence inside it;
               no host or front end launches them one by one.
  CPUs         none: XLA's CPU fusions are calls inside one compiled function.

Where no compiled program is at hand (the planner, python -m roofline decode),
the kernel count is an estimate (estimated_kernels): L x a layer's kernels + the
kernels outside the layers, as read off GPT-2's decode compiled for h100:1 (XLA).
"""

from typing import NamedTuple

from roofline.gpus import GPU_LAUNCH_S, GPU_LAUNCH_SOURCE
from roofline.tpus import TPU_WHY

CPU_WHY = "a CPU runs XLA's fusions as calls inside one compiled function: no launches"

# XLA's decode of GPT-2 compiled for h100:1 (deviceless, JAX 0.10.2; roofline/compiled/launches.py),
# 163 kernels a token: per layer 13 (the norm's sum and its scaling, twice; q, k and v in
# one multiply-and-reduce; q·k of the new key; the scores over the cache; a Triton
# softmax·v; the output projection; the MLP's two; the cache's two writes), and 7 outside
# the layers (the final norm's two, the logits, the argmax, the token's write and two
# small loop fusions; the loop's condition never runs, its 16 trips known): 12 x 13 + 7.
XLA_KERNELS_PER_LAYER = 13
XLA_KERNELS_OUTSIDE = 7
# Our decode in kernels (sessions/inference/kernel_step.py) compiled for h100:1: 2 a layer
# (attention half, MLP half) and 5 outside (the loop's 3: pick, write, counter; the
# embedding; the head: one kernel, the last partials, the final norm, the logits and the
# loop's select; tests/test_decode_kernels.py counts them).
OUR_KERNELS_PER_LAYER, OUR_KERNELS_OUTSIDE = 2, 5
FUSED_KERNELS_PER_LAYER = 2  # a decode layer as one or two fused kernels


class LaunchCost(NamedTuple):
    seconds: float | None  # one kernel launch, or None where the term does not apply
    source: str  # where the figure comes from, or why there is none


def launch_cost(chip):
    """The per-launch cost of a chip of the table (roofline.chip.Chip)."""
    if chip.platform == "gpu":
        carried = "" if chip.name.startswith("h100") else " (carried over from the H100)"
        return LaunchCost(GPU_LAUNCH_S, GPU_LAUNCH_SOURCE + carried)
    return LaunchCost(None, TPU_WHY if chip.platform == "tpu" else CPU_WHY)


def estimated_kernels(layers, per_layer=None):
    """Kernels one decode token launches, by estimate: L x per_layer + the kernels outside
    the layers. per_layer None: XLA's step as compiled for GPT-2 (13, and 8 outside); 2:
    ours (and its 7 outside); any other N, with XLA's 8 outside."""
    if per_layer is None:
        return layers * XLA_KERNELS_PER_LAYER + XLA_KERNELS_OUTSIDE
    ours = per_layer == OUR_KERNELS_PER_LAYER
    return layers * per_layer + (OUR_KERNELS_OUTSIDE if ours else XLA_KERNELS_OUTSIDE)


class LaunchBound(NamedTuple):
    """A decode step's three lower bounds (seconds) and the one that binds."""

    memory_s: float  # bytes / bandwidth
    compute_s: float  # FLOPs / peak
    launch_s: float | None  # kernels x per-launch cost; None where it does not apply
    kernels: int | None  # kernels a token
    step_s: float  # the largest of the three
    bound: str  # "bytes", "FLOPs" or "launches"


def launch_bound(step, kernels, per_launch_s):
    """The three bounds of a decode step (a roofline.decode_cost.DecodeStep, or any
    object with memory_s and compute_s), `kernels` a token and `per_launch_s`
    seconds each (None: no launch term)."""
    launch_s = None if kernels is None or per_launch_s is None else kernels * per_launch_s
    times = {"bytes": step.memory_s, "FLOPs": step.compute_s, "launches": launch_s or 0.0}
    bound = max(times, key=times.get)  # on a tie, the first: bytes, then FLOPs
    return LaunchBound(step.memory_s, step.compute_s, launch_s, kernels, times[bound], bound)

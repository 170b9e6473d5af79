"""The TPUs of the chip table (roofline/hardware.py): Google's published bf16
peak, HBM bandwidth and size, and ICI bandwidth per chip, each entry with its
source; `kinds` are the names libtpu gives each ("TPU v5 lite" is a v5e:
jax/_src/test_util.py, is_device_tpu). A TPU's float32 matmuls run as bf16
passes under JAX's default precision, so bf16 is its one figure.
"""

from roofline.chip import GB as G
from roofline.chip import GIB as GiB
from roofline.chip import TFLOPS as T
from roofline.chip import Chip

# Why a decode step on a TPU has no launch term (roofline/launch_bound.py).
TPU_WHY = "a TPU runs the compiled step as one program: no kernel is launched on its own"


def _tpu(name, bf16, bandwidth, memory, link, source, kinds, host, devices_per_chip=1):
    return Chip(
        name,
        {"bfloat16": bf16},
        bandwidth,
        memory,
        link,
        source,
        kinds,
        "tpu",
        host,
        None,
        devices_per_chip,
    )


TPUS = [
    # https://cloud.google.com/tpu/docs/v4 : 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s.
    # ICI: not given per chip on that page.
    _tpu(
        "tpu-v4",
        275 * T,
        1200 * G,
        32 * GiB,
        None,
        "https://cloud.google.com/tpu/docs/v4",
        ("TPU v4",),
        "2x2x1",
    ),
    # https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, 16 GB at 819 GB/s, ICI 400 GB/s.
    # "TPU v5e" is the name jax's tests expect once libtpu renames "TPU v5 lite".
    _tpu(
        "tpu-v5e",
        197 * T,
        819 * G,
        16 * G,
        400 * G,
        "https://cloud.google.com/tpu/docs/v5e",
        ("TPU v5 lite", "TPU v5e"),
        "2x4",
    ),
    # https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, 95 GiB at 2765 GB/s,
    # ICI 1200 GB/s.
    # A v5p reports itself as "TPU v5" (jax/_src/test_util.py: v5p is a kind ending in "v5").
    _tpu(
        "tpu-v5p",
        459 * T,
        2765 * G,
        95 * GiB,
        1200 * G,
        "https://cloud.google.com/tpu/docs/v5p",
        ("TPU v5p", "TPU v5"),
        "2x2x1",
    ),
    # https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, 32 GB at 1638 GB/s,
    # ICI 800 GB/s.
    _tpu(
        "tpu-v6e",
        918 * T,
        1638 * G,
        32 * G,
        800 * G,
        "https://cloud.google.com/tpu/docs/v6e",
        ("TPU v6 lite", "TPU v6e"),
        "2x4",
    ),
    # https://cloud.google.com/tpu/docs/v3 : 123 TFLOP/s bf16 per chip, 32 GiB HBM2 at 900 GB/s;
    # two TensorCores per chip, each a jax device (a v3-8 host: 4 chips, 8 devices).
    _tpu(
        "tpu-v3",
        123 * T,
        900 * G,
        32 * GiB,
        None,
        "https://cloud.google.com/tpu/docs/v3",
        ("TPU v3",),
        "2x2",
        devices_per_chip=2,
    ),
    # cloud.google.com/tpu/docs/v2 defers to Jouppi et al. 2020, "A Domain-Specific
    # Supercomputer for Training Deep Neural Networks" (CACM 63(7)), its table of TPUv2/v3:
    # 46 TFLOP/s bf16 (2 TensorCores x one 128x128 MXU x 2 FLOPs x 700 MHz), 16 GiB HBM at
    # 700 GB/s. Two TensorCores per chip, each a jax device, as on v3.
    _tpu(
        "tpu-v2",
        46 * T,
        700 * G,
        16 * GiB,
        None,
        "https://cacm.acm.org/research/"
        "a-domain-specific-supercomputer-for-training-deep-neural-networks/",
        ("TPU v2",),
        "2x2",
        devices_per_chip=2,
    ),
]

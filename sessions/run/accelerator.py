"""The accelerator under a run: what its generation can do, and one JAX cannot see.

Two decisions the session scripts make before they build anything:

- Defaults by capability, not by platform alone. An NVIDIA GPU below compute
  capability 8.0 (T4: 7.5, V100: 7.0) has no bf16 tensor cores and cannot run
  cuDNN's flash attention, the GPU defaults, so a run there defaults to float32
  and XLA's attention (`capability_defaults`).
- A machine with an NVIDIA GPU or a TPU on which JAX sees only the CPU (the
  platform's jax extra is not installed) stops before training, naming the file
  to install; JAX_PLATFORMS=cpu says "train on the CPU anyway"
  (`check_accelerator_visible`).

(Not named platform.py: a script run as `python sessions/s2_train.py` has
sessions/ first on sys.path, and that name would hide the standard library's.)
"""

import dataclasses
import glob
import importlib.util
import os

import jax

from sessions.run.errors import UsageError

# Compute capability 8.0 (Ampere) is where bf16 tensor cores begin, and where cuDNN's fused
# attention begins: "cudnn SDPA operation requires SM80 (Ampere) or newer architectures"
# (docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html). JAX's own
# trace-time checks of that kernel test head dim and sequence, not this.
AMPERE = (8, 0)
ATTENTION_WORDS = {
    "fused": "XLA's attention",
    "einsum": "einsum attention",
    "pallas": "our Pallas flash attention",
}


@dataclasses.dataclass(frozen=True)
class Defaults:
    dtype: str | None  # matmul dtype; None: the platform's usual default
    attention_impl: str | None  # use as is; None: sessions.attention_choice.choose picks
    note: str | None  # one header line saying why the usual defaults do not hold


def compute_capability(device):
    """(major, minor) of an NVIDIA GPU, or None (a CPU, a TPU, a GPU that does not say).

    jax's CUDA devices carry it as a string attribute, "7.5": XLA's GPU client builds it
    as major "." minor (xla/pjrt/gpu/se_gpu_pjrt_client.cc, MakeComputeCapabilityString),
    and jax's cuDNN attention reads it so (jax/_src/cudnn/fused_attention_stablehlo.py,
    check_compute_capability). A ROCm GPU's ("gfx90a") is not a number: None."""
    text = getattr(device, "compute_capability", None)
    if device is None or device.platform != "gpu" or not isinstance(text, str):
        return None
    try:
        major, minor = (int(part) for part in text.split("."))
    except ValueError:
        return None
    return major, minor


def capability_defaults(device, dtype=None, attention_impl=None):
    """Defaults for a run on `device`, given the --dtype and --attention-impl asked
    for (None where not given). device None (a step compiled for a chip this machine
    lacks, --target; those are all 8.0+) keeps what was asked.

    Below compute capability 8.0: float32 and XLA's attention ("einsum" is kept if
    asked for), with a note for the header. An explicit --dtype bfloat16 is honoured
    with a warning in the note: XLA computes its matmuls in float32 there, correct
    and slower (github.com/jax-ml/jax/issues/21212), and the attention is still
    XLA's. --attention-impl cudnn cannot run there at all: a UsageError."""
    cc = compute_capability(device)
    if cc is None or cc >= AMPERE:
        return Defaults(dtype, None, None)
    chip = f"{device.device_kind} is compute capability {cc[0]}.{cc[1]}"
    if attention_impl in ("cudnn", "splash"):
        need = "8.0+" if attention_impl == "cudnn" else "a TPU"
        raise UsageError(
            f"--attention-impl {attention_impl}: {chip}; that kernel needs {need} "
            "(fused or einsum run here)"
        )
    attention = attention_impl or "fused"
    if dtype == "bfloat16":
        note = (
            f"{chip}: no bf16 tensor cores, so XLA computes the bfloat16 matmuls in "
            f"float32, slower than --dtype float32; {ATTENTION_WORDS[attention]}, as "
            "cuDNN flash attention needs 8.0+"
        )
        return Defaults("bfloat16", attention, note)
    dtype = dtype or "float32"
    note = (
        f"{chip}: cuDNN flash attention and bf16 matmuls need 8.0+; {dtype} and "
        f"{ATTENTION_WORDS[attention]}"
    )
    return Defaults(dtype, attention, note)


# What JAX itself looks for (jax/_src/hardware_utils.py, jax 0.10.2): Google's PCI vendor id,
# and the device ids of the TPUs its runtime knows (v3, v4, v5p, v5e, v6e, 7x; the vendor id
# alone also names Google's virtual NIC, on every Compute Engine VM).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}


def unseen_accelerator(root="/"):
    """("nvidia" or "tpu", the path that shows it) for an accelerator on this machine, or None.

    NVIDIA: a GPU's device node, /dev/nvidia0 and on; or the driver's list of GPUs,
    /proc/driver/nvidia/gpus/*, which is there before the first CUDA program creates the
    nodes. Not /dev/nvidiactl alone, which a container given the driver but no GPU has.
    TPU: a TPU's PCI function (as JAX checks), or /dev/accel0 and on (TPU v2 to v4 VMs;
    an Intel NPU's node is /dev/accel/accel0, one level down)."""

    def found(pattern):
        paths = sorted(glob.glob(os.path.join(root, pattern)))
        return "/" + os.path.relpath(paths[0], root) if paths else None

    path = found("dev/nvidia[0-9]*") or found("proc/driver/nvidia/gpus/*")
    if path:
        return "nvidia", path
    for vendor in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor"))):
        device = os.path.join(os.path.dirname(vendor), "device")
        if _read(vendor) == GOOGLE_PCI_VENDOR and _read(device) in TPU_PCI_DEVICES:
            return "tpu", "/" + os.path.relpath(os.path.dirname(vendor), root)
    path = found("dev/accel[0-9]*")
    return ("tpu", path) if path else None


def check_accelerator_visible(root="/", backend=None, environ=None):
    """Raise UsageError if this machine has an accelerator and JAX runs on the CPU.

    backend: jax.default_backend() by default (call after jax.distributed starts).
    environ: os.environ by default; JAX_PLATFORMS=cpu in it is the opt-in to the CPU."""
    environ = os.environ if environ is None else environ
    asked = {p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if asked == {"cpu"}:
        return
    if (backend or jax.default_backend()) != "cpu":
        return
    unseen = unseen_accelerator(root)
    if unseen is None:
        return
    kind, path = unseen
    what, extra, plugin = {
        "nvidia": ("an NVIDIA GPU", "requirements-gpu.txt", "jax_plugins.xla_cuda12"),
        "tpu": ("a TPU", "requirements-tpu.txt", "libtpu"),
    }[kind]
    why = " (its jax plugin is installed but did not start: see JAX's warning above)"
    raise UsageError(
        f"this machine has {what} ({path}) but JAX sees only the CPU"
        f"{why if _installed(plugin) else ''}: pip install -r requirements.txt -r {extra}, "
        "or set JAX_PLATFORMS=cpu to train on the CPU"
    )


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False

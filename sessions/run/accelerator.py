"""An accelerator on this machine that JAX cannot see: the check the session scripts
make before they build anything.

A machine with an NVIDIA GPU or a TPU on which JAX sees only the CPU (the platform's
jax extra is not installed) stops before training, naming the file to install;
JAX_PLATFORMS=cpu says "train on the CPU anyway" (`check_accelerator_visible`). What
a GPU's generation can do (its defaults by compute capability) is sessions/run/defaults.py's.

(Not named platform.py: a script run as `python sessions/s2_train.py` has
sessions/ first on sys.path, and that name would hide the standard library's.)
"""

import glob
import importlib.util
import os

import jax

from sessions.errors import UsageError

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

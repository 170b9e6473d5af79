"""Stand-ins for what only a running accelerator shows, shaped as the runtime's own.

A jax device: `platform` ("cpu", "gpu", "tpu"), `device_kind` (the CUDA device name
or libtpu's), `id`, on CUDA a `compute_capability` string such as "7.5" (XLA's GPU
client: xla/pjrt/gpu/se_gpu_pjrt_client.cc), and `memory_stats()`, a dict with
`peak_bytes_in_use` on GPUs and TPUs. A compiled step's `memory_analysis()`: an
object with argument, output, temp and alias sizes in bytes. A machine's root
directory, with the files the accelerator checks read.
"""

import os
import types


class FakeDevice:
    def __init__(self, platform, device_kind, compute_capability=None, peak=None, id=1000):
        self.platform = platform
        self.device_kind = device_kind
        self.id = id  # far from the ids of the simulated CPU devices the tests run on
        if compute_capability is not None:  # TPU and CPU devices have no such attribute
            self.compute_capability = compute_capability
        self.peak = peak  # peak_bytes_in_use, or None: a backend that keeps no count

    def memory_stats(self):
        if self.peak is None:
            return None
        return {"bytes_in_use": 0, "peak_bytes_in_use": self.peak}


class FakeCompiled:
    """A compiled step whose memory plan is given in bytes."""

    def __init__(self, arguments, outputs, temps, aliased):
        self.plan = types.SimpleNamespace(
            argument_size_in_bytes=arguments,
            output_size_in_bytes=outputs,
            temp_size_in_bytes=temps,
            alias_size_in_bytes=aliased,
        )

    def memory_analysis(self):
        return self.plan


def fake_root(root, files=(), dirs=()):
    """A machine's root under `root`: `files` {path: text}, `dirs` [path], paths
    relative to "/" ("dev/nvidia0"). Returns root as a string."""
    for path in dirs:
        os.makedirs(os.path.join(root, path), exist_ok=True)
    for path, text in dict(files).items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return str(root)

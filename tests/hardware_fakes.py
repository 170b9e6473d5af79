"""Stand-ins for what only a running accelerator shows, shaped as the runtime's own.

A jax device: `platform` ("cpu", "gpu", "tpu"), `device_kind` (the CUDA device name
or libtpu's), `id`, on CUDA a `compute_capability` string such as "7.5" (XLA's GPU
client: xla/pjrt/gpu/se_gpu_pjrt_client.cc), and `memory_stats()`, a dict with
`peak_bytes_in_use` on GPUs and TPUs. A compiled step's `memory_analysis()`: an
object with argument, output, temp and alias sizes in bytes. A machine's root
directory, with the files the accelerator checks read. A chip's rounding of the
inputs of float32 matmuls (`rounded_matmuls`).
"""

import contextlib
import os
import types

import jax
import jax.numpy as jnp


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


# A chip's default matmul precision, on the CPU (which multiplies float32 in float32):
# the inputs of every float32 dot not asked for at precision HIGHEST rounded to
# nearest the way the chip rounds them (TF32: 10 stored significand bits, bfloat16:
# 7), the products summed in float32. What an H100 and a TPU do under JAX's default.


def to_tf32(x):
    """float32 rounded to TF32's 10 stored significand bits, to nearest, ties to
    even: add half of the 13 dropped bits' place (less one, plus the kept last
    bit), then drop them."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    bits = (bits + jnp.uint32(0xFFF) + ((bits >> 13) & 1)) & jnp.uint32(0xFFFFE000)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def to_bf16(x):
    return x.astype(jnp.bfloat16).astype(jnp.float32)


# JAX's own name for each: under it the CPU, which ignores it, traces programs of
# their own, so no trace cached unrounded, nor one rounded the other way, is reused.
SETTINGS = {to_tf32: "tensorfloat32", to_bf16: "bfloat16"}


@contextlib.contextmanager
def rounded_matmuls(monkeypatch, rounding):
    """Inside: every float32 dot_general not at precision HIGHEST takes its
    operands through `rounding` (to_tf32 or to_bf16; gradients straight
    through). JAX's caches are emptied on the way out: no rounded program
    outlives it."""
    dot = jax.lax.dot_general_p
    bind = dot.bind
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)

    def rounded(x):
        return x + jax.lax.stop_gradient(rounding(x) - x)

    def rounding_bind(lhs, rhs, **params):
        if params.get("precision") != highest and lhs.dtype == rhs.dtype == jnp.float32:
            lhs, rhs = rounded(lhs), rounded(rhs)
        return bind(lhs, rhs, **params)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(dot, "bind", rounding_bind)
            with jax.default_matmul_precision(SETTINGS[rounding]):
                yield
    finally:
        jax.clear_caches()

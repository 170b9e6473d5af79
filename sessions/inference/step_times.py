"""A timed decode step beside its floor and its estimate (roofline/plan/decode_estimate.py):
the kernels its compiled program launches a token, and what the roofline makes of them.

Only a GPU has both: it launches its kernels one by one, and the estimate is fitted on an
H100. A CPU or a TPU runs the step as one program: the floor is its bytes or FLOPs, and it
has no estimate (None)."""

import jax
import jax.numpy as jnp

from roofline.compiled.launches import kernels_per_token
from roofline.hardware import chip_for_kind
from roofline.plan.decode_estimate import decode_times
from sessions.inference import kernel_step, kv_cache


def kernels_a_token(weights, cfg, batch, impl):
    """Kernels one decode step launches, read off its compiled program (one step's loop)."""
    T, V = cfg.seq, cfg.vocab
    cache = kv_cache.init_cache(cfg, batch)
    tokens, logits = jnp.zeros((batch, T), jnp.int32), jnp.zeros((batch, V), jnp.float32)
    args = (weights, cache, tokens, logits, 1, 1, jax.random.key(0), 1.0, cfg, False, impl)
    return kernels_per_token(kv_cache.decode_steps.lower(*args).compile())[0]


def local_chip():
    """This machine's first device in the chip table, where it is a GPU; else None."""
    device = jax.devices()[0]
    return chip_for_kind(device.device_kind) if device.platform == "gpu" else None


def times_of(step, kernels, cfg, batch, impl, chip):
    """The roofline's DecodeTimes of a step launching `kernels` on `chip`: our kernels'
    bytes at what their grids keep in flight (impl set), XLA's at its fitted rate."""
    streams = kernel_step.byte_streams(cfg, batch) if impl else None  # None: XLA's fit
    return decode_times(step, kernels, chip, streams=streams)


def step_times(step, weights, cfg, batch, impl):
    """(kernels a token, roofline DecodeTimes) of a step on this machine's first device, or
    (None, None) where it is no GPU of the chip table. step: its decode_cost.DecodeStep."""
    if (chip := local_chip()) is None:
        return None, None
    kernels = kernels_a_token(weights, cfg, batch, impl)
    return kernels, times_of(step, kernels, cfg, batch, impl, chip)

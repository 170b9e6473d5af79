"""Mosaic GPU across JAX versions: its kernels and its interpreter, spelled as this JAX spells them.

A Mosaic GPU kernel (`jax.experimental.pallas.mosaic_gpu`) compiles for Hopper and
Blackwell GPUs. On a machine without one it runs in Mosaic GPU's own interpreter,
slowly, the same arithmetic: `plgpu.InterpretGPUParams` in JAX 0.12, a private class
in 0.10. (The generic `interpret=True` of Pallas fails on TMA copies and wgmma.)
Whether to interpret is always the caller's word, never guessed from the default
backend: a deviceless compile for an H100 runs on a CPU.
"""

from jax.experimental.pallas import mosaic_gpu as plgpu


def interpret_params():
    """Mosaic GPU's interpreter, as this JAX names it."""
    if hasattr(plgpu, "InterpretGPUParams"):  # JAX 0.12
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # JAX 0.10

    return InterpretGPUParams()


def kernel(body, *, interpret: bool, **kwargs):
    """plgpu.kernel(body, **kwargs), run in the interpreter when `interpret`."""
    return plgpu.kernel(body, interpret=interpret_params() if interpret else None, **kwargs)

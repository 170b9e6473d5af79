"""Mosaic GPU across JAX versions: one way to start a kernel, compiled or interpreted.

Mosaic GPU (`jax.experimental.pallas.mosaic_gpu`) is the Pallas backend JAX keeps
for NVIDIA GPUs. Its kernels run on a CPU too, in Mosaic GPU's own interpreter,
which simulates TMA copies, barriers and wgmma (the generic `interpret=True` of
Pallas does not: it fails on both). The interpreter is public from JAX 0.12
(`plgpu.InterpretGPUParams`) and private before it.

`interpret` is always the caller's choice, never guessed from the default backend:
a program compiled for an H100 on this CPU machine (a deviceless `h100:1` target)
runs on a "cpu" backend and must still be compiled, not interpreted.
"""

from jax.experimental.pallas import mosaic_gpu as plgpu


def interpret_params():
    """Mosaic GPU's interpreter parameters: plgpu.InterpretGPUParams (JAX 0.12), or
    the same class where JAX 0.10 keeps it private."""
    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def kernel(body, *, interpret: bool, **kwargs):
    """plgpu.kernel(body, **kwargs), run in the interpreter when `interpret`
    (on a CPU) and compiled for the GPU otherwise."""
    return plgpu.kernel(body, interpret=interpret_params() if interpret else None, **kwargs)

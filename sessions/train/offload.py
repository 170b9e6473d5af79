"""Offload: the optimizer's state kept in the host's memory between steps, fetched to
the chip for the update and sent back, so the chip's HBM holds it only for the update.

AdamW keeps two moments a weight, 8 bytes a parameter in float32 (16 with a float32
master copy beside bf16 weights), more than the weights themselves. The state is
read once a step, by the update at its end, so it can live in the host's DRAM (a
GPU server's or a TPU VM's, hundreds of GB) and cross the host link twice a step:
LLaMA-3-8B's moments are 8.0e9 parameters x 8 B = 64 GB; split over 8 H100s, 8 GB a
chip each way, 0.13 s a direction over PCIe Gen5 x16's 64 GB/s (NVIDIA's H100
datasheet), against a step of seconds at a large batch. JAX names each memory by
its kind: "device" (HBM) and "pinned_host" (host DRAM
the chip's DMA engines reach directly). A sharding with memory_kind="pinned_host"
places an array there, and inside a jitted step `jax.device_put(x,
jax.memory.Space.Device)` (or `Space.Host`) is a copy the compiler schedules like
any other op, overlapping it with the compute where it can. MaxText's
`optimizer_memory_host_offload` does the same: its opt_state shardings
`.with_memory_kind(kind="pinned_host")`, and a device_put to the device's kind
before `apply_gradients` (src/maxtext/utils/maxtext_utils.py,
src/maxtext/trainers/pre_train/train.py).

    abstract = optimizer_on_host(abstract)       # the state's shapes, opt in pinned_host
    opt = to_device(state["opt"])                # in the step: fetched for the update
    ... optimizer.update(grads, opt, params) ...
    opt = to_host(opt)                           # and sent back

A CPU has no memory but the host's: JAX lists a pinned_host memory there too, but
offloading into it moves nothing and XLA's CPU plan counts neither side's bytes, so
it is refused there (check_offload).
"""

import jax

from sessions.errors import UsageError

HOST = "pinned_host"  # the memory kind of host DRAM a chip's DMA reaches (JAX's name)


def optimizer_on_host(abstract):
    """The training state's shapes ({"params", "opt"}, jax.ShapeDtypeStructs with
    shardings: sessions/train/step.py abstract_state) with every optimizer leaf's
    sharding moved to host memory, split over the devices as before."""

    def on_host(leaf):
        sharding = leaf.sharding.with_memory_kind(HOST)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return {**abstract, "opt": jax.tree.map(on_host, abstract["opt"])}


def to_device(tree):
    """Inside the step: the arrays of `tree` copied from host memory to the chip's,
    with their shardings otherwise as they were."""
    return jax.device_put(tree, jax.memory.Space.Device)


def to_host(tree):
    """Inside the step: the arrays of `tree` copied back to host memory."""
    return jax.device_put(tree, jax.memory.Space.Host)


def check_offload(offload, platform, collectives="auto"):
    """Refuse, on one line, an offload this run cannot do: none on a CPU (its memory
    is the host's already), and none in the step written by hand (--collectives
    manual, sessions/train/manual_fsdp.py), which places its own arrays."""
    if offload == "none":
        return
    if platform == "cpu":
        raise UsageError(
            f"--offload {offload}: this CPU has no memory apart from the host's, so there "
            "is nothing to offload into; compile for a chip with --target (h100:1, tpu-v5e:2x2)"
        )
    if collectives != "auto":
        raise UsageError(f"--offload {offload} takes --collectives auto, not {collectives}")


def planned_host_bytes(memory):
    """Bytes in host memory by XLA's plan (`compiled.memory_analysis()`), as
    roofline/memory.py planned_bytes counts a device's: arguments, outputs and
    temporaries, less the outputs that reuse donated arguments. None where the
    stats have no host fields."""
    fields = ("argument", "output", "temp", "alias")
    sizes = [getattr(memory, f"host_{f}_size_in_bytes", None) for f in fields]
    if None in sizes:
        return None
    argument, output, temp, alias = sizes
    return argument + output + temp - alias

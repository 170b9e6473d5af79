"""Device memory a training step needs, from the best source at hand.

XLA's plan of the compiled step comes first, on every platform. The other
figure, a GPU's or TPU's `peak_bytes_in_use`, is the allocator's peak over
the whole process, and it never comes down: a calibration run before training
(an unknown chip's matmul and copy, roofline/calibrate.py), the evaluation
step, sampling and the initialisation all leave their own peaks in it. So it
is reported only beside the plan, as what it is, or alone when there is no
compiled step (--no-jit) and nothing but the step can have set it.
"""

import contextlib
import os

import jax

from roofline.units import capacity, gb

PLAN = "XLA's memory plan of the compiled step"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"

# device id -> (allocator peak before, after) for work done outside the step that
# raised it, in this process: the calibration (roofline/calibrate.py measure).
_raised_outside_the_step = {}


def step_memory(compiled=None, device=None):
    """(bytes per device, where the figure comes from), or (None, reason).

    XLA's plan for the compiled step (arguments, outputs and temporaries, less
    the outputs that reuse donated arguments) when there is one: the step's own
    need, the same figure on every platform and the one --target gives for chips
    this machine lacks. Without a compiled step, the allocator's peak, unless
    work outside the step set it."""
    device = device or jax.local_devices()[0]
    plan = compiled.memory_analysis() if compiled is not None else None
    if plan is not None:
        return planned_bytes(plan), PLAN
    peak, source = allocator_peak(device)
    if peak is not None and _set_outside_the_step(device, peak):
        return None, f"not known: the {source}, and there is no compiled step to plan"
    return peak, source


def allocator_peak(device=None):
    """(the allocator's peak bytes in use over this process's life, what it covers),
    or (None, reason) where the backend keeps no count (a CPU)."""
    device = device or jax.local_devices()[0]
    peak = _peak(device)
    if peak is None:
        return None, "not reported by this backend"
    if _set_outside_the_step(device, peak):
        before, after = _raised_outside_the_step[device.id]
        return peak, (
            f"allocator peak over the process, set by calibration "
            f"({(after - before) / 2**20:,.1f} MiB above what came before)"
        )
    return peak, "allocator peak over the process"


@contextlib.contextmanager
def outside_the_step(device):
    """Work that is not the training step (a calibration): if it raises the
    device allocator's lifetime peak, remember by how much, so that peak is
    never reported as the step's."""
    before = _peak(device)
    try:
        yield
    finally:
        after = _peak(device)
        if before is not None and after is not None and after > before:
            _raised_outside_the_step[device.id] = (before, after)


def _set_outside_the_step(device, peak):
    """Whether the peak is still the one work outside the step left (nothing since
    has gone higher)."""
    raised = _raised_outside_the_step.get(device.id)
    return raised is not None and peak <= raised[1]


def _peak(device):
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return (stats or {}).get("peak_bytes_in_use")


def planned_bytes(m):
    """Bytes one device needs by XLA's plan (`compiled.memory_analysis()`):
    arguments, outputs and temporaries, less the outputs that reuse donated
    arguments (counted once, as arguments)."""
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def usable_fraction(platform):
    """The share of a device's HBM a JAX program may plan for: on a GPU, what
    JAX's client preallocates for arrays (XLA_PYTHON_CLIENT_MEM_FRACTION, default
    .75: docs.jax.dev/en/latest/gpu_memory_allocation.html), which XLA's compiler
    also plans within (its rematerialization aims below it); a TPU's, all."""
    if platform != "gpu":
        return 1.0
    return float(os.environ.get(MEM_FRACTION, "0.75"))


def usable_line(chip):
    """The planners' line beside "fits" (which stays against the whole HBM): how much
    of one GPU's memory JAX preallocates for arrays, None off a GPU. JAX takes its share
    of the memory free when it starts: 63,763,906,560 bytes on an H100 80GB whose
    nvidia-smi read 81,559 MiB (measured, docs/h100-run-2/README.md)."""
    if chip.platform != "gpu":
        return None
    share = usable_fraction("gpu") * chip.hbm_bytes
    how = f"={os.environ[MEM_FRACTION]}" if MEM_FRACTION in os.environ else ", its default"
    return (
        f"usable by JAX: {usable_fraction('gpu'):.0%} = {share / 2**30:,.1f} GiB ({gb(share)}) "
        f"of {capacity(chip.hbm_bytes, decimal=False)} a chip ({MEM_FRACTION}{how}; "
        "'fits' is against the whole HBM)"
    )


def largest_batch(fits, unit, start):
    """The largest multiple of `unit` for which fits(batch) holds, from `start`
    (a multiple of unit that fits): doubling, then bisecting; fits is assumed
    to hold below any batch where it holds."""
    good, bad = start, None
    while bad is None:
        if fits(2 * good):
            good *= 2
        else:
            bad = 2 * good
    while bad - good > unit:
        middle = (good + bad) // 2 // unit * unit
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good

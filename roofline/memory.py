"""Device memory a training step needs, from the best source at hand."""

import jax


def step_memory(compiled=None, device=None):
    """(bytes per device, where the figure comes from), or (None, reason).

    A GPU or TPU reports the peak its allocator saw; a CPU reports nothing, so
    XLA's plan for the compiled step is used instead: arguments, outputs and
    temporaries, less the outputs that reuse donated arguments."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"], "allocator peak"
    if compiled is None:
        return None, "not reported by this backend"
    return planned_bytes(compiled.memory_analysis()), "XLA's memory plan of the compiled step"


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

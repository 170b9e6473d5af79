"""Stand-ins for the devices of a TPU pod slice, laid out as JAX's own tests lay them.

`mock_tpu_devices` gives what jax.devices() returns on a slice of x * y * z chips:
the same ids, coordinates, process indices and order as `mock_tpu_devices` in
jax-ml/jax tests/mesh_utils_test.py (read at commit 0423b612f8b9f1e32d10267bad8594fb6bbc65d6),
written out here loop by loop. Each host is a 2x2x1 tray of 4 chips; processes
are numbered x-fastest over the trays, then over slices; device ids count chips
x-fastest over the whole slice (a chip's cores side by side), slice after slice.

SLICES names the slices docs/multihost.md's pod section talks about, by their device
kind strings as the chips report them (libtpu's names, the ones
roofline/hardware.py matches: a v5p says "TPU v5", a v5e "TPU v5 lite").
"""

import dataclasses
import itertools
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class MockTpuDevice:
    id: int
    platform: str
    device_kind: str
    process_index: int
    coords: Sequence[int]
    core_on_chip: int
    slice_index: int = 0


def mock_tpu_devices(x, y, z, dev_kind, one_device_per_chip, num_slices=1):
    """jax.devices() of num_slices slices of x * y * z chips (x, y even), in host order.

    one_device_per_chip: megacore, as v4, v5p, v5e, v6e show their chips; else
    each chip's two TensorCores are two devices."""
    cores = 1 if one_device_per_chip else 2
    trays_x, trays_y = x // 2, y // 2
    devices = []
    hosts = itertools.product(range(num_slices), range(z), range(trays_y), range(trays_x))
    for s, cz, ty, tx in hosts:
        process = tx + trays_x * (ty + trays_y * (cz + z * s))
        for dy, dx, core in itertools.product(range(2), range(2), range(cores)):
            cx, cy = 2 * tx + dx, 2 * ty + dy
            chip = cx + x * (cy + y * (cz + z * s))
            devices.append(
                MockTpuDevice(core + cores * chip, "tpu", dev_kind, process, (cx, cy, cz), core, s)
            )
    return devices


# name: (x, y, z chips, device kind). "v5p-N" and "v4-N" count TensorCores, two a
# chip, shown as one device (megacore); "v5e-N" and "v6e-N" count chips.
SLICES = {
    "v4-32": (2, 2, 4, "TPU v4"),
    "v5p-32": (2, 2, 4, "TPU v5"),
    "v5p-64": (2, 4, 4, "TPU v5"),
    "v5e-16": (4, 4, 1, "TPU v5 lite"),
    "v6e-16": (4, 4, 1, "TPU v6 lite"),
    "v6e-32": (4, 8, 1, "TPU v6 lite"),
    "v4-128": (4, 4, 4, "TPU v4"),
}


def slice_devices(name, num_slices=1):
    """jax.devices() of the named slice (SLICES), num_slices of them."""
    x, y, z, kind = SLICES[name]
    return mock_tpu_devices(x, y, z, kind, one_device_per_chip=True, num_slices=num_slices)

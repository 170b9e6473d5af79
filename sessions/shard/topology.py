"""Which device sits where in the mesh: a TPU slice is a torus of chips, and
the mesh's axes are laid over its wires.

A TPU slice is a grid of chips, 2D (v5e, v6e: 4x4, 4x8, ...) or 3D (v4, v5p:
2x2x4, 4x4x4, ...), each chip wired by ICI (inter-chip interconnect) to its
neighbours along every physical axis x, y, z; where the slice has wraparound
links, each row of chips closes into a ring, a torus. A collective over a
ring of neighbours (all-gather, reduce-scatter) is as fast as ICI goes.

Our mesh's axes data, fsdp, tp are logical: `--mesh fsdp=8,tp=2` says nothing
about wires. Building the mesh means choosing which physical axes each logical
axis runs along. On a 4x4 slice, tp=4 along x and fsdp=4 along y gives each
axis whole rings. fsdp=8,tp=2 cannot: no physical axis has 2 chips or 8, so
tp takes half of x and fsdp the other half of x times all of y. That is
splitting a physical axis. It is allowed (any order of devices computes the
same result) but costs speed: split a ring of 4 chips into 2 x 2 and one
logical axis pairs chips two hops apart (0 with 2, 1 with 3), its groups no
longer rings of neighbours closed by the torus, its traffic crossing links
the other axis uses; its collectives are slower. So JAX's mesh_utils refuses
to split unless asked (jax.make_mesh asks only on v5e); we ask, rather than
refuse a mesh that runs correctly, only slower.

Several slices (a multi-slice run) are joined by DCN, the data-centre network,
far slower than ICI. Only `data` can cross it: its one collective per step
(the gradient all-reduce) tolerates a slow link, while fsdp's all-gathers and
tp's per-layer collectives would crawl. So a run over slices puts data across
them and every other axis within each slice.

CPU and GPU devices have no torus to respect: they keep the order given.
"""

import math

import numpy as np
from jax.experimental import mesh_utils

from sessions.errors import UsageError

AXES = ("data", "fsdp", "tp")  # ordered as mesh_utils wants: least network traffic first


def mesh_flag(shape):
    """(2, 16, 1) -> 'data=2,fsdp=16', as --mesh takes it."""
    return ",".join(f"{a}={n}" for a, n in zip(AXES, shape) if n > 1) or "data=1"


def _slice_groups(devices):
    """The devices of each slice, by slice index. Devices with no slice (CPU, GPU)
    or no slice index (compile-only TPUs) are one slice."""
    groups = {}
    for d in devices:
        groups.setdefault(getattr(d, "slice_index", None), []).append(d)
    return list(groups.values())


def _build_one_slice(shape, devices):
    try:
        return mesh_utils.create_device_mesh(shape, devices)
    except NotImplementedError:
        # No whole physical axes give this shape: split some (the docstring says
        # what that costs: rings of non-neighbours, no wraparound, slower collectives).
        return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except AssertionError:
        # mesh_utils reads a slice as a whole cuboid of chips, one device each
        # (megacore). Devices it cannot read so, such as a TPU v4 compiled for
        # without chips (roofline/plan/targets.py), which shows each chip's two
        # TensorCores as two devices, keep their own order: chip by chip.
        return np.array(devices).reshape(shape)


def _build_over_slices(shape, slices, devices):
    n = len(slices)
    if shape[0] % n:
        raise UsageError(
            f"data={shape[0]} must be a multiple of the {n} slices: only data crosses "
            "the slow network between slices"
        )
    if len({len(s) for s in slices}) > 1:
        counts = ", ".join(str(len(s)) for s in slices)
        raise UsageError(f"the slices hold {counts} devices; a mesh spans whole slices")
    within = (shape[0] // n, shape[1], shape[2])  # over ICI, inside each slice
    across = (n, 1, 1)  # over DCN: slice i holds data rows i*within[0] .. (i+1)*within[0]-1
    try:
        return mesh_utils.create_hybrid_device_mesh(within, across, devices)
    except NotImplementedError:  # as in one slice: split physical axes
        return mesh_utils.create_hybrid_device_mesh(
            within, across, devices, allow_split_physical_axes=True
        )


def _grid(shape, devices):
    if math.prod(shape) != len(devices):
        raise UsageError(f"{math.prod(shape)} devices needed, {len(devices)} given")
    if devices[0].platform != "tpu":
        return np.array(devices).reshape(shape)  # no torus: the order the caller gave
    slices = _slice_groups(devices)
    if len(slices) > 1:
        return _build_over_slices(shape, slices, devices)
    return _build_one_slice(shape, devices)


def _mesh_shapes(n):
    """Every (data, fsdp, tp) whose product is n."""
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    return [(d, n // d // t, t) for d in divisors for t in divisors if (n // d) % t == 0]


def nearest_mesh(shape, devices):
    """The mesh that builds on these devices closest to `shape`, or None.

    Closest: fewest factors moved between axes (log2 distance), then tp kept as
    asked, then fsdp: tp is the most sensitive to the network, fsdp the next."""

    def distance(c):
        moved = sum(abs(math.log2(a / b)) for a, b in zip(c, shape))
        return moved, c[2] != shape[2], c[1] != shape[1]

    for candidate in sorted(_mesh_shapes(len(devices)), key=distance):
        try:
            _grid(candidate, devices)
        except UsageError:
            continue
        return candidate
    return None


def device_grid(sizes, devices):
    """The devices as an array shaped (data, fsdp, tp), for jax.sharding.Mesh.

    sizes: {'data': .., 'fsdp': .., 'tp': ..}, whose product is len(devices).
    A TPU slice: laid over its torus by mesh_utils, splitting physical axes
    where the shape needs it. Several slices: data across them. Other devices:
    their given order. A mesh that cannot be built is a UsageError naming one
    that can."""
    shape = tuple(sizes[a] for a in AXES)
    devices = list(np.asarray(devices).flat)
    try:
        return _grid(shape, devices)
    except UsageError as e:
        near = nearest_mesh(shape, devices)
        hint = f"--mesh {mesh_flag(near)} builds" if near else "no mesh of them builds"
        raise UsageError(
            f"mesh {mesh_flag(shape)} over {len(devices)} devices: {e}; {hint}"
        ) from None

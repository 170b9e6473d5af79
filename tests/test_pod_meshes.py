"""Meshes a pod can build: every --mesh whose sizes multiply to the device count
builds on each TPU slice, over the torus where whole physical axes allow it and
splitting them where not; a run over several slices puts data across them; CPU
and GPU devices keep their order. The slices are stand-ins laid out as JAX's own
tests lay them (tests/pod_devices.py); what JAX alone refuses is asked of JAX.
"""

import dataclasses

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils
from pod_devices import SLICES, mock_tpu_devices, slice_devices

from sessions.errors import UsageError
from sessions.shard import sharding
from sessions.shard.topology import device_grid

AXES = ("data", "fsdp", "tp")


def every_mesh(n):
    """Every {data, fsdp, tp} whose product is n, counted here by hand."""
    found = []
    for data in range(1, n + 1):
        for tp in range(1, n // data + 1):
            if n % (data * tp) == 0:
                found.append({"data": data, "fsdp": n // (data * tp), "tp": tp})
    return found


def ids(grid):
    return sorted(d.id for d in grid.flat)


@pytest.mark.parametrize("name", list(SLICES))
def test_every_mesh_builds_on_each_slice_holding_each_device_once(name):
    devices = slice_devices(name)
    n = len(devices)
    meshes = every_mesh(n)
    readme = [{"fsdp": n}, {"data": 2, "fsdp": n // 2}, {"fsdp": n // 2, "tp": 2}]
    assert all({**dict.fromkeys(AXES, 1), **m} in meshes for m in readme)
    for sizes in meshes:
        mesh = sharding.make_mesh(sizes, devices)
        assert mesh.axis_names == AXES
        assert mesh.devices.shape == (sizes["data"], sizes["fsdp"], sizes["tp"])
        assert ids(mesh.devices) == sorted(d.id for d in devices), sizes


# What the issue found: jax.make_mesh (which splits physical axes only on a v5e) refuses these.
REFUSED_BY_JAX = [
    ("v6e-16", {"data": 1, "fsdp": 8, "tp": 2}),
    ("v6e-16", {"data": 2, "fsdp": 8, "tp": 1}),
    ("v6e-32", {"data": 1, "fsdp": 16, "tp": 2}),
    ("v4-128", {"data": 1, "fsdp": 32, "tp": 2}),
    ("v4-128", {"data": 2, "fsdp": 32, "tp": 1}),
]


@pytest.mark.parametrize(
    "name, sizes",
    REFUSED_BY_JAX,
    ids=[f"{n}-{s['data']}x{s['fsdp']}x{s['tp']}" for n, s in REFUSED_BY_JAX],
)
def test_meshes_jax_refuses_without_splitting_now_build(name, sizes):
    devices = slice_devices(name)
    shape = tuple(sizes[a] for a in AXES)
    with pytest.raises(NotImplementedError, match="Failed to find assignment"):
        mesh_utils.create_device_mesh(shape, devices)  # whole physical axes only
    with pytest.raises(NotImplementedError):
        jax.make_mesh(shape, AXES, devices=devices)
    grid = sharding.make_mesh(sizes, devices).devices
    assert grid.shape == shape
    assert ids(grid) == sorted(d.id for d in devices)


@pytest.mark.parametrize("name", list(SLICES))
def test_where_whole_physical_axes_suffice_the_grid_is_mesh_utils_own(name):
    """Splitting costs speed: a mesh that needs none is laid out exactly as
    mesh_utils lays it without splitting."""
    devices = slice_devices(name)
    checked = 0
    for sizes in every_mesh(len(devices)):
        shape = tuple(sizes[a] for a in AXES)
        try:
            whole = mesh_utils.create_device_mesh(shape, devices)
        except NotImplementedError:
            continue
        assert device_grid(sizes, devices).tolist() == whole.tolist(), sizes
        checked += 1
    assert checked >= 3


def test_a_v4_showing_two_cores_per_chip_builds_in_its_own_order():
    """Compiled for without chips, a v4 slice shows each chip's two TensorCores as
    two devices, which mesh_utils cannot read as a torus; the given order is kept."""
    devices = mock_tpu_devices(2, 2, 1, "TPU v4", one_device_per_chip=False)
    with pytest.raises(AssertionError, match="one device per chip"):
        mesh_utils.create_device_mesh((1, 8, 1), devices)
    for sizes in every_mesh(8):
        grid = device_grid(sizes, devices)
        assert list(grid.flat) == devices, sizes


def test_cpu_and_gpu_devices_keep_the_order_given():
    backwards = jax.devices()[::-1]
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tp": 2}, np.array(backwards))
    assert list(mesh.devices.flat) == backwards
    # mesh_utils itself would sort GPUs by id; a caller's order is kept instead.
    stand_ins = mock_tpu_devices(2, 2, 2, "NVIDIA H100 80GB HBM3", one_device_per_chip=True)
    gpus = [dataclasses.replace(d, platform="gpu") for d in stand_ins][::-1]
    assert list(device_grid({"data": 1, "fsdp": 4, "tp": 2}, gpus).flat) == gpus


@pytest.mark.parametrize("name", ["v5e-16", "v6e-16"])
@pytest.mark.parametrize(
    "sizes",
    [
        {"data": 2, "fsdp": 16, "tp": 1},
        {"data": 4, "fsdp": 8, "tp": 1},
        {"data": 2, "fsdp": 8, "tp": 2},  # within a slice: fsdp=8, tp=2, split on a 4x4
    ],
    ids=["data2-fsdp16", "data4-fsdp8", "data2-fsdp8-tp2"],
)
def test_two_slices_put_data_across_them(name, sizes):
    both = slice_devices(name, num_slices=2)  # 16 devices a slice
    devices = [d for pair in zip(both[:16], both[16:]) for d in pair]  # given interleaved
    mesh = sharding.make_mesh(sizes, devices)
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 3
    grid = mesh.devices
    assert ids(grid) == sorted(d.id for d in devices)
    rows_per_slice = sizes["data"] // 2
    for i in range(sizes["data"]):
        # data rows 0 .. rows_per_slice - 1 on slice 0, the rest on slice 1
        assert {d.slice_index for d in grid[i].flat} == {i // rows_per_slice}, i


@pytest.mark.parametrize(
    "sizes, named",
    [
        ({"data": 1, "fsdp": 32, "tp": 1}, "--mesh data=2,fsdp=16 builds"),
        ({"data": 1, "fsdp": 16, "tp": 2}, "--mesh data=2,fsdp=8,tp=2 builds"),
    ],
    ids=["fsdp32", "fsdp16-tp2"],
)
def test_data_not_across_the_slices_is_refused_in_one_line_naming_a_mesh_that_builds(sizes, named):
    """Every mesh of one slice builds (above), so the refusal shown is the multi-slice one."""
    devices = slice_devices("v5e-16", num_slices=2)
    with pytest.raises(UsageError) as refused:
        sharding.make_mesh(sizes, devices)
    message = str(refused.value)
    assert "\n" not in message
    assert "data=1" in message and "2 slices" in message
    assert message.endswith(named)
    flag = named.split()[1]
    built = sharding.make_mesh(sharding.parse_mesh(flag, len(devices)), devices)
    assert built.shape["data"] == 2 and built.shape["tp"] == sizes["tp"]  # tp kept as asked

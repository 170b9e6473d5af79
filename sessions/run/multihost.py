"""Past one machine: JAX's multi-controller runtime.

Every host runs the same script. `jax.distributed.initialize` joins them:
afterwards `jax.devices()` lists the devices of every host, a mesh spans them
all, and each process feeds only the rows of the batch its own devices hold
(sharding.process_rows / place_batch). On one machine, several CPU processes
joined over loopback take the same path (scripts/launch_local.py).

Where the coordinator comes from, first match wins:
    --coordinator HOST:PORT --num-processes N --process-id I
    HPLLM_COORDINATOR, HPLLM_NUM_PROCESSES, HPLLM_PROCESS_ID (set by launch_local.py)
    --coordinator auto: JAX finds them itself (Cloud TPU pod slices, SLURM, Open MPI)

A pod's order, on one machine: a TPU mesh orders devices by their place in the
torus, so each host's chips hold scattered blocks of the batch (host 0 of a
v5e-16 holds blocks 0, 1, 6 and 15 of 16), while CPU processes give a mesh
their devices in process order. HPLLM_DEVICE_ORDER (launch_local.py
--device-order) gives the order the mesh takes them in, so the
scattered case runs here too.
"""

import os

import jax
import numpy as np

from sessions.errors import UsageError


def add_flags(parser):
    parser.add_argument(
        "--coordinator",
        default=os.environ.get("HPLLM_COORDINATOR"),
        help="HOST:PORT of process 0, or 'auto' on a TPU pod / SLURM",
    )
    parser.add_argument("--num-processes", type=int, default=_env_int("HPLLM_NUM_PROCESSES"))
    parser.add_argument("--process-id", type=int, default=_env_int("HPLLM_PROCESS_ID"))


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def initialize(coordinator, num_processes, process_id):
    """Join the other processes, if this run has any (--coordinator HOST:PORT or
    auto, --num-processes, --process-id). A no-op for one process."""
    if not coordinator:
        return
    if coordinator == "auto":
        jax.distributed.initialize()
        return
    if num_processes is None or process_id is None:
        raise UsageError("--coordinator needs --num-processes and --process-id")
    if not 0 <= process_id < num_processes:
        raise UsageError(f"--process-id {process_id} is not in [0, {num_processes})")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def mesh_devices():
    """jax.devices(), in HPLLM_DEVICE_ORDER's order when it is set: positions in
    jax.devices(), which lists process 0's devices first, then process 1's..."""
    devices = jax.devices()
    order = os.environ.get("HPLLM_DEVICE_ORDER")
    if not order:
        return devices
    positions = [int(i) for i in order.split(",")]
    if sorted(positions) != list(range(len(devices))):
        raise UsageError(f"HPLLM_DEVICE_ORDER {order}: not an order of 0..{len(devices) - 1}")
    return [devices[i] for i in positions]


def every_process(value):
    """int32 [processes]: each process's value, on every process (one all-gather)."""
    if jax.process_count() == 1:
        return np.array([value], np.int32)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.int32(value)))


def gather(tree):
    """Every process gets the whole tree (e.g. the params, to sample from)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)

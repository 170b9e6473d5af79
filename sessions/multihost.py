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
"""

import os

import jax

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


def initialize(args):
    """Join the other processes, if this run has any. A no-op for one process."""
    if not args.coordinator:
        return
    if args.coordinator == "auto":
        jax.distributed.initialize()
        return
    if args.num_processes is None or args.process_id is None:
        raise UsageError("--coordinator needs --num-processes and --process-id")
    if not 0 <= args.process_id < args.num_processes:
        raise UsageError(f"--process-id {args.process_id} is not in [0, {args.num_processes})")
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def gather(tree):
    """Every process gets the whole tree (e.g. the params, to sample from)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)

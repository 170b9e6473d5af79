"""Start N CPU processes on this machine, joined over loopback into one JAX
runtime: the multi-host path of s2_train.py, without a cluster.

    python scripts/launch_local.py --processes 2 --devices-per-process 4 -- --preset tiny --steps 5

Each process gets M simulated CPU devices, so the mesh spans N x M devices
across N processes, as it would span the hosts of a TPU pod slice. A CPU mesh
takes the devices process by process; a pod's takes them in torus order, which
scatters each host's blocks of the batch. --device-order interleaved (device k
of process p at mesh position k * N + p) or a list of positions in
jax.devices() gives the
mesh a pod-like order (sessions/run/multihost.py, HPLLM_DEVICE_ORDER).

Process 0's output is shown; the others' go to LOG_DIR/process_I.log.
Exit status: the first non-zero status of any process, else 0. A process that
stops on a signal (status 130) leaves the others a minute to stop too, after
the same step, as they agree to (sessions/run/preemption.py).
"""

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time

from scripts.harness import simulated_cpu_flags

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sessions", "s2_train.py"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--log-dir", default="runs/launch_local")
    parser.add_argument(
        "--device-order",
        help="the mesh's device order: 'interleaved', or positions in jax.devices() '0,4,1,5,...'",
    )
    parser.add_argument(
        "train_args", nargs=argparse.REMAINDER, help="flags for s2_train.py, after --"
    )
    args = parser.parse_args(argv)
    if args.processes < 1 or args.devices_per_process < 1:
        print("error: --processes and --devices-per-process must be positive", file=sys.stderr)
        return 2
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    order = device_order(args.device_order, args.processes, args.devices_per_process)

    os.makedirs(args.log_dir, exist_ok=True)
    coordinator = f"127.0.0.1:{free_port()}"
    with contextlib.ExitStack() as stack:
        procs = []
        for i in range(args.processes):
            env = dict(os.environ)
            env.update(
                {
                    "HPLLM_COORDINATOR": coordinator,
                    "HPLLM_NUM_PROCESSES": str(args.processes),
                    "HPLLM_PROCESS_ID": str(i),
                    "XLA_FLAGS": simulated_cpu_flags(
                        args.devices_per_process, os.environ.get("XLA_FLAGS")
                    ),
                    "JAX_PLATFORMS": "cpu",
                    "HPLLM_DEVICE_ORDER": order,
                }
            )
            log = os.path.join(args.log_dir, f"process_{i}.log")
            out = None if i == 0 else stack.enter_context(open(log, "w"))
            command = [sys.executable, SCRIPT, *train_args]
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))
        try:
            return wait_all(procs)
        except KeyboardInterrupt:  # Ctrl-C reached every child too: they stop together
            return wait_all(procs)


def device_order(text, processes, per_process):
    """HPLLM_DEVICE_ORDER's value: '' (process order), or positions in
    jax.devices() in mesh order; process p's devices are at positions
    p * per_process ... (p + 1) * per_process - 1."""
    if not text:
        return ""
    if text == "interleaved":
        ids = [p * per_process + k for k in range(per_process) for p in range(processes)]
        return ",".join(map(str, ids))
    return text  # checked by each process (multihost.mesh_devices)


INTERRUPTED = 130  # sessions/run/cli.py: stopped on a signal, after saving


def wait_all(procs, grace=60.0):
    """Wait for every process; if one fails, stop the rest (they would wait
    for it forever at the next collective) and return its status. One stopped
    by a signal gives the others `grace` seconds to stop after the same step."""
    deadline = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and set(failed) == {INTERRUPTED} and None in codes:
            deadline = deadline or time.monotonic() + grace
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())

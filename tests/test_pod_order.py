"""A pod's device order, on this machine: scattered batch rows, and one stop
for every host.

A TPU mesh orders devices by the torus, so each host's chips hold scattered
blocks of the batch. CPU processes give the mesh their devices process by
process unless launch_local.py --device-order says otherwise; these tests say
otherwise, then hold the losses against one process, and send SIGTERM to one
host of two.
"""

import json
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from helpers import PYTHON, REPO, run_python, subprocess_env
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from pod_devices import slice_devices

from sessions.model.config import PRESETS
from sessions.run.checkpoint import Checkpoints
from sessions.shard import sharding

TINY = ["--preset", "tiny", "--sample-bytes", "0"]
# One run, three ways: in one process, on two interleaved hosts never stopped, and on
# two such hosts stopped by SIGTERM and resumed. Two hosts of 2 devices: every step
# crosses the loopback, and 4 devices a host take several times as long a step.
RUN = [*TINY, "--steps", "20", "--log-every", "4", "--eval-every", "8", "--mesh", "fsdp=4"]
# 2 processes x 2 devices, the mesh taking them alternately: device k of process p at
# position 2k + p (launch_local.py --device-order interleaved), so process 0 holds
# blocks 0 and 2 of 4.
INTERLEAVED = "0,2,1,3"


def metrics_of(path):
    """step -> (loss, val_loss or None); a resumed run appends, the last word wins."""
    records = map(json.loads, path.read_text().splitlines())
    return {r["step"]: (r["loss"], r.get("val_loss")) for r in records}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """RUN on 2 processes x 2 devices, interleaved, never stopped: (process 0's
    output, step -> (loss, val_loss or None)). Both tests below read it."""
    folder = tmp_path_factory.mktemp("two_hosts")
    metrics = folder / "metrics.jsonl"
    launch = ["scripts/launch_local.py", "--processes", "2", "--devices-per-process", "2"]
    launch += ["--device-order", "interleaved", "--log-dir", str(folder)]
    outputs = ["--metrics-out", str(metrics), "--run-dir", str(folder)]
    result = run_python(*launch, "--", *RUN, *outputs)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout, metrics_of(metrics)


def test_interleaved_processes_train_and_evaluate_like_one(two_hosts, tmp_path):
    """2 processes x 2 devices, the mesh taking them alternately (process 0
    holds blocks 0 and 2 of 4): train and validation losses equal one
    process's, with the same mesh. Before each process loaded its own blocks,
    this died placing the first validation batch."""
    one = tmp_path / "one.jsonl"
    alone = ["--metrics-out", str(one), "--run-dir", str(tmp_path / "one")]
    result = run_python("sessions/s2_train.py", *RUN, *alone, devices=4)
    assert result.returncode == 0, result.stderr
    out, got = two_hosts
    assert "process 0 of 2 loads 8 of 16, blocks 0, 2 of 4" in out
    expected = metrics_of(one)
    assert sorted(got) == sorted(expected) == list(range(4, 21, 4))
    np.testing.assert_allclose([got[s][0] for s in got], [expected[s][0] for s in got], rtol=1e-4)
    validated = [s for s in sorted(expected) if expected[s][1] is not None]
    assert validated == [8, 16, 20]
    np.testing.assert_allclose(
        [got[s][1] for s in validated], [expected[s][1] for s in validated], rtol=1e-4
    )


def held_blocks(grid, process):
    """The blocks of the batch that `process` holds under P(("data", "fsdp")),
    read off the grid's positions: the device at [d, f, t] holds block d * F + f."""
    fsdp = grid.shape[1]
    return sorted(
        {
            d * fsdp + f
            for (d, f, _), device in np.ndenumerate(grid)
            if device.process_index == process
        }
    )


def readme_meshes(n):
    """The meshes docs/multihost.md shows for a slice of n chips, as (data, fsdp, tp)."""
    return [(1, n, 1), (2, n // 2, 1), (1, n // 2, 2), (2, n // 4, 2)]


@pytest.mark.parametrize("name", ["v4-32", "v5e-16", "v6e-32", "v5p-64"])
def test_each_process_loads_the_blocks_its_devices_hold(name):
    """On mock TPU devices in JAX's own torus order, for every mesh docs/multihost.md
    shows, process_rows gives each host exactly the rows of the blocks its
    chips hold, in order of where they start (what
    make_array_from_process_local_data expects); the hosts cover every row."""
    devices = slice_devices(name)
    for shape in readme_meshes(len(devices)):
        grid = sharding.make_mesh(dict(zip(sharding.AXES, shape)), devices).devices
        batch_sharding = NamedSharding(Mesh(grid, sharding.AXES), P(("data", "fsdp"), None))
        rows_per_block = 3
        batch = shape[0] * shape[1] * rows_per_block
        covered = set()
        for process in range(len(devices) // 4):
            rows = sharding.process_rows(batch_sharding, batch, 8, process=process)
            blocks = held_blocks(grid, process)
            expected = [b * rows_per_block + r for b in blocks for r in range(rows_per_block)]
            assert rows.tolist() == expected, (name, shape, process)
            covered.update(expected)
        assert covered == set(range(batch)), (name, shape)


def test_scattered_blocks_on_a_pod_are_not_one_range():
    """The case that crashed: host 0 of a v5e-16 under fsdp=16 holds blocks
    0, 1, 6 and 15 (JAX 0.10.2's create_device_mesh), which no slice covers."""
    grid = sharding.make_mesh({"data": 1, "fsdp": 16, "tp": 1}, slice_devices("v5e-16")).devices
    assert held_blocks(grid, 0) == [0, 1, 6, 15]


def start_host(process, coordinator, run_dir, argv):
    env = subprocess_env(2)
    env.update(
        {
            "HPLLM_COORDINATOR": coordinator,
            "HPLLM_NUM_PROCESSES": "2",
            "HPLLM_PROCESS_ID": str(process),
            "HPLLM_DEVICE_ORDER": INTERLEAVED,
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [PYTHON, "sessions/s2_train.py", *argv, "--run-dir", str(run_dir)]
    return subprocess.Popen(
        command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def free_coordinator():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_sigterm_to_one_host_stops_both_after_the_same_step(two_hosts, tmp_path):
    """SIGTERM reaches process 1 only. Both stop after the same step (the first
    log step whose agreement comes after the signal), save that one checkpoint
    together, exit 130, and --resume finishes on the trajectory of a run never
    stopped (the fixture's: the same hosts, the same mesh, the same order).

    The signal goes out once a log step's line is in the file. A host writes that
    line before it meets the other at the step's agreement (preemption.SaveHook),
    so a signal that lands in between stops both at that very step: the checkpoint
    is at or after the step read, and which depends on timing alone."""
    metrics = tmp_path / "metrics.jsonl"
    saving = ["--checkpoint-every", "1000", "--metrics-out", str(metrics)]
    slow = ["--data-delay-ms", "200"]  # 5 steps a second at most: 3.2 s left after step 4
    coordinator = free_coordinator()
    hosts = [start_host(p, coordinator, tmp_path, [*RUN, *saving, *slow]) for p in (0, 1)]
    try:
        while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            assert hosts[0].poll() is None, hosts[0].stdout.read()
            time.sleep(0.05)
        signalled_after = max(metrics_of(metrics))
        hosts[1].send_signal(signal.SIGTERM)
        outputs = [h.communicate(timeout=120)[0] for h in hosts]
    finally:
        for h in hosts:
            if h.poll() is None:
                h.kill()
    assert [h.returncode for h in hosts] == [130, 130], outputs
    stops = [line for out in outputs for line in out.splitlines() if line.startswith("stopped:")]
    assert len(stops) == 2 and stops[0] == stops[1], stops
    assert "SIGTERM on process 1 after step" in stops[0]
    preset = PRESETS["tiny"]
    with Checkpoints(tmp_path / "checkpoints", 0, preset.model, preset.train) as checkpoints:
        saved = checkpoints.steps()
    assert len(saved) == 1 and saved[0] % 4 == 0 and saved[0] >= signalled_after, saved
    assert f"after step {saved[0]};" in stops[0]

    coordinator = free_coordinator()
    hosts = [start_host(p, coordinator, tmp_path, [*RUN, *saving, "--resume"]) for p in (0, 1)]
    outputs = [h.communicate(timeout=300)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], outputs
    assert f"resumed from the checkpoint at step {saved[0]}" in outputs[0]

    _, expected = two_hosts
    got = metrics_of(metrics)
    assert sorted(got) == sorted(expected) == list(range(4, 21, 4))
    np.testing.assert_allclose(
        [got[s][0] for s in sorted(got)], [expected[s][0] for s in sorted(got)], rtol=1e-6
    )

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
from helpers import PYTHON, REPO, run_python, run_script, subprocess_env
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from pod_devices import slice_devices

from sessions.model.config import PRESETS
from sessions.run.checkpoint import Checkpoints
from sessions.shard import sharding

TINY = ["--preset", "tiny", "--sample-bytes", "0"]


def metrics_of(path):
    """step -> (loss, val_loss or None); a resumed run appends, the last word wins."""
    records = map(json.loads, path.read_text().splitlines())
    return {r["step"]: (r["loss"], r.get("val_loss")) for r in records}


def test_interleaved_processes_train_and_evaluate_like_one(tmp_path, capsys):
    """2 processes x 4 devices, the mesh taking them alternately (process 0
    holds blocks 0, 2, 4, 6 of 8): train and validation losses equal one
    process's, with the same mesh. Before each process loaded its own blocks,
    this died placing the first validation batch."""
    run = [*TINY, "--steps", "8", "--log-every", "2", "--eval-every", "4", "--mesh", "fsdp=8"]
    one = tmp_path / "one.jsonl"
    alone = ["--metrics-out", str(one), "--run-dir", str(tmp_path / "one")]
    code, _, err = run_script("sessions/s2_train.py", [*run, *alone], capsys)
    assert code == 0, err
    two = tmp_path / "two.jsonl"
    launch = ["scripts/launch_local.py", "--processes", "2", "--devices-per-process", "4"]
    launch += ["--device-order", "interleaved", "--log-dir", str(tmp_path)]
    outputs = ["--metrics-out", str(two), "--run-dir", str(tmp_path)]
    result = run_python(*launch, "--", *run, *outputs)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "process 0 of 2 loads 8 of 16, blocks 0, 2, 4, 6 of 8" in result.stdout
    expected, got = metrics_of(one), metrics_of(two)
    assert sorted(got) == sorted(expected) == [2, 4, 6, 8]
    np.testing.assert_allclose([got[s][0] for s in got], [expected[s][0] for s in got], rtol=1e-4)
    np.testing.assert_allclose(
        [got[s][1] for s in (4, 8)], [expected[s][1] for s in (4, 8)], rtol=1e-4
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


def test_sigterm_to_one_host_stops_both_after_the_same_step(tmp_path):
    """SIGTERM reaches process 1 only. Both stop after the same step (the first
    log step whose agreement comes after the signal), save that one checkpoint
    together, exit 130, and --resume finishes on the trajectory of a run never
    stopped.

    The signal goes out once a log step's line is in the file. A host writes that
    line before it meets the other at the step's agreement (preemption.SaveHook),
    so a signal that lands in between stops both at that very step: the checkpoint
    is at or after the step read, and which depends on timing alone."""
    metrics = tmp_path / "metrics.jsonl"
    # Two hosts over loopback take about 80 ms a step on a 2-core CPU: 32 steps, not 60.
    run = [*TINY, "--steps", "32", "--log-every", "4", "--eval-every", "32", "--mesh", "fsdp=4"]
    saving = ["--checkpoint-every", "1000", "--metrics-out", str(metrics)]
    slow = ["--data-delay-ms", "100"]  # 10 steps a second at most: 2.8 s left after step 4
    coordinator = free_coordinator()
    hosts = [start_host(p, coordinator, tmp_path, [*run, *saving, *slow]) for p in (0, 1)]
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
    hosts = [start_host(p, coordinator, tmp_path, [*run, *saving, "--resume"]) for p in (0, 1)]
    outputs = [h.communicate(timeout=300)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], outputs
    assert f"resumed from the checkpoint at step {saved[0]}" in outputs[0]

    # The run never stopped: the same two hosts, from the start to the end.
    reference = tmp_path / "reference.jsonl"
    launch = ["scripts/launch_local.py", "--processes", "2", "--devices-per-process", "2"]
    launch += ["--log-dir", str(tmp_path / "alone")]
    alone = ["--metrics-out", str(reference), "--run-dir", str(tmp_path / "alone")]
    result = run_python(*launch, "--", *run, *alone)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    expected, got = metrics_of(reference), metrics_of(metrics)
    assert sorted(got) == sorted(expected) == list(range(4, 33, 4))
    np.testing.assert_allclose(
        [got[s][0] for s in sorted(got)], [expected[s][0] for s in sorted(got)], rtol=1e-6
    )

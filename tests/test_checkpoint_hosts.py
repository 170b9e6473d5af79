"""Checkpoints on a pod: the folder is a URI every host shares, or a refusal.

On a pod each host writes its own shards, so a checkpoint is whole only in a
folder every host sees (a gs:// bucket). Two CPU processes joined over
loopback stand in for two hosts: started in different working folders, the
same relative path names two different folders, as a local path does on two
workers' own disks.
"""

import os
import socket
import subprocess
import sys

import pytest
from helpers import REPO, subprocess_env

from sessions.run.checkpoint import checkpoint_path

CHILD = """
import sys
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
from sessions.run.checkpoint import Checkpoints
from sessions.model.config import ModelConfig, TrainConfig
from sessions.errors import UsageError
for path in sys.argv[3:]:
    try:
        Checkpoints(path, 1, ModelConfig(), TrainConfig()).close()
    except UsageError as e:
        print(f"{path}: error: {e}")
    else:
        print(f"{path}: shared")
"""


def test_a_bucket_stays_a_bucket_and_a_local_folder_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(checkpoint_path("gs://course-bucket/run7/checkpoints")) == (
        "gs://course-bucket/run7/checkpoints"
    )
    assert str(checkpoint_path("runs/s2/checkpoints")) == str(tmp_path / "runs/s2/checkpoints")


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Two processes, each started in its own working folder, open Checkpoints
    on two paths in turn: the relative "checkpoints", which names a different
    folder on each, then SHARED, an absolute path both see. One pair of processes
    for both tests below: (exit statuses, outputs, SHARED)."""
    root = tmp_path_factory.mktemp("hosts")
    folders = [root / "host0", root / "host1"]
    for folder in folders:
        folder.mkdir()
    shared = root / "shared"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    env = subprocess_env(1)
    env["PYTHONPATH"] = REPO
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, coordinator, str(i), "checkpoints", str(shared)],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, folder in enumerate(folders)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outputs, shared


def test_hosts_that_see_different_folders_are_refused_on_every_host(two_hosts):
    codes, outputs, _ = two_hosts
    assert codes == [0, 0], outputs
    for out in outputs:
        (answer,) = [line for line in out.splitlines() if line.startswith("checkpoints: ")]
        assert answer.startswith("checkpoints: error: "), out
        assert "processes [1] do not see what process 0 writes there" in answer, out


def test_hosts_that_share_the_folder_go_on(two_hosts):
    codes, outputs, shared = two_hosts
    assert codes == [0, 0], outputs
    for out in outputs:
        assert f"{shared}: shared" in out.splitlines(), out
    assert os.listdir(shared) == []  # the token was removed

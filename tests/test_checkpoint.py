"""Checkpoints: a run killed at a random step resumes on the same trajectory;
a damaged checkpoint is skipped for the one before; a checkpoint restores
onto another mesh; and every misuse is one line with exit status 2."""

import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import (
    PYTHON,
    REPO,
    TINY_STEPS,
    run_python,
    run_script,
    s2_in_process,
    subprocess_env,
)

from sessions.errors import UsageError
from sessions.model.config import PRESETS
from sessions.run.checkpoint import Checkpoints, make_local, newest_meta
from sessions.shard import sharding
from sessions.train.step import init_state, make_optimizer

RUN = [
    "--preset",
    "tiny",
    "--steps",
    "40",
    "--checkpoint-every",
    "10",
    "--log-every",
    "1",
    "--sample-bytes",
    "0",
]


# Run as `python -c KILLER sessions/s2_train.py FLAGS`: s2_train.py, killed
# (SIGKILL, nothing flushed or cleaned up) right after the checkpoint of step
# $KILL_AFTER_SAVE is on disk, before the loop does anything else. Whatever the
# loop writes for a step after saving it is lost there, and the resumed run
# starts after that step: the worst point for a kill.
KILLER = """
import os, runpy, signal, sys
from sessions.run.checkpoint import Checkpoints
save = Checkpoints.maybe_save
def save_then_die(self, step, state, force=False):
    saved = save(self, step, state, force)
    if saved and step == int(os.environ["KILL_AFTER_SAVE"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return saved
Checkpoints.maybe_save = save_then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def start(tmp_path, name, *extra, kill_after_save=None):
    metrics = tmp_path / f"{name}.jsonl"
    env = subprocess_env(1)
    env["PYTHONUNBUFFERED"] = "1"  # a step's line reaches the test as it is printed
    command = [PYTHON, "sessions/s2_train.py"]
    if kill_after_save is not None:
        env["KILL_AFTER_SAVE"] = str(kill_after_save)
        command = [PYTHON, "-c", KILLER, "sessions/s2_train.py"]
    command += [*RUN, "--run-dir", str(tmp_path / name), "--metrics-out", str(metrics), *extra]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    return proc, metrics


def losses(metrics):
    """step -> loss; a resumed run appends, and the last word on a step wins."""
    return {r["step"]: r["loss"] for r in map(json.loads, metrics.read_text().splitlines())}


def wait_for_step(proc, step):
    for line in proc.stdout:
        if line.startswith(f"step {step:>6} "):
            return
    raise AssertionError(f"the run ended before step {step}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run the killed ones must match, started at once; wait() gives its losses."""
    tmp_path = tmp_path_factory.mktemp("full")
    proc, metrics = start(tmp_path, "full")
    done = {}

    def wait():
        if not done:
            output = proc.stdout.read()
            assert proc.wait() == 0, output
            done.update(losses(metrics))
        return done

    yield wait
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def resume_and_compare(tmp_path, metrics, expected, where):
    resumed = run_python(
        "sessions/s2_train.py",
        *RUN,
        "--run-dir",
        str(tmp_path / "killed"),
        "--metrics-out",
        str(metrics),
        "--resume",
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from the checkpoint at step" in resumed.stdout
    got = losses(metrics)
    assert sorted(got) == list(range(1, 41)), f"killed {where}: steps {sorted(got)}"
    np.testing.assert_allclose(
        [got[s] for s in range(1, 41)], [expected[s] for s in range(1, 41)], rtol=1e-6
    )


def test_killed_run_resumes_on_the_same_trajectory(tmp_path, uninterrupted):
    """Killed after a random step's line is printed."""
    kill_after = random.randint(12, 35)
    killed, killed_metrics = start(tmp_path, "killed")
    wait_for_step(killed, kill_after)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    resume_and_compare(tmp_path, killed_metrics, uninterrupted(), f"after step {kill_after}")


def test_killed_right_after_a_checkpoint_resumes_with_every_line(tmp_path, uninterrupted):
    """Killed the instant step 20's checkpoint is on disk: step 20's metrics
    line must already be in the file, since the resumed run starts at 21."""
    killed, killed_metrics = start(tmp_path, "killed", kill_after_save=20)
    output = killed.stdout.read()
    assert killed.wait() == -signal.SIGKILL, output
    with Checkpoints(tmp_path / "killed" / "checkpoints", 0, *_tiny(steps=40)) as checkpoints:
        assert checkpoints.steps() == [10, 20]
    resume_and_compare(tmp_path, killed_metrics, uninterrupted(), "right after saving step 20")


def test_sigterm_saves_then_stops_and_resume_finishes(tmp_path):
    proc, _ = start(tmp_path, "term", "--checkpoint-every", "1000")
    wait_for_step(proc, 5)
    proc.send_signal(signal.SIGTERM)
    output = proc.stdout.read()
    assert proc.wait() == 130, output
    assert "SIGTERM after step" in output and "--resume" in output
    with Checkpoints(tmp_path / "term" / "checkpoints", 0, *_tiny()) as checkpoints:
        saved = checkpoints.steps()
    assert len(saved) == 1 and saved[0] >= 5
    resumed = run_python(
        "sessions/s2_train.py",
        *RUN,
        "--checkpoint-every",
        "1000",
        "--run-dir",
        str(tmp_path / "term"),
        "--resume",
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from the checkpoint at step {saved[0]}" in resumed.stdout


def _tiny(**train):
    preset = PRESETS["tiny"]
    return preset.model, dataclasses.replace(preset.train, **train)


def _init(mesh_text):
    cfg, tc = _tiny()
    mesh = sharding.make_mesh(sharding.parse_mesh(mesh_text, 8))
    return functools.partial(init_state, cfg=cfg, optimizer=make_optimizer(tc, tc.steps)), mesh


def _abstract(mesh_text):
    """The state's shapes, each with its sharding on the mesh: what a restore reads into.
    Nothing is built, so no initialiser is compiled for a mesh that only restores."""
    init, mesh = _init(mesh_text)
    return sharding.abstract_sharded(init, jax.random.key(0), mesh)


def _state(mesh_text, seed=0):
    init, mesh = _init(mesh_text)
    # Under the mesh, as s2_train.py builds its state: one initialiser program for
    # this file's runs of it and for these states.
    with jax.set_mesh(mesh):
        state, _ = sharding.init_sharded(init, jax.random.key(seed), mesh)
    return state, _abstract(mesh_text)


def _assert_equal_trees(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_restores_onto_another_mesh_of_the_same_size(tmp_path):
    cfg, tc = _tiny()
    saved, _ = _state("fsdp=8")
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, saved)
    abstract = _abstract("fsdp=4,tp=2")
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        step, restored = checkpoints.restore_latest(abstract, log=print)
    assert step == 10
    _assert_equal_trees(restored, saved)
    for x, want in zip(jax.tree.leaves(restored), jax.tree.leaves(abstract)):
        assert x.sharding == want.sharding


def _two_saves(directory):
    """(cfg, tc, the state saved at step 10, the one at step 20, their shapes)."""
    cfg, tc = _tiny()
    first, abstract = _state("fsdp=8", seed=0)
    second, _ = _state("fsdp=8", seed=1)
    with Checkpoints(directory, 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, first)
        checkpoints.maybe_save(20, second)
    return cfg, tc, first, second, abstract


# When a read fails inside orbax, its asyncio machinery leaves a callback for
# a closed event loop; harmless, and not ours to fix.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_a_damaged_checkpoint_is_detected_and_the_previous_one_used(tmp_path, damage):
    cfg, tc, first, _, abstract = _two_saves(tmp_path)
    data_files = [
        p for p in (tmp_path / "20" / "state").rglob("*") if p.is_file() and "/d/" in str(p)
    ]
    assert data_files
    for path in data_files:
        raw = bytearray(path.read_bytes())
        if damage == "truncate":
            path.write_bytes(raw[: len(raw) // 2])
        else:
            mid = len(raw) // 2
            raw[mid : mid + 8] = bytes(8 * [0xAB])
            path.write_bytes(bytes(raw))
    notes = []
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        step, restored = checkpoints.restore_latest(abstract, notes.append)
    assert step == 10
    assert notes and notes[0].startswith("checkpoint 20:")
    _assert_equal_trees(restored, first)


def test_a_checkpoint_changed_on_disk_fails_its_fingerprint(tmp_path):
    """Damage orbax cannot see: step 20 rewritten whole and readable, with one
    weight changed and its metadata (fingerprint included) as saved."""
    cfg, tc, first, second, abstract = _two_saves(tmp_path)
    meta = newest_meta(tmp_path)  # step 20's, as saved
    assert meta["step"] == 20
    changed = jax.tree.map(lambda x: x, second)
    changed["params"]["final_norm"] = changed["params"]["final_norm"].at[0].add(1.0)
    shutil.rmtree(tmp_path / "20")
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        checkpoints.manager.save(
            20,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(changed), meta=ocp.args.JsonSave(meta)
            ),
        )
    notes = []
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        assert checkpoints.steps() == [10, 20]
        step, restored = checkpoints.restore_latest(abstract, notes.append)
    assert notes == [
        "checkpoint 20: its data does not match its fingerprint, trying the one before"
    ]
    assert step == 10
    _assert_equal_trees(restored, first)


def test_resume_with_nothing_to_resume(tmp_path, capsys):
    code, err = s2_in_process(["--preset", "tiny", "--resume", "--run-dir", str(tmp_path)], capsys)
    assert code == 2 and "no checkpoint in" in err and len(err.strip().splitlines()) == 1


def test_checkpoint_from_another_configuration(tmp_path, capsys):
    cfg, tc = _tiny()
    state, _ = _state("fsdp=8")
    with Checkpoints(tmp_path / "checkpoints", 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, state)
    argv = ["--preset", "tiny", "--embed", "64", "--resume", "--run-dir", str(tmp_path)]
    code, err = s2_in_process(argv, capsys)
    assert code == 2 and "another configuration" in err and "embed 64 here, 48 there" in err


def test_a_fresh_run_never_overwrites_checkpoints(tmp_path, capsys):
    cfg, tc = _tiny()
    state, _ = _state("fsdp=8")
    with Checkpoints(tmp_path / "checkpoints", 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, state)
    argv = ["--preset", "tiny", "--checkpoint-every", "5", "--run-dir", str(tmp_path)]
    code, err = s2_in_process(argv, capsys)
    assert code == 2 and "already holds checkpoints" in err and "--resume" in err


def test_every_checkpoint_damaged_is_an_error(tmp_path):
    cfg, tc = _tiny()
    state, abstract = _state("fsdp=8")
    with Checkpoints(tmp_path, 10, cfg, tc) as checkpoints:
        checkpoints.maybe_save(10, state)
    for path in (tmp_path / "10").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")
    with (
        Checkpoints(tmp_path, 10, cfg, tc) as checkpoints,
        pytest.raises(UsageError, match="damaged"),
    ):
        checkpoints.restore_latest(abstract, log=lambda line: None)


def test_a_diverged_state_is_never_saved_over_the_last_good_one(tmp_path, capsys):
    """The loss is read only on log steps: a checkpoint step between a
    divergence and the next log line must keep the last good checkpoint."""
    argv = [
        "--preset",
        "tiny",
        "--steps",
        "30",
        "--log-every",
        "30",
        "--checkpoint-every",
        "1",
        "--lr",
        "1e12",
    ]
    code, err = s2_in_process([*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 1
    assert "NaN or infinite by step" in err and "nothing was saved" in err
    cfg, tc = _tiny()
    tc = dataclasses.replace(tc, steps=30)
    with Checkpoints(tmp_path / "checkpoints", 1, cfg, tc) as checkpoints:
        kept = checkpoints.steps()
        _, restored = checkpoints.restore_latest(_abstract("fsdp=8"), log=lambda line: None)
    assert kept and kept[-1] < 30
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored))


@pytest.mark.parametrize(
    "where, every, message",
    [
        ("a file", "1", "a file, not a folder"),
        ("under a file", "1", "(Not a directory)"),
        ("under a file", "0", "(Not a directory)"),  # named: it saves at the end
        ("/proc/x", "1", "(No such file or directory)"),  # a folder no one can make
    ],
    ids=["file", "under-file", "under-file-named", "proc"],  # no spaces: mutants.py reads them
)
def test_a_checkpoint_folder_that_cannot_be_one_stops_the_run_before_its_first_step(
    tmp_path, capsys, where, every, message
):
    """One line, exit 2, and nothing trained: the folder is made when the run
    opens it, not at the first save, after the steps before it were computed."""
    if where == "/proc/x" and not os.path.isdir("/proc"):
        pytest.skip("no /proc on this system")
    (tmp_path / "a file").write_text("not a folder")
    folder = {"a file": tmp_path / "a file", "under a file": tmp_path / "a file" / "sub"}
    folder = str(folder.get(where, where))
    argv = ["--preset", "tiny", "--steps", "2", "--log-every", "1", "--run-dir", str(tmp_path)]
    code, out, err = run_script(
        "sessions/s2_train.py",
        [*argv, "--checkpoint-dir", folder, "--checkpoint-every", every],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint folder {folder}" in err and message in err
    assert "params + optimizer state" not in out  # stopped before the state was built


def test_a_named_checkpoint_folder_gets_the_last_step_without_checkpoint_every(tmp_path, capsys):
    """A user who names a folder expects a checkpoint in it at the end."""
    folder = tmp_path / "named"
    argv = ["--preset", "tiny", "--steps", str(TINY_STEPS), "--sample-bytes", "0"]
    argv += ["--run-dir", str(tmp_path)]
    code, err = s2_in_process([*argv, "--checkpoint-dir", str(folder)], capsys)
    assert code == 0, err
    assert newest_meta(str(folder))["step"] == TINY_STEPS
    # The folder left to its default is still kept empty without --checkpoint-every.
    code, err = s2_in_process(argv, capsys)
    assert code == 0, err
    assert not (tmp_path / "checkpoints").exists()


def test_a_bucket_is_never_made_as_a_local_folder(tmp_path, monkeypatch):
    """gs://bucket/run made locally would be a folder `gs:` in the working folder."""
    monkeypatch.chdir(tmp_path)
    make_local("gs://course-bucket/run7/checkpoints")
    assert list(tmp_path.iterdir()) == []
    make_local("local/checkpoints")
    assert (tmp_path / "local" / "checkpoints").is_dir()

"""Checkpoints that survive a kill, with orbax (the JAX ecosystem's checkpointer).

What is saved: the train state (params and optimizer state, sharded as they
live: each process writes its own shards), the step, and the configuration.
The data position needs no saving: batch `step` is a pure function of (seed,
step), so a resumed run reads exactly the batches it would have read.

Why a kill cannot lose the run: orbax writes each step into a temporary
folder and renames it into place only when complete, so a kill mid-save
leaves the previous checkpoint whole. Corruption that happens later, on disk,
is caught by a fingerprint of the state (a sum and a sum of squares per
array) stored beside it and checked on restore; a damaged checkpoint is
skipped for the one before it.

Where: any path orbax takes. A local folder is made absolute; a URI
(`gs://bucket/run`, `s3://...`) is kept as it is, so on a pod every host
writes its own shards into the same bucket and any host can restore the
whole state. (Made absolute, `gs://bucket/run` would become a folder named
`gs:` on each worker's own disk, holding a quarter of a checkpoint.)
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from sessions.errors import TrainingDiverged, UsageError
from sessions.model.config import LEVERS
from sessions.run.cli import make_folder

KEEP = 3  # the newest three checkpoints are kept


@jax.jit
def fingerprint(state):
    """Per array, (sum, sum of squares) in float32: any changed value shows."""
    return [
        jnp.stack([jnp.sum(x.astype(jnp.float32)), jnp.sum(jnp.square(x.astype(jnp.float32)))])
        for x in jax.tree.leaves(state)
    ]


def _fingerprint_list(state):
    return [[float(a), float(b)] for a, b in jax.device_get(fingerprint(state))]


def identity(cfg, tc, unit="byte"):
    """What must match for a checkpoint to continue this run. unit: what its
    tokens are, "byte" or "token" (a tokenizer's ids, from token files). Not the
    LEVERS, nor accum; but the weights' dtype and master, which the state holds."""
    return {
        "model": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in LEVERS},
        "batch": tc.batch,
        "seed": tc.seed,
        "steps": tc.steps,
        "unit": unit,
        "weights": tc.weights,
        "master": tc.master,
    }


def recipe(meta):
    """{weights, master} a checkpoint's state was saved with (float32, none: before
    they were saved)."""
    return {"weights": meta.get("weights", "float32"), "master": meta.get("master", False)}


def is_uri(directory):
    """Whether the folder is in a store (gs://bucket/run, s3://...), not on this disk."""
    return "://" in str(directory)


def checkpoint_path(directory):
    """The folder as orbax should see it: URIs (gs://, s3://) untouched, a local
    path absolute (orbax wants one, and the run's working folder may change)."""
    if is_uri(directory):
        try:
            return epath.Path(directory)
        except (KeyError, ValueError):  # epath knows gs://, s3://, az://, hf:// only
            raise UsageError(f"checkpoint folder {directory}: a URI orbax cannot write") from None
    return epath.Path(os.path.abspath(directory))


def make_local(directory):
    """Make a local checkpoint folder now, when the run opens it: a path that cannot be
    a folder (a file's name, or under /proc) stops the run before its first step, not
    at its first save. A URI is left to its store: a bucket has no folders to make."""
    if not is_uri(directory):
        make_folder(os.path.abspath(directory), "checkpoint folder")


def check_shared(path):
    """UsageError on every process unless all of them see the same folder.

    Each process writes its own shards, and a restore reads them all, so the
    folder must be one place for every host: a bucket or a shared file
    system. Process 0 leaves a token in it, every process looks for that
    token, and all of them agree on the answer (so all stop, or none)."""
    from jax.experimental import multihost_utils

    token = int(multihost_utils.broadcast_one_to_all(np.int64(int.from_bytes(os.urandom(6)))))
    marker = path / f".shared-by-every-process-{token}"
    if jax.process_index() == 0:
        marker.write_text("written by process 0; removed once every process has seen it")
    multihost_utils.sync_global_devices("checkpoint folder: token written")
    seen = multihost_utils.process_allgather(np.array([marker.exists()]))
    multihost_utils.sync_global_devices("checkpoint folder: token seen")
    if jax.process_index() == 0:
        marker.unlink()
    if not np.all(seen):
        missing = [i for i, ok in enumerate(np.ravel(seen)) if not ok]
        raise UsageError(
            f"checkpoint folder {path}: processes {missing} do not see what process 0 writes "
            "there; give every host one folder (a gs:// bucket or a shared file system)"
        )


def newest_meta(directory):
    """The metadata of the newest checkpoint in `directory` that has readable
    metadata ({"step", **identity, "fingerprint"}), or None: what a reader
    (sessions/s3_infer.py) needs to rebuild the state's shapes before restoring it."""
    path = checkpoint_path(directory)
    if not path.is_dir():
        return None  # and create nothing: this only reads
    manager = ocp.CheckpointManager(path)
    try:
        metas = (_read_meta(manager, step) for step in sorted(manager.all_steps(), reverse=True))
        return next((meta for meta in metas if meta is not None), None)
    finally:
        manager.close()


def _read_meta(manager, step):
    try:
        return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception:
        return None


class Checkpoints:
    """Saves every `every` steps (and when asked) into `directory`; restores the newest."""

    def __init__(self, directory, every, cfg, tc, unit="byte"):
        self.directory = str(checkpoint_path(directory))
        self.every = every
        self.identity = identity(cfg, tc, unit)
        make_local(directory)
        self.manager = ocp.CheckpointManager(
            checkpoint_path(directory),
            # Synchronous: the next step donates (reuses) the state's buffers,
            # and on a CPU an asynchronous save could still be reading them.
            options=ocp.CheckpointManagerOptions(
                max_to_keep=KEEP, create=True, enable_async_checkpointing=False
            ),
        )

        if jax.process_count() > 1:
            check_shared(checkpoint_path(directory))

    def steps(self):
        return sorted(self.manager.all_steps())

    def due(self, step, force=False):
        """Whether a save after `step` steps is called for and not yet done."""
        wanted = force or (self.every and step % self.every == 0)
        return bool(wanted) and step not in self.manager.all_steps()

    def maybe_save(self, step, state, force=False):
        """Save after `step` steps if it is a checkpoint step (or forced).

        A state holding NaN or infinity is never saved: the loss is only read
        on log steps, and a checkpoint taken between a divergence and the next
        log line must not replace the last good one."""
        if not self.due(step, force):
            return False
        fingerprint = _fingerprint_list(state)
        if not np.all(np.isfinite(fingerprint)):
            kept = self.steps()
            raise TrainingDiverged(
                f"the weights became NaN or infinite by step {step}; nothing was saved, "
                f"the last good checkpoint is {f'step {kept[-1]}' if kept else 'none'}"
            )
        meta = {"step": step, **self.identity, "fingerprint": fingerprint}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        return True

    def restore_latest(self, like, log=print):
        """(step, state) from the newest intact checkpoint, placed with the
        shardings of `like` (a tree of arrays or ShapeDtypeStructs), which may
        be another mesh than the one that saved it."""
        steps = self.steps()
        if not steps:
            raise UsageError(f"--resume: no checkpoint in {self.directory}")
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
        for step in reversed(steps):
            meta = self._read_meta(step)
            if meta is None:
                log(f"checkpoint {step}: unreadable metadata, trying the one before")
                continue
            self._check_compatible(meta)
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)),
                )["state"]
            except Exception as e:
                log(
                    f"checkpoint {step}: cannot be read ({type(e).__name__}), trying the one before"
                )
                continue
            if not np.allclose(_fingerprint_list(restored), meta["fingerprint"], rtol=1e-5):
                log(
                    f"checkpoint {step}: its data does not match its fingerprint, "
                    "trying the one before"
                )
                continue
            return step, restored
        raise UsageError(f"--resume: every checkpoint in {self.directory} is damaged")

    def _read_meta(self, step):
        return _read_meta(self.manager, step)

    def _check_compatible(self, meta):
        theirs = {k: meta.get(k) for k in self.identity} | recipe(meta)
        if theirs != self.identity:
            diffs = _differences(self.identity, theirs)
            raise UsageError(
                f"--resume: the checkpoint in {self.directory} is from another configuration "
                f"({diffs}); use the same flags, or another --checkpoint-dir"
            )

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_for_run(directory, every, resume, cfg, tc, unit="byte", named=False):
    """The run's Checkpoints, or None when it keeps none (every=0, no resume, and
    no folder `named` on the command line: one named is asked for a checkpoint,
    at least at the end). A fresh run refuses a directory that already holds
    another run's."""
    if not (every or resume or named):
        return None
    checkpoints = Checkpoints(directory, every, cfg, tc, unit)
    if not resume and checkpoints.steps():
        checkpoints.close()
        raise UsageError(
            f"{checkpoints.directory} already holds checkpoints (steps {checkpoints.steps()}); "
            "pass --resume to continue that run, or choose another --checkpoint-dir"
        )
    return checkpoints


def resume(checkpoints, abstract, steps, log=print):
    """(step, state) of the newest intact checkpoint, placed as `abstract` says,
    for a run of `steps` steps that has not finished."""
    try:
        start, state = checkpoints.restore_latest(abstract, log=log)
        if start >= steps:
            raise UsageError(f"--resume: the run already finished ({start} of {steps} steps)")
    except UsageError:
        checkpoints.close()
        raise
    return start, state


def _differences(ours, theirs):
    out = []
    for key in ours:
        if isinstance(ours[key], dict) and isinstance(theirs.get(key), dict):
            out += [
                f"{k} {ours[key][k]} here, {theirs[key].get(k)} there"
                for k in ours[key]
                if ours[key][k] != theirs[key].get(k)
            ]
        elif ours[key] != theirs.get(key):
            out.append(f"{key} {ours[key]} here, {theirs.get(key)} there")
    return "; ".join(out)

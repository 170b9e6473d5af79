"""The per-platform requirement files resolve against requirements.txt.

A GPU or TPU user runs `pip install -r requirements.txt -r requirements-gpu.txt`
(or `-tpu.txt`). Nothing here has a GPU or TPU, but pip's resolver runs
anywhere: `pip install --dry-run --report` resolves both files together
against what is installed and writes what it would install as JSON, reading
wheel metadata from the index without installing (or downloading) the wheels.
This needs the package index, as CI's set-up does.

What must hold: the pair resolves at all; the accelerator file adds its
plugin without moving jax or jaxlib off the version requirements.txt
installed (a range that disagrees would make pip swap jax under the
course's tested pin, or fail); and the plugin it adds is built for that same
jaxlib (JAX refuses a plugin of another version at start-up).
"""

import concurrent.futures
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

# What each file must bring: jax[cuda12] pulls jax-cuda12-plugin (and its pjrt
# half), versioned with jaxlib; jax[tpu] pulls libtpu (jax's own setup.py extras).
PLUGINS = {"requirements-gpu.txt": "jax-cuda12-plugin", "requirements-tpu.txt": "libtpu"}


def dry_run(extra, tmp_dir):
    """(exit status, stderr, {name: version} pip would install) for requirements.txt + extra."""
    report = os.path.join(tmp_dir, f"{extra}.json")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--disable-pip-version-check",
        "--report",
        report,
        "-r",
        "requirements.txt",
        "-r",
        extra,
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode:
        return done.returncode, done.stderr, {}
    with open(report) as f:
        install = json.load(f)["install"]
    versions = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in install}
    return 0, done.stderr, versions


def version(name, would_install):
    """The version pip would install, or the one installed already."""
    if name in would_install:
        return would_install[name]
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """Both dry runs at once: they wait on the index, not on the CPU."""
    tmp = str(tmp_path_factory.mktemp("pip"))
    with concurrent.futures.ThreadPoolExecutor(len(PLUGINS)) as pool:
        runs = {extra: pool.submit(dry_run, extra, tmp) for extra in PLUGINS}
        return {extra: run.result() for extra, run in runs.items()}


@pytest.mark.parametrize("extra", sorted(PLUGINS))
def test_the_platform_file_resolves_without_moving_jax(resolved, extra):
    status, stderr, would_install = resolved[extra]
    assert status == 0, f"pip could not resolve requirements.txt + {extra}:\n{stderr[-2000:]}"
    # requirements.txt's jax stays: the accelerator file only adds to it.
    assert "jax" not in would_install and "jaxlib" not in would_install, would_install
    plugin = PLUGINS[extra]
    assert version(plugin, would_install), f"{extra} brings no {plugin}"
    if plugin == "jax-cuda12-plugin":
        assert version(plugin, would_install) == importlib.metadata.version("jaxlib")


@pytest.mark.parametrize("extra", sorted(PLUGINS))
def test_the_platform_file_names_its_set_up_line(extra):
    """The file says how it is used, as the README's set-up section does."""
    with open(os.path.join(REPO, extra)) as f:
        text = f.read()
    assert f"pip install -r requirements.txt -r {extra}" in text
    with open(os.path.join(REPO, "README.md")) as f:
        assert f"pip install -r requirements.txt -r {extra}" in f.read()

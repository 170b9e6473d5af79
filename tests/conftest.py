"""Every test sees 8 simulated CPU devices, so sharding runs here as on a pod.

The flag must be set before JAX starts, hence here, before any test imports it.
Tests that need one device build a one-device mesh or run a subprocess. What
tests share besides fixtures is in tests/helpers.py.

One persistent compilation cache serves the whole run: both pytest-xdist workers
(pyproject.toml) and every child they start (children inherit the environment).
A program compiled by one test is read back, not compiled again, by the next
test or child that builds the same program. The cache lives under pytest's
temporary root (or HPLLM_TEST_JAX_CACHE), so a student's own runs never see it.
"""

import os

# The suite's programs are tiny: compiling them, not running them, is most of its time,
# and much of a CPU compile is LLVM optimizing machine code. At XLA's backend level 1
# (the default is 3) the suite takes about 17% less time. The HLO is the same, and a*b+c
# is still one fused multiply-add; a sum may add in another order, as on a CPU of
# another vector width. Level 0 drops the fused multiply-adds, and tests that compare
# two programs then fail. tests/test_compile_cache.py holds both against the default.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest

from sessions.model.config import PRESETS, ModelConfig, TrainConfig

# What JAX warns when a cache entry cannot be read (jax/_src/compiler.py, _cache_read).
TORN_READ = "Error reading persistent compilation cache entry"


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has made its root
def pytest_configure(config):
    """Turn the cache on before the first compile (JAX decides once per process
    whether it uses one). Every program is kept, however quick to compile: op by
    op, a step is hundreds of tiny programs, and those are what the tests compile
    most. Children inherit the settings through the environment.

    Two children that build the same program at the same moment (a pod's hosts)
    may race: one reads an entry the other is still writing. JAX then warns and
    compiles it afresh, which is right; the warning is silenced so that it never
    lands in a child's stderr that a test reads."""
    root = config._tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's root is a folder of the run's
        root = root.parent
    path = os.environ.get("HPLLM_TEST_JAX_CACHE") or str(root / "jax-cache")
    settings = {
        "jax_compilation_cache_dir": path,
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
    }
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)
    torn_read = f"ignore:{TORN_READ}:UserWarning"
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), torn_read])
    )


@pytest.fixture(scope="session")
def cfg():
    """Sizes that differ pairwise, so a swapped axis cannot go unnoticed:
    B=2 (in tests), S=6..16, E=24, F=40, H=3, D=8, V=256."""
    return ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=16)


@pytest.fixture(scope="session")
def key():
    return jax.random.key(0)


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """What `s2_train.py --preset tiny --checkpoint-every N` leaves: one orbax checkpoint
    (s3's and s5's tests serve it)."""
    from sessions.run.checkpoint import Checkpoints  # orbax: only for the tests that serve
    from sessions.train.step import init_state, make_optimizer

    tiny, tc = PRESETS["tiny"].model, TrainConfig(batch=2, steps=1)
    state = init_state(jax.random.key(0), cfg=tiny, optimizer=make_optimizer(tc, tc.steps))
    directory = tmp_path_factory.mktemp("s2") / "checkpoints"
    with Checkpoints(str(directory), 1, tiny, tc) as checkpoints:
        checkpoints.maybe_save(1, state, force=True)
    return str(directory)

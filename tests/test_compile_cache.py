"""The suite's compile cache (tests/conftest.py): one for the run, under pytest's
temporary root, read back by every child process the tests start.

JAX's key holds the program, the compiler's version and options, and the
devices the process sees: a child with 8 devices, as here, reads what this
process wrote; one with fewer shares entries with its likes only."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from helpers import run_python

# A program no other test builds, compiled first here, then in a child: the only
# program the child compiles (its input comes from NumPy).
PROGRAM = "lambda x: jnp.tanh(x) * 3 + 1"
CHILD = f"""
import jax, jax.numpy as jnp, numpy as np
events = []
jax.monitoring.register_event_listener(lambda event, **kwargs: events.append(event))
jax.jit({PROGRAM})(np.arange(5, dtype=np.float32)).block_until_ready()
print(events.count("/jax/compilation_cache/cache_hits"))
"""


def test_the_cache_lives_under_this_run_s_temporary_root(tmp_path_factory):
    """Under pytest-xdist a worker's root is a folder of the run's (gw0, gw1):
    the cache is the run's, above them, so that the workers share it."""
    cache = jax.config.jax_compilation_cache_dir
    root = tmp_path_factory.getbasetemp()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        assert root.name.endswith(worker), root
        root = root.parent
        assert worker not in os.path.relpath(cache, root), cache
    root = os.environ.get("HPLLM_TEST_JAX_CACHE") or str(root)
    assert cache and os.path.realpath(cache).startswith(os.path.realpath(root)), cache


def test_a_child_reads_back_what_this_process_compiled():
    jax.jit(eval(PROGRAM, {"jnp": jnp}))(np.arange(5, dtype=np.float32)).block_until_ready()
    result = run_python("-c", CHILD, devices=8)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "1", result.stdout

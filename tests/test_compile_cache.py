"""The suite's compile cache (tests/conftest.py): one for the run, under pytest's
temporary root, read back by every child process the tests start.

JAX's key holds the program, the compiler's version and options, and the
devices the process sees: a child with 8 devices, as here, reads what this
process wrote; one with fewer shares entries with its likes only."""

import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
from helpers import PYTHON, REPO, run_python, subprocess_env

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


# Programs whose floats the compiler's machine code decides: an elementwise a*b+c (one
# fused multiply-add, or two roundings), a dot small enough for XLA to emit its own
# loops, and a sum; each its own program. Printed as the bits of every float.
ROUNDING = """
import jax, jax.numpy as jnp, numpy as np
x, y, z = np.random.default_rng(0).standard_normal((3, 64, 48), dtype=np.float32)
w = np.random.default_rng(1).standard_normal((48, 96), dtype=np.float32)
out = [jax.jit(f)(*a) for f, a in [(lambda x, y, z: x * y + z, (x, y, z)),
                                     (lambda x, w: x @ w, (x, w)),
                                     (lambda x, y: jnp.sum(x * y), (x, y))]]
print(" ".join(np.asarray(o).tobytes().hex() for o in out))
"""


def floats(text):
    return [np.frombuffer(bytes.fromhex(h), np.float32) for h in text.split()]


def test_the_suite_s_compile_level_keeps_every_product_s_rounding():
    """tests/conftest.py compiles at XLA's backend level 1 to save time; a student's
    run compiles at the default, 3. a*b+c has the same bits both ways: level 1 still
    fuses the multiply-add into one rounding (level 0 does not, and two tests that
    compare programs then failed). A dot or a sum may add its terms in another order
    (level 3 vectorizes more loops), as on another CPU's vector width: each stays
    within the bound of float32 summation in any order, 2·n·u·sum|terms| apart."""
    here = run_python("-c", ROUNDING)  # the suite's flags (helpers.subprocess_env)
    env = subprocess_env()
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"  # the default level
    default = subprocess.run(
        [PYTHON, "-c", ROUNDING], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert here.returncode == default.returncode == 0, here.stderr + default.stderr
    (fma, dot, total), (fma3, dot3, total3) = floats(here.stdout), floats(default.stdout)
    assert fma.tobytes() == fma3.tobytes(), "a*b+c: the suite's compile level changed its bits"
    x, y, _ = np.random.default_rng(0).standard_normal((3, 64, 48), dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((48, 96), dtype=np.float32)
    u = 2.0**-24  # float32's unit roundoff
    dot_terms = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    assert np.all(np.abs(dot - dot3) <= 2 * 48 * u * dot_terms.ravel())
    sum_terms = np.sum(np.abs(x.astype(np.float64) * y))
    assert abs(float(total[0]) - float(total3[0])) <= 2 * x.size * u * sum_terms

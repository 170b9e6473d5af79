"""Options and bookkeeping for the exercise tests (tests/conftest.py, one level
up, gives every test 8 simulated CPU devices and the `cfg`, `key` fixtures).

    --exercises        grade exercises/ instead of solutions/ (the same as
                       HPLLM_EXERCISES=1; see tests/adapters.py)

Each graded test is marked with the exercise it grades,
@pytest.mark.exercise("module.function"); that name, and the machine the
tests ran on, go into pytest's --junitxml report, which scripts/homework.py
reads to write its per-exercise report.
"""

import os

import jax
import pytest
from adapters import ENV


def pytest_addoption(parser):
    parser.addoption(
        "--exercises",
        action="store_true",
        help="grade exercises/ instead of solutions/ (same as HPLLM_EXERCISES=1)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "exercise(name): the exercise ('module.function') graded")
    if config.getoption("--exercises", default=False):
        os.environ[ENV] = "1"


@pytest.fixture(autouse=True)
def _record_exercise(request, record_property):
    marker = request.node.get_closest_marker("exercise")
    if marker is not None:
        record_property("exercise", marker.args[0])


@pytest.fixture(scope="session", autouse=True)
def _record_machine(record_testsuite_property):
    device = jax.devices()[0]
    record_testsuite_property("backend", jax.default_backend())
    record_testsuite_property("device_kind", device.device_kind)
    record_testsuite_property("device_count", jax.device_count())
    # The cores this process may run on (a container's share), not the 8 simulated devices.
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    record_testsuite_property("host_cores", len(cores) if cores else os.cpu_count())
    record_testsuite_property("jax", jax.__version__)

"""The one seam between the exercise tests and the code they grade.

Every test reaches an exercise through `exercise("module.function")`, which
imports it from solutions/ by default, or from exercises/ when the
environment variable HPLLM_EXERCISES is set to 1 (pytest's --exercises
option, defined in tests/test_exercises/conftest.py, sets it):

    python -m pytest tests/test_exercises                # grades solutions/
    HPLLM_EXERCISES=1 python -m pytest tests/test_exercises   # grades yours
    python -m pytest tests/test_exercises --exercises    # the same

An exercise still raising its stub's NotImplementedError fails the test
with "not started: module.function" and nothing else. The module is
imported at call time, so a syntax error in one exercise fails only the
tests that use it.
"""

import importlib
import os

import pytest

ENV = "HPLLM_EXERCISES"


def graded_tree():
    """'exercises' or 'solutions': the tree the tests are grading now."""
    return "exercises" if os.environ.get(ENV, "0") not in ("", "0") else "solutions"


def exercise(name):
    """A callable that runs graded_tree()'s `module.function` when called."""

    def call(*args, **kwargs):
        try:
            return _lookup(name)(*args, **kwargs)
        except NotImplementedError as e:
            stub = _stub_that_raised(e)
            if stub is None:
                raise  # from somewhere else: a real failure, with its traceback
            needed = "" if stub == name else f" (needed by {name})"
            pytest.fail(f"not started: {stub}{needed}", pytrace=False)

    call.__name__ = call.__qualname__ = name
    return call


def _lookup(name):
    module_name, _, function_name = name.rpartition(".")
    module = importlib.import_module(f"{graded_tree()}.{module_name}")
    return getattr(module, function_name)


def _stub_that_raised(error):
    """'module.function' of the graded tree whose own body raised the
    NotImplementedError (a stub, possibly one the called exercise uses), or
    None when it came from anywhere else."""
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    package = importlib.import_module(graded_tree())
    folder = os.path.dirname(os.path.abspath(package.__file__))
    if os.path.dirname(os.path.abspath(code.co_filename)) != folder:
        return None
    module = os.path.splitext(os.path.basename(code.co_filename))[0]
    return f"{module}.{code.co_name}"

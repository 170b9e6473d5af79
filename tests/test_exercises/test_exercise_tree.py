"""exercises/ mirrors solutions/, and every exercise in it is still a stub
(test_exercise_names.py checks that the two hold the same modules).

An exercise is a public function of a solutions/ module; find-the-bug
modules also hold given code, the `broken_*` functions, which must read the
same in both trees. In exercises/, each exercise's body is its docstring and
`raise NotImplementedError`, nothing else, so no answer leaks into the
student's copy; its imports are the solution's, so the names its hints use
(jnp, P, ...) are there when the student fills it in.
"""

import ast
import importlib
import inspect
import pathlib
import re
import types

import pytest
from adapters import graded_tree

REPO = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "solutions").glob("*.py") if p.stem != "__init__")


def public_functions(module):
    return {
        name: fn
        for name, fn in vars(module).items()
        if callable(fn)
        and not name.startswith("_")
        and getattr(fn, "__module__", None) == module.__name__
    }


def constants(module):
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and not callable(value) and not isinstance(value, types.ModuleType)
    }


@pytest.mark.parametrize("name", MODULES)
def test_same_functions_signatures_and_docstrings(name):
    solution = importlib.import_module(f"solutions.{name}")
    exercise = importlib.import_module(f"exercises.{name}")
    assert inspect.getdoc(exercise) == inspect.getdoc(solution), "module docstrings differ"
    assert constants(exercise) == constants(solution), "module constants differ"
    ours, theirs = public_functions(solution), public_functions(exercise)
    assert sorted(theirs) == sorted(ours), "the two trees define different functions"
    for fn_name, fn in ours.items():
        twin = theirs[fn_name]
        assert inspect.signature(twin) == inspect.signature(fn), f"{fn_name}: signatures differ"
        assert inspect.getdoc(twin) == inspect.getdoc(fn), f"{fn_name}: docstrings differ"
        assert inspect.getdoc(fn), f"{fn_name} has no docstring"
        if fn_name.startswith("broken_"):
            assert inspect.getsource(twin) == inspect.getsource(fn), (
                f"{fn_name}: given code differs"
            )


def top_imports(path):
    """What the imports at a module's top bind: {(name, what it names)}.

    `import jax.numpy as jnp` binds ("jnp", "jax.numpy"); `import
    concurrent.futures` binds ("concurrent", "concurrent.futures"), which plain
    `import concurrent` would not make usable; `from jax.sharding import
    PartitionSpec as P` binds ("P", "jax.sharding.PartitionSpec")."""
    bound = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound.add((alias.asname or alias.name.split(".")[0], alias.name))
        elif isinstance(node, ast.ImportFrom):
            source = "." * node.level + (node.module or "")
            for alias in node.names:
                bound.add((alias.asname or alias.name, f"{source}.{alias.name}"))
    return bound


def test_top_imports_reads_each_form_of_import():
    assert {("jax", "jax"), ("P", "jax.sharding.PartitionSpec")} <= top_imports(
        REPO / "solutions" / "manual_fsdp.py"
    )
    assert ("concurrent", "concurrent.futures") in top_imports(
        REPO / "solutions" / "bug_slow_loader.py"
    )


@pytest.mark.parametrize("name", MODULES)
def test_each_stub_imports_what_its_solution_imports(name):
    """A stub that lacks `import jax.numpy as jnp` fails with a NameError the
    moment the student writes the body its docstring's hint describes."""
    solution = top_imports(REPO / "solutions" / f"{name}.py")
    missing = sorted(solution - top_imports(REPO / "exercises" / f"{name}.py"))
    assert not missing, (
        f"exercises/{name}.py lacks its solution's imports (name, module): {missing}"
    )


def test_every_exercise_is_graded_by_a_test():
    marked = set()
    for path in pathlib.Path(__file__).parent.glob("test_session_*.py"):
        marked |= set(re.findall(r'mark\.exercise\("([\w.]+)"\)', path.read_text()))
    exercises = {
        f"{name}.{fn}"
        for name in MODULES
        for fn in public_functions(importlib.import_module(f"solutions.{name}"))
        if not fn.startswith("broken_")
    }
    assert not exercises - marked, f"exercises no test grades: {sorted(exercises - marked)}"
    assert not marked - exercises, f"tests grade unknown exercises: {sorted(marked - exercises)}"


@pytest.mark.parametrize("folder", ["exercises", "solutions"])
def test_einsums_use_the_dimension_alphabet(folder):
    """The course's letters only: B S T E F H D V L (as tests/test_model.py checks sessions/)."""
    for path in (REPO / folder).glob("*.py"):
        for spec in re.findall(r'einsum\(\s*"([^"]+)"', path.read_text()):
            letters = set(spec.replace(",", "").replace("->", "").replace(" ", ""))
            assert letters <= set("BSTEFHDVL"), f"{path.name}: '{spec}'"


def is_stub(node):
    """Body = docstring + `raise NotImplementedError`, and nothing else."""
    body = node.body
    return (
        len(body) == 2
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[1], ast.Raise)
        and isinstance(body[1].exc, ast.Name)
        and body[1].exc.id == "NotImplementedError"
    )


@pytest.mark.skipif(
    graded_tree() == "exercises",
    reason="grading exercises/: in a student's copy the exercises are meant to be filled in",
)
@pytest.mark.parametrize("name", MODULES)
def test_every_exercise_is_still_a_stub(name):
    """Run by CI on the course repo (a student filling in exercises/ fails it, as expected;
    grading with --exercises or HPLLM_EXERCISES=1 skips it)."""
    tree = ast.parse((REPO / "exercises" / f"{name}.py").read_text())
    exercises = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith(("_", "broken_"))
    ]
    assert exercises, f"exercises/{name}.py has no exercise"
    filled = [node.name for node in exercises if not is_stub(node)]
    assert not filled, (
        f"exercises/{name}.py: {filled} should be docstring + raise NotImplementedError "
        "(the answer belongs in solutions/)"
    )
    given = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert not given, f"exercises/{name}.py: classes {given}: exercises are functions"

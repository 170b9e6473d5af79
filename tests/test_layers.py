"""The layers of the tree, read from the source with `ast` (every import, at
module level or inside a function):

    roofline/    a library: imports nothing from sessions/, except its
                 command-line entry point, roofline/__main__.py
    s1..s4, scripts/*.py with a __main__ block
                 programs: run, never imported by anything
"""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSION_SCRIPTS = (
    "sessions.s1_train",
    "sessions.s2_train",
    "sessions.s3_infer",
    "sessions.s4_kernels",
)
FOLDERS = ("roofline", "sessions", "scripts", "tests", "exercises", "solutions")


def python_files(folder):
    for root, _, names in os.walk(os.path.join(REPO, folder)):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(root, name), REPO)


def imported(source):
    """Every module an `import` or `from ... import` in the source names, anywhere
    in it; `from package import name` also as 'package.name' (it may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imports_of(path):
    with open(os.path.join(REPO, path)) as f:
        return imported(f.read())


def sessions_imports(modules):
    return sorted(m for m in modules if m == "sessions" or m.startswith("sessions."))


def test_the_reader_sees_imports_inside_functions():
    source = "import os\n\ndef f():\n    from sessions import s2_train\n    import scripts.bench\n"
    assert {"sessions.s2_train", "scripts.bench"} <= imported(source)


def test_roofline_library_imports_nothing_from_sessions():
    offenders = {
        path: sessions_imports(imports_of(path))
        for path in python_files("roofline")
        if os.path.basename(path) != "__main__.py"
    }
    assert not {path: found for path, found in offenders.items() if found}


# What roofline's command line may take from sessions/: configs, flags, the attention
# choices and the errors it reports; never the model or the training step.
ENTRY_POINT_MAY_IMPORT = {
    "sessions.run.cli",
    "sessions.config",
    "sessions.run.errors",
    "sessions.attention",
}


def test_roofline_s_command_line_takes_configs_and_flags_never_the_step():
    found = imports_of(os.path.join("roofline", "__main__.py"))
    modules = {m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in sessions_imports(found)}
    assert modules <= ENTRY_POINT_MAY_IMPORT | {"sessions"}, modules - ENTRY_POINT_MAY_IMPORT


def test_a_planted_sessions_import_in_roofline_is_caught():
    planted = "def f():\n    from sessions.config import ModelConfig\n    return ModelConfig\n"
    assert sessions_imports(imported(planted)) == ["sessions.config", "sessions.config.ModelConfig"]


def is_script(module):
    """A program: a session script, or a file under scripts/ that runs as __main__
    (scripts/ also holds modules the programs share: discord, grading, naive_step)."""
    if module.startswith(SESSION_SCRIPTS):
        return True
    path = os.path.join(REPO, *module.split(".")[:2]) + ".py"
    if not module.startswith("scripts.") or not os.path.exists(path):
        return False
    with open(path) as f:
        return 'if __name__ == "__main__":' in f.read()


@pytest.mark.parametrize("folder", FOLDERS)
def test_nothing_imports_a_session_script_or_a_script(folder):
    """A script is a program: what another file needs from it belongs in a module."""
    offenders = {}
    for path in python_files(folder):
        found = sorted(m for m in imports_of(path) if is_script(m))
        if found:
            offenders[path] = found
    assert not offenders


def public_names(folder):
    """{name: [files]} of the functions and classes defined at the top of each module."""
    found = {}
    for path in python_files(folder):
        with open(os.path.join(REPO, path)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            defines = (ast.FunctionDef, ast.ClassDef)
            if isinstance(node, defines) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(path)
    return found


def test_no_two_public_names_in_the_library_mean_two_things():
    """One name, one thing, across sessions/ and roofline/: a reader who meets
    `decode_step` knows which it is. Each script's `main` is its entry point."""
    found = {}
    for folder in ("sessions", "roofline"):
        for name, paths in public_names(folder).items():
            found.setdefault(name, []).extend(paths)
    shared = {name: paths for name, paths in found.items() if len(paths) > 1 and name != "main"}
    assert not shared

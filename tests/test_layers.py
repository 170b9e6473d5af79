"""The layers of the tree, read from the source with `ast` (every import, at
module level or inside a function), and docs/layout.md's picture of it:

    sessions/       the session scripts and errors.py at the top, over concept packages
                    in the order docs/layout.md writes once: a module imports its own
                    package and those before it, never one after it, and no import
                    circle closes, a package's face (__init__.py) counted
    roofline/       a library: imports nothing from sessions/, except its
                    command line, roofline/__main__.py and its flags, roofline/flags.py
    scripts/harness/ what the programs in scripts/ share
    s1..s5, scripts/*.py
                    programs, each with a __main__ block: run, never imported

docs/layout.md names every folder and module; every path of this repository named
in the code and the docs exists, and every relative link of a Markdown page leads
to a file; no module is over 300 lines.
"""

import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSION_SCRIPTS = (
    "sessions.s1_train",
    "sessions.s2_train",
    "sessions.s3_infer",
    "sessions.s4_kernels",
    "sessions.s5_serve",
    "sessions.s6_memory",
    "sessions.s7_engine",
)
FOLDERS = ("roofline", "sessions", "scripts", "tests", "exercises", "solutions", "docs")
LAYOUT = os.path.join("docs", "layout.md")
MOST_AT_THE_TOP = 10  # modules at sessions/' top, scripts included (__init__.py aside)
MOST_IN_ROOFLINE = 14  # modules at roofline/'s top (__init__.py aside); the rest in its folders


def repo_files():
    """The repository's own files, as paths from its root: its folders and the
    files at its top (no virtual environments, caches or runs; no git needed)."""
    for name in sorted(os.listdir(REPO)):
        if os.path.isfile(os.path.join(REPO, name)):
            yield name
    for folder in (*FOLDERS, ".ci"):
        for root, dirs, names in os.walk(os.path.join(REPO, folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                yield os.path.relpath(os.path.join(root, name), REPO)


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


def module_file(dotted):
    """The file of this repository that a dotted name imports, or None: the
    longest prefix that is a module ('sessions.run.cli.resolve' ->
    sessions/run/cli.py); a package alone ('sessions.run') is no module."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = os.path.join(*parts[:end]) + ".py"
        if os.path.exists(os.path.join(REPO, path)):
            return path
    return None


def modules_imported(path):
    return {f for f in map(module_file, imports_of(path)) if f}


def files_imported(source, path=""):
    """The files of this repository that running an import in `source` (the file at
    `path`) executes: each module named, and each package's __init__.py on the way
    ('from sessions.model.config import X' runs sessions/model/__init__.py first, and so
    depends on it). Passing through the package `path` sits in is no dependency: its
    __init__.py has begun already. Naming that package itself is one ('from sessions.model
    import forward' inside sessions/model/ needs its __init__.py to have finished)."""
    own = os.path.join(os.path.dirname(path), "__init__.py")
    found = set()
    for dotted in imported(source):
        parts = dotted.split(".")
        for end in range(1, len(parts) + 1):
            base = os.path.join(*parts[:end])
            for name in (base + ".py", os.path.join(base, "__init__.py")):
                passing = end < len(parts) and name == own
                if os.path.exists(os.path.join(REPO, name)) and not passing:
                    found.add(name)
    return found


def import_graph(files):
    """{file: the files of sessions/ it imports}, for {file: its source}; sessions/'
    own __init__.py, a docstring that every import runs, is left out."""
    top = "sessions/__init__.py"
    graph = {}
    for path, source in files.items():
        found = files_imported(source, path)
        graph[path] = {f for f in found if f.startswith("sessions/") and f not in (path, top)}
    graph.pop(top, None)
    return graph


def find_cycle(graph):
    """One import circle of `graph` as [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def sources(paths):
    result = {}
    for path in paths:
        with open(os.path.join(REPO, path)) as f:
            result[path] = f.read()
    return result


def test_the_reader_sees_imports_inside_functions():
    source = "import os\n\ndef f():\n    from sessions import s2_train\n    import scripts.bench\n"
    assert {"sessions.s2_train", "scripts.bench"} <= imported(source)


def test_a_dotted_name_resolves_to_its_module_file():
    assert module_file("sessions.run.cli.resolve") == "sessions/run/cli.py"
    assert module_file("sessions.run") is None
    assert module_file("jax.numpy") is None


def package_order():
    """docs/layout.md's package order, its one line 'errors < shard < ... < scripts'."""
    line = re.search(r"^ +(errors( < \w+)+)$", layout_page(), re.M)
    return line.group(1).split(" < ")


def layer_of(path):
    """The name a file of sessions/ has in the package order ('sessions/model/rotary.py'
    -> 'model'; errors.py -> 'errors'; a session script -> 'scripts'); None for
    sessions/__init__.py, which no module imports."""
    parts = path.split("/")
    if len(parts) > 2:
        return parts[1]
    if path == "sessions/__init__.py":
        return None
    name = parts[1].removesuffix(".py")
    return "scripts" if f"sessions.{name}" in SESSION_SCRIPTS else name


def order_offenders(graph, order):
    """{file: [files it imports that come later in `order` than its own package]}."""
    rank = {name: i for i, name in enumerate(order)}
    offenders = {}
    for path, targets in graph.items():
        late = sorted(t for t in targets if rank[layer_of(t)] > rank[layer_of(path)])
        if late:
            offenders[path] = late
    return offenders


def sessions_sources():
    return sources(python_files("sessions"))


def test_the_order_names_errors_every_package_and_the_scripts_once():
    order = package_order()
    packages = {
        d
        for d in os.listdir(os.path.join(REPO, "sessions"))
        if os.path.isfile(os.path.join(REPO, "sessions", d, "__init__.py"))
    }
    assert len(order) == len(set(order))
    assert set(order) == packages | {"errors", "scripts"}
    assert {layer_of(p) for p in python_files("sessions")} - {None} == set(order)


def test_every_import_in_sessions_follows_the_package_order():
    """A concept never imports plumbing (run/) or planning (plan/), plumbing never
    planning, and no package one that comes after it."""
    assert not order_offenders(import_graph(sessions_sources()), package_order())


def test_a_planted_import_against_the_order_is_caught():
    order = package_order()
    planted = {
        "sessions/model/transformer.py": "from sessions.train.step import loss_fn\n",
        "sessions/train/data.py": "def f():\n    from sessions.run import cli\n",
        "sessions/shard/sharding.py": "from sessions.errors import UsageError\n",
        "sessions/run/cli.py": "from sessions.model.config import PRESETS\n",
    }
    assert order_offenders(import_graph(planted), order) == {
        "sessions/model/transformer.py": ["sessions/train/__init__.py", "sessions/train/step.py"],
        "sessions/train/data.py": ["sessions/run/__init__.py", "sessions/run/cli.py"],
    }


def test_no_import_circle_in_sessions_counting_the_packages_faces():
    assert find_cycle(import_graph(sessions_sources())) is None


def test_a_module_importing_its_own_package_s_face_closes_a_circle():
    """sessions/model/__init__.py hands on forward from transformer.py, which imports
    attention.py: attention.py importing `from sessions.model import forward` is a circle."""
    files = sessions_sources()
    files["sessions/model/attention.py"] += "\nfrom sessions.model import forward\n"
    cycle = find_cycle(import_graph(files))
    assert cycle is not None and "sessions/model/__init__.py" in cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_sessions_top_holds_the_scripts_and_few_else():
    top = [n for n in os.listdir(os.path.join(REPO, "sessions")) if n.endswith(".py")]
    modules = set(top) - {"__init__.py"}
    assert {f"{m.split('.')[1]}.py" for m in SESSION_SCRIPTS} <= modules
    assert len(modules) <= MOST_AT_THE_TOP, sorted(modules)


def test_roofline_s_top_holds_at_most_fourteen_modules():
    top = [n for n in os.listdir(os.path.join(REPO, "roofline")) if n.endswith(".py")]
    assert len(set(top) - {"__init__.py"}) <= MOST_IN_ROOFLINE, sorted(top)


def test_each_package_says_what_it_is_and_which_session_teaches_it():
    """A package's face: a docstring of a few lines; a concept package names the
    sessions that teach it."""
    for layer in package_order():
        path = os.path.join(REPO, "sessions", layer, "__init__.py")
        if not os.path.exists(path):
            continue  # errors.py and the scripts are modules
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        assert doc and len(doc.splitlines()) <= 25, layer
        if layer not in ("run", "plan"):
            assert re.search(r"[Ss]ession \d", doc), f"sessions/{layer}/ names no session"


COMMAND_LINE = ("roofline/__main__.py", "roofline/flags.py")


def test_roofline_library_imports_nothing_from_sessions():
    offenders = {
        path: sessions_imports(imports_of(path))
        for path in python_files("roofline")
        if path not in COMMAND_LINE
    }
    assert not {path: found for path, found in offenders.items() if found}


# What roofline's command line may take from sessions/: configs, flags, the attention
# choices and the errors it reports; never the model or the training step.
ENTRY_POINT_MAY_IMPORT = {
    "sessions/run/cli.py",
    "sessions/model/config.py",
    "sessions/errors.py",
    "sessions/model/attention.py",
}


def test_roofline_s_command_line_takes_configs_and_flags_never_the_step():
    found = {f for path in COMMAND_LINE for f in modules_imported(path)}
    from_sessions = {f for f in found if f.startswith("sessions/")}
    assert from_sessions <= ENTRY_POINT_MAY_IMPORT, from_sessions - ENTRY_POINT_MAY_IMPORT


def test_a_planted_sessions_import_in_roofline_is_caught():
    planted = (
        "def f():\n    from sessions.model.config import ModelConfig\n    return ModelConfig\n"
    )
    assert sessions_imports(imported(planted)) == [
        "sessions.model.config",
        "sessions.model.config.ModelConfig",
    ]


def is_script(module):
    """A program: a session script, or a module of scripts/ (what the programs share is
    the package scripts/harness/, no program)."""
    if module.startswith(SESSION_SCRIPTS):
        return True
    return module.split(".")[0] == "scripts" and not module.startswith("scripts.harness")


def test_every_file_in_scripts_is_a_program():
    """scripts/ holds what a student runs; a module the programs share is scripts/harness/'s."""
    modules = [
        p
        for p in python_files("scripts")
        if os.path.basename(p) != "__init__.py" and not p.startswith("scripts/harness/")
    ]
    assert len(modules) > 5  # the walk found the programs
    for path in modules:
        with open(os.path.join(REPO, path)) as f:
            assert 'if __name__ == "__main__":' in f.read(), f"{path} is no program"


def test_a_planted_import_of_a_script_s_module_is_caught():
    planted = "from scripts import rungs\n\ndef f():\n    import scripts.bench\n"
    found = sorted(m for m in imported(planted) if is_script(m))
    assert found == ["scripts", "scripts.bench", "scripts.rungs"]
    assert not [m for m in imported("from scripts.harness import rungs\n") if is_script(m)]


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


# docs/layout.md: the picture of the tree and its tables.


def layout_page():
    with open(os.path.join(REPO, LAYOUT)) as f:
        return f.read()


def layout_tables(layout):
    """{folder: {the modules its table names}}: a table headed `| concept | module |`
    or `| module | ... |` belongs to the `### folder/` heading above it; one headed
    `| `folder/` | ... |` to that folder. Its module column's `name.py`s are read."""
    tables, heading, table, column = {}, None, None, None
    for line in layout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("### "):
            heading = line.split()[1].rstrip(":")
        elif not line.startswith("|"):
            table = None
        elif table is None:  # a table's header row
            if "module" in cells:
                table, column = heading, cells.index("module")
            else:
                table, column = cells[0].strip("`"), 0
        elif not line.startswith("|---"):
            tables.setdefault(table, set()).update(re.findall(r"`([\w.]+\.py)`", cells[column]))
    return tables


def test_the_layout_tables_name_exactly_each_folder_s_modules():
    tables = layout_tables(layout_page())
    packages = [f"sessions/{layer}/" for layer in package_order() if layer_of_package(layer)]
    folders = ["sessions/", *packages, "roofline/"]
    folders += ["roofline/compiled/", "roofline/measured/", "roofline/plan/"]
    folders += ["scripts/", "scripts/harness/"]
    assert sorted(tables) == sorted(folders)
    for folder in folders:
        on_disk = {n for n in os.listdir(os.path.join(REPO, folder)) if n.endswith(".py")}
        assert tables[folder] == on_disk - {"__init__.py"}, folder


def layer_of_package(layer):
    """Whether a name of the package order is a package (not errors.py or the scripts)."""
    return os.path.isdir(os.path.join(REPO, "sessions", layer))


def test_the_layout_picture_names_every_folder():
    """The picture's first column (`folder/`) is every Python folder of the tree."""
    picture = layout_page().split("```")[1]
    named = {line.split()[0] for line in picture.splitlines() if re.match(r"[\w.]+/", line)}
    tracked = [p for p in repo_files() if p.endswith(".py")]
    packages = {os.path.dirname(p) + "/" for p in tracked if p.endswith("__init__.py")}
    packages = {p for p in packages if not p.startswith("tests/")}
    top = {p.split("/")[0] + "/" for p in tracked if "/" in p}
    assert named == packages | top


# Paths of this repository named in its code and docs.

# Paths that name another project's file, or no file at all, with the reason.
NOT_OURS = {
    "tests/mesh_utils_test.py": "jax-ml/jax's test, cited: its mock devices are built as ours are",
    "roofline/xplane.proto": "the name xspace.py gives the protocol buffer it builds in memory",
    "docs/resources/webhook": "Discord's developer documentation, cited by discord.py",
    "docs/topics/rate-limits": "Discord's developer documentation, cited by discord.py",
    "docs/api_compatibility.md": "jax-ml/jax's documentation, cited by sessions/kernels/flash.py",
    "docs/pallas/CHANGELOG.md": "jax-ml/jax's documentation, cited by sessions/kernels/flash.py",
    "docs/pallas/gpu/reference.md": "jax-ml/jax's documentation, cited by sessions/kernels/flash.py",
}
FOLDER_NAMES = r"sessions|roofline|scripts|tests|exercises|solutions|docs|\.ci"
PATH = re.compile(rf"(?<![\w/.-])((?:{FOLDER_NAMES})(?:/[\w.*-]+)+/?)")


def named_paths(text):
    """Paths under this repository's folders that a text names (globs left out)."""
    return {m.rstrip(".") for m in PATH.findall(text) if "*" not in m}


def test_the_path_reader_finds_what_a_comment_names():
    text = "see sessions/run/cli.py, (roofline/compiled/hlo.py) and jax/tests/x.py, not x/roofline/a.py"
    assert named_paths(text) == {"sessions/run/cli.py", "roofline/compiled/hlo.py"}
    text = "logs in `docs/h100-run/`, scripts/harness/grading.py; [a link](../docs/chips.md) is a link's"
    assert named_paths(text) == {"docs/h100-run/", "scripts/harness/grading.py"}


def test_every_path_named_in_the_code_and_docs_exists():
    missing = {}
    for name in repo_files():
        if not name.endswith((".py", ".md", ".toml", ".txt")) and name != ".ci/run":
            continue
        with open(os.path.join(REPO, name)) as f:
            text = f.read()
        for path in named_paths(text) - set(NOT_OURS):
            if not os.path.exists(os.path.join(REPO, path)):
                missing.setdefault(name, []).append(path)
    assert not missing


# A Markdown link: [text](target), the target relative to the page (an anchor after #).
LINK = re.compile(r"\]\(([^()\s]+)\)")


def broken_links(page, text):
    """The relative link targets of a Markdown page (at `page`, a path from the
    repository's root) that lead to no file or folder; web addresses and anchors
    within the page are left out."""
    broken = []
    for target in LINK.findall(text):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z][a-z+.-]*:", path):
            continue
        if not os.path.exists(os.path.join(REPO, os.path.dirname(page), path)):
            broken.append(target)
    return broken


def test_the_link_reader_resolves_from_the_page():
    text = "[a](chips.md), [b](../roofline/README.md#per-op), [c](https://x.org/a.md), [d](#top)"
    assert broken_links("docs/layout.md", text) == []
    assert broken_links("README.md", text) == ["chips.md", "../roofline/README.md#per-op"]


def test_every_relative_link_of_a_page_leads_to_a_file():
    broken = {}
    for name in repo_files():
        if name.endswith(".md"):
            with open(os.path.join(REPO, name)) as f:
                found = broken_links(name, f.read())
            if found:
                broken[name] = found
    assert not broken


# Size.

LONGEST = 300


def test_no_module_is_over_300_lines():
    """Every module a student reads (tests/ is not held to it: tests/mutants.py is a
    table, one entry per planted bug, each with the tests it names)."""
    over = {}
    for folder in ("sessions", "roofline", "scripts", "exercises", "solutions"):
        for path in python_files(folder):
            with open(os.path.join(REPO, path)) as f:
                lines = sum(1 for _ in f)
            if lines > LONGEST:
                over[path] = lines
    assert not over

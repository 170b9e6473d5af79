"""The layers of the tree, read from the source with `ast` (every import, at
module level or inside a function), and docs/layout.md's picture of it:

    sessions/*.py   the session scripts and the concepts: a concept imports
                    concepts and roofline/, never sessions/run/ or sessions/plan/
    sessions/run/   plumbing; imports concepts, never sessions/plan/
    sessions/plan/  compiling for a chip; imports concepts and run/
    roofline/       a library: imports nothing from sessions/, except its
                    command-line entry point, roofline/__main__.py
    harness/        what the programs in scripts/ share
    s1..s4, scripts/*.py
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
)
FOLDERS = ("roofline", "sessions", "scripts", "harness", "tests", "exercises", "solutions", "docs")
LAYOUT = os.path.join("docs", "layout.md")

# docs/layout.md's concept table: what a student looks for -> the module at sessions/' top level.
CONCEPTS = {
    "the model's shapes, the run's knobs, the presets": "config.py",
    "the course's choices per platform: preset, dtype, corpus, attention": "defaults.py",
    "how a run stops on purpose": "errors.py",
    "the transformer": "model.py",
    "attention, five implementations of it": "attention.py",
    "which attention runs where": "attention_choice.py",
    "learned positions": "positions.py",
    "rotary positions (RoPE)": "rotary.py",
    "every array a program takes, as shapes with their shardings": "shapes.py",
    "the jitted training step": "train.py",
    "bytes as tokens, batches as a function of (seed, step)": "data.py",
    "token files of other tools, memory-mapped": "token_files.py",
    "overlapped data loading": "prefetch.py",
    "the loop's clock: step time, MFU": "meter.py",
    "partition rules, params born sharded": "sharding.py",
    "which device sits where in a mesh": "topology.py",
    "the same model in Flax NNX": "flax_model.py",
    "a KV cache, prefill and decode": "inference.py",
    "the weights as decode reads them": "decode_layout.py",
    "Mosaic GPU across JAX versions: its kernels and its interpreter": "mosaic.py",
    "the attention half of a decode layer in one Mosaic GPU kernel": "decode_attention.py",
    "the MLP half of a decode layer as one Mosaic GPU kernel": "decode_mlp.py",
    "the decode step in kernels, two Mosaic GPU launches a layer; what they refuse": (
        "decode_kernels.py"
    ),
    "int8 weights and an int8 KV cache, absmax scales": "quantize.py",
    "what a cheaper decode costs in quality: loss through the decode path, greedy agreement": (
        "decode_quality.py"
    ),
    "sampling text": "sample.py",
    "our flash-attention kernel in Pallas": "flash.py",
    "its forward in Mosaic GPU, for Hopper and later": "flash_mosaic.py",
    "FSDP's collectives by hand": "manual_fsdp.py",
    "a collective matmul": "collective_matmul.py",
    "checking against a float32 reference on any chip": "precision.py",
}


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


def concept_files():
    scripts = {f"{m.split('.')[1]}.py" for m in SESSION_SCRIPTS}
    top = sorted(os.listdir(os.path.join(REPO, "sessions")))
    return [
        f"sessions/{n}" for n in top if n.endswith(".py") and n not in scripts | {"__init__.py"}
    ]


def layer_offenders(files, forbidden):
    """{file: [modules of this repository it imports under a forbidden folder]},
    for {file: its source}."""
    offenders = {}
    for path, source in files.items():
        found = {module_file(m) for m in imported(source)} - {None}
        found = sorted(f for f in found if f.startswith(forbidden))
        if found:
            offenders[path] = found
    return offenders


def test_concepts_import_neither_plumbing_nor_planning():
    """A student reads a concept without its plumbing, with no exception: how a run
    stops on purpose (errors.py) and the platform's defaults (defaults.py) are
    concepts themselves."""
    forbidden = ("sessions/run/", "sessions/plan/")
    assert not layer_offenders(sources(concept_files()), forbidden)


def test_plumbing_never_imports_planning():
    assert not layer_offenders(sources(python_files("sessions/run")), ("sessions/plan/",))


def test_a_planted_plumbing_import_in_a_concept_is_caught():
    planted = {
        "sessions/model/transformer.py": "from sessions.run import cli\nfrom sessions.run.report import x\n",
        "sessions/train/step.py": "def f():\n    from sessions.plan.programs import devices_for\n",
        "sessions/train/data.py": "from sessions.errors import UsageError\n",
    }
    found = layer_offenders(planted, ("sessions/run/", "sessions/plan/"))
    assert found == {
        "sessions/model/transformer.py": ["sessions/run/cli.py", "sessions/run/report.py"],
        "sessions/train/step.py": ["sessions/plan/programs.py"],
    }


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
    "sessions/run/cli.py",
    "sessions/model/config.py",
    "sessions/errors.py",
    "sessions/model/attention.py",
}


def test_roofline_s_command_line_takes_configs_and_flags_never_the_step():
    found = modules_imported(os.path.join("roofline", "__main__.py"))
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
    """A program: a session script, or anything under scripts/, which holds programs
    only (what they share is the package harness/)."""
    return module.startswith(SESSION_SCRIPTS) or module.split(".")[0] == "scripts"


def test_every_file_in_scripts_is_a_program():
    """scripts/ holds what a student runs; a module the programs share is harness/'s."""
    modules = [p for p in python_files("scripts") if os.path.basename(p) != "__init__.py"]
    assert len(modules) > 5  # the walk found the programs
    for path in modules:
        with open(os.path.join(REPO, path)) as f:
            assert 'if __name__ == "__main__":' in f.read(), f"{path} is no program"


def test_a_planted_import_of_a_script_s_module_is_caught():
    planted = "from scripts import rungs\n\ndef f():\n    import scripts.bench\n"
    found = sorted(m for m in imported(planted) if is_script(m))
    assert found == ["scripts", "scripts.bench", "scripts.rungs"]
    assert not [m for m in imported("from harness import rungs\n") if is_script(m)]


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
    folders = ["sessions/", "sessions/run/", "sessions/plan/", "roofline/"]
    folders += ["roofline/compiled/", "roofline/measured/", "roofline/plan/"]
    folders += ["scripts/", "harness/"]
    assert sorted(tables) == sorted(folders)
    for folder in folders:
        on_disk = {n for n in os.listdir(os.path.join(REPO, folder)) if n.endswith(".py")}
        assert tables[folder] == on_disk - {"__init__.py"}, folder


def test_each_concept_has_its_module_at_the_top_of_sessions():
    """The concept table, as docs/layout.md prints it, is this test's CONCEPTS, and
    each concept's module sits where a student looks first: sessions/ itself."""
    rows = {}
    for line in layout_page().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2 and cells[0] in CONCEPTS:
            rows[cells[0]] = cells[1].strip("`")
    assert rows == CONCEPTS
    assert sorted(f"sessions/{m}" for m in CONCEPTS.values()) == concept_files()


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
FOLDER_NAMES = r"sessions|roofline|scripts|harness|tests|exercises|solutions|docs|\.ci"
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
    for folder in ("sessions", "roofline", "scripts", "harness", "exercises", "solutions"):
        for path in python_files(folder):
            with open(os.path.join(REPO, path)) as f:
                lines = sum(1 for _ in f)
            if lines > LONGEST:
                over[path] = lines
    assert not over

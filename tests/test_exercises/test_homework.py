"""scripts/homework.py: a report per exercise, in Discord-sized parts, an honest exit status."""

import importlib
import inspect
import itertools
import math
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys

import pytest
from adapters import graded_tree

from scripts.harness import grading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cores():
    """The cores this process may run on, as the report counts them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def run_homework(*args, repo=REPO):
    """homework.py ARGS as a student runs it, in the repository at `repo`, whose
    modules come first (not those of an editable install elsewhere)."""
    path = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, os.path.join("scripts", "homework.py"), *args],
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    parts = done.stdout.strip().split(f"\n{grading.SEPARATOR}\n") if done.stdout.strip() else []
    return done, parts


def test_solutions_pass_in_one_message():
    done, parts = run_homework("1", "--solutions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(parts) == 1
    assert parts[0].startswith("**Homework · session 1: "), "the title says the session"
    assert grading.discord_length(parts[0]) <= grading.DISCORD_LIMIT
    assert "✅ `s1_feedforward.influence`" in parts[0]
    assert "machine: cpu" in parts[0] and "JAX " in parts[0]
    # tests/conftest.py's 8 devices are the host's cores, simulated: said so.
    assert f"machine: cpu, 8 simulated devices on {cores()} cores, JAX " in parts[0]
    assert "bigram" in parts[0], "the measured entropies are reported"


@pytest.mark.skipif(
    graded_tree() == "exercises",
    reason="grading exercises/: a student's copy is not all stubs",
)
def test_untouched_exercises_are_all_not_started_in_numbered_parts():
    done, parts = run_homework("all")
    assert done.returncode == 1
    assert all(grading.discord_length(p) <= grading.DISCORD_LIMIT for p in parts)
    if len(parts) > 1:
        assert all(f"(part {i}/{len(parts)})" in p.splitlines()[0] for i, p in enumerate(parts, 1))
    lines = [line for p in parts for line in p.splitlines() if line.startswith(tuple("✅❌⬜"))]
    assert len(lines) >= 40
    assert all(line.endswith(": not started") and line.startswith("⬜") for line in lines), lines


def test_unknown_session_is_one_line_and_status_2():
    done, parts = run_homework("nine")
    assert done.returncode == 2
    assert parts == [] and len(done.stderr.strip().splitlines()) == 1


def test_session_names():
    assert grading.session_names("2") == grading.session_names("s2") == ["2"]
    assert grading.session_names("Session2") == ["2"]
    assert grading.session_names("3") == grading.session_names("session3") == ["3"]
    assert grading.session_names("bugs") == ["bugs"]
    assert grading.session_names("all") == list(grading.SESSIONS)
    assert grading.session_names("5") == grading.session_names("s5") == ["5"]
    assert grading.session_names("7") == grading.session_names("s7") == ["7"]
    assert grading.session_names("8") is None and grading.session_names("") is None
    for gone in ("infer", "kernels"):  # the names before sets were numbered by session
        assert grading.session_names(gone) is None, gone


def test_homework_n_is_session_n():
    """Sessions numbered 1, 2, ... in order, one for each session script, then
    the sets that are no session; each title says its session's number (from
    SESSIONS, never from the script)."""
    scripts = sorted(
        p.name.split("_")[0] for p in pathlib.Path(REPO, "sessions").glob("s[0-9]_*.py")
    )
    numbered = [key for key in grading.SESSIONS if key.isdigit()]
    assert numbered == [str(n) for n in range(1, len(numbered) + 1)]
    with_script = [f"s{n}" for n in numbered[: len(scripts)]]
    assert with_script == scripts, "a session script without its homework"
    assert len(numbered) == len(scripts), "homework for sessions that have no script"
    assert list(grading.SESSIONS)[: len(numbered)] == numbered, "sessions first, in order"
    for key in numbered:
        title = grading.report_title([key])
        assert title.startswith(f"**Homework · session {key}: "), title
        assert title.endswith(f"{grading.SESSIONS[key][1]}**"), title
    assert grading.report_title(["bugs"]) == "**Homework · find the bug**"
    assert grading.report_title(list(grading.SESSIONS)) == "**Homework · all sessions**"


def test_a_long_report_is_split_under_the_limit():
    blocks = [["machine: cpu"]] + [
        [f"__session {s}__"] + [f"❌ `m.f{i}`: " + "x" * 250 for i in range(12)] for s in range(4)
    ]
    parts = grading.split_parts("**Homework · all sessions**", blocks)
    assert len(parts) > 2
    for i, part in enumerate(parts, 1):
        assert grading.discord_length(part) <= grading.DISCORD_LIMIT
        assert part.startswith(f"**Homework · all sessions** (part {i}/{len(parts)})")
    body = [line for part in parts for line in part.splitlines()[1:]]
    assert body == [line for block in blocks for line in block], "every line, once, in order"


def test_a_failure_shows_its_first_line_and_a_measurement_only_on_pass():
    entry = {"status": "fail", "why": "AssertionError: loss 3.26", "measured": ["x"]}
    assert grading.exercise_line("a.b", entry) == "❌ `a.b`: AssertionError: loss 3.26"
    entry = {"status": "pass", "why": "", "measured": ["1.9x"]}
    assert grading.exercise_line("a.b", entry) == "✅ `a.b` · 1.9x"
    assert grading.first_line("AssertionError: \nNot equal\nMismatch") == "Not equal"
    numpy = "AssertionError: \nNot equal to tolerance rtol=0\nquery s=2\nMismatched elements: 8 / 8"
    assert grading.first_line(numpy) == "Not equal to tolerance rtol=0 (query s=2)"
    assert grading.first_line("Failed: not started: a.b") == "not started: a.b"
    said = "AssertionError: K=8: yours 536,870,912 bytes, expected 1,073,741,824 bytes"
    assert grading.first_line(said) == said.removeprefix("AssertionError: ")


def test_a_failure_line_ends_with_the_hint_and_only_the_hint_is_cut():
    entry = {"status": "fail", "why": "K=8: yours 1, expected 2", "hint": "2·L·B·T", "measured": []}
    assert (
        grading.exercise_line("a.b", entry) == "❌ `a.b`: K=8: yours 1, expected 2 · Hint: 2·L·B·T"
    )
    entry["hint"] = "count " * 100
    line = grading.exercise_line("a.b", entry)
    assert len(line) == grading.LINE_LIMIT and line.endswith("count…")
    assert line.startswith("❌ `a.b`: K=8: yours 1, expected 2 · Hint: count count")
    for status in ("pass", "not started"):  # a hint only where something failed
        assert "Hint" not in grading.exercise_line("a.b", dict(entry, status=status))


def graded_exercises():
    """Every 'module.function' a session test grades."""
    tests = pathlib.Path(REPO, "tests", "test_exercises")
    text = "".join(tests.joinpath(file).read_text() for file, _ in grading.SESSIONS.values())
    return sorted(set(re.findall(r'mark\.exercise\("([\w.]+)"\)', text)))


@pytest.mark.parametrize("name", graded_exercises())
def test_every_exercise_has_a_hint_from_its_docstring(name):
    """The text after "Hint:" where the docstring has one; else its last paragraph."""
    module, _, function = name.rpartition(".")
    doc = inspect.getdoc(getattr(importlib.import_module(f"exercises.{module}"), function))
    hint = grading.hint(name)
    assert hint, f"{name}: no hint"
    flat = " ".join(doc.split())
    if "Hint:" in doc:
        assert f"Hint: {hint}" in flat, hint
    else:
        assert flat.endswith(hint), hint


def test_no_hint_for_a_test_that_grades_no_exercise():
    assert grading.hint("tests.test_exercises.test_session_2.test_x") == ""
    assert grading.hint("decode_cost.no_such_function") == ""
    assert grading.hint("no_such_module.f") == ""


def test_the_machine_line_says_which_devices_are_simulated():
    cpu = {"backend": "cpu", "device_kind": "cpu", "device_count": "8", "host_cores": "2"}
    line = grading.machine_line(dict(cpu, jax="0.10.2"), solutions=False)
    assert line.startswith("machine: cpu, 8 simulated devices on 2 cores, JAX 0.10.2, "), line
    assert line.endswith(" · graded exercises/") and "cpu x8" not in line
    one = grading.machine_line(dict(cpu, device_count="1"), solutions=True)
    assert "machine: cpu, 1 device on 2 cores, " in one and "simulated" not in one
    gpu = {"backend": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": "1"}
    line = grading.machine_line(dict(gpu, host_cores="16"), solutions=True)
    assert line.startswith("machine: gpu (NVIDIA H100 80GB HBM3 x1), 16 CPU cores, "), line
    assert "simulated" not in line and line.endswith(" · graded solutions/")


def test_a_wrong_answer_says_whose_number_its_unit_and_the_hint(tmp_path):
    """A student's bigram entropy in bits (log2), graded: the report's line names the
    exercise, the case, their number and the expected one in nats, and the hint."""
    for folder in ("sessions", "roofline", "scripts", "tests", "exercises", "solutions"):
        ignore = shutil.ignore_patterns("__pycache__", "fixtures")
        shutil.copytree(os.path.join(REPO, folder), tmp_path / folder, ignore=ignore)
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    solution = pathlib.Path(REPO, "solutions", "s1_feedforward.py").read_text()
    in_bits = solution.replace("np.log(p / current[a])", "np.log2(p / current[a])")
    assert in_bits != solution, "the planted bug no longer fits the solution"
    (tmp_path / "exercises" / "s1_feedforward.py").write_text(in_bits)
    done, parts = run_homework("1", repo=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {line.split("`")[1]: line for line in parts[0].splitlines() if line[:1] in "✅❌"}
    assert lines["s1_feedforward.influence"].startswith("✅"), lines
    line = lines["s1_feedforward.bigram_entropy"]
    said = re.fullmatch(
        r"❌ `s1_feedforward.bigram_entropy`: (.+?): yours (.+?) nats/byte, "
        r"expected (.+?) nats/byte ± \S+ · Hint: (.+)",
        line,
    )
    assert said, line
    what, yours, expected, hint = said.groups()
    assert what == "400 bytes of 0..4"
    assert float(yours) == pytest.approx(float(expected) / math.log(2), rel=1e-6), "bits"
    assert hint == grading.hint("s1_feedforward.bigram_entropy")


def utf16(text):
    return len(text.encode("utf-16-le")) // 2


def test_every_part_fits_discord_at_the_boundary():
    """Discord refuses a message over 2,000 characters (it counts UTF-16 code
    units: an emoji outside the BMP is two). Blocks of lines of awkward lengths
    (1 to 300, the longest an exercise line gets), with accents, marks and
    emoji, over many seeds, land parts on every side of the limit."""
    alphabet = ["a", "b", " ", "é", "✅", "…", "😀", "𝔸"]
    title = "**Homework · all sessions**"
    nearly_full = 0
    for seed in range(40):
        rng = random.Random(seed)
        blocks = [
            ["".join(rng.choices(alphabet, k=rng.randint(1, 300))) for _ in range(n)]
            for n in rng.choices([1, 1, 1, 2, 4], k=rng.randint(5, 60))
        ]
        parts = grading.split_parts(title, blocks)
        for i, part in enumerate(parts, 1):
            assert utf16(part) <= 2000, (seed, i, utf16(part))
            if len(parts) > 1:
                assert part.startswith(f"{title} (part {i}/{len(parts)})\n")
        body = [line for part in parts for line in part.splitlines()[1:]]
        assert body == [line for block in blocks for line in block], seed
        # Every block fits in one message, so a part ends only where the next
        # block would not fit: the header keeps room for "(part 99/99)", 13
        # characters at most, and nothing else is lost.
        starts = {block[0]: block for block in blocks}
        for part, following in itertools.pairwise(parts):
            block = starts[following.splitlines()[1]]
            assert utf16("\n".join([part, *block])) > 2000 - 13, seed
            nearly_full += utf16(part) > 2000 - 20
    assert nearly_full >= 3, "the seeds must put some parts right at the limit"

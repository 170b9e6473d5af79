"""An exercise is named after the module or package it practises, or is a declared topic.

exercises/flash.py practises sessions/kernels/flash.py, exercises/inference.py the package
sessions/inference/ (its KV cache); a student who finishes one knows which file to read next. An exercise that practises no one module
(a napkin, a find-the-bug drill) keeps a topic name, listed with its reason in
scripts/harness/grading.py's TOPIC_EXERCISES. Every exercise module is graded by a
test file that scripts/homework.py runs for some session, each exercise by one
session only, and exercises/README.md lists the sets in homework.py's order.
"""

import pathlib
import re

import pytest

from scripts.harness import grading

REPO = pathlib.Path(__file__).resolve().parents[2]


def module_names(folder):
    return {p.stem for p in (REPO / folder).glob("*.py") if p.stem != "__init__"}


def repository_modules():
    """Every module and package of sessions/ and roofline/, in any subfolder."""
    files = [p for package in ("sessions", "roofline") for p in (REPO / package).rglob("*.py")]
    modules = {p.stem for p in files if not p.stem.startswith("__")}
    return modules | {p.parent.name for p in files if p.name == "__init__.py"}


def test_both_trees_hold_the_same_modules():
    assert module_names("exercises") == module_names("solutions")
    assert (REPO / "exercises" / "README.md").is_file()


@pytest.mark.parametrize("folder", ["exercises", "solutions"])
def test_each_exercise_is_named_after_a_module_or_a_declared_topic(folder):
    modules = repository_modules()
    assert {"kv_cache", "preemption", "decode", "inference"} <= modules, "subfolders searched"
    unnamed = module_names(folder) - modules - set(grading.TOPIC_EXERCISES)
    assert not unnamed, (
        f"{folder}/: {sorted(unnamed)} name no module or package of sessions/ or roofline/ "
        "and are not in scripts/harness/grading.py's TOPIC_EXERCISES"
    )


def test_topic_names_are_not_module_names_and_are_all_exercises():
    """A topic named like a module would hide which one it practises; a topic
    with no exercise is a leftover."""
    topics = set(grading.TOPIC_EXERCISES)
    assert not topics & repository_modules()
    assert topics <= module_names("exercises")
    assert all(why.strip() for why in grading.TOPIC_EXERCISES.values())


def test_every_exercise_is_graded_by_a_session_of_homework_py():
    graded = set().union(*(graded_modules(f) for f, _ in grading.SESSIONS.values()))
    missing = module_names("exercises") - graded
    assert not missing, f"no session of scripts/homework.py grades {sorted(missing)}"


def graded_modules(test_file):
    text = (REPO / grading.TESTS / test_file).read_text()
    return set(re.findall(r'mark\.exercise\("(\w+)\.\w+"\)', text))


def test_each_exercise_is_graded_in_one_session():
    """A test copied into a second session's file, or left behind when a set
    moved, would grade one exercise twice."""
    where = {}
    for session, (test_file, _) in grading.SESSIONS.items():
        text = (REPO / grading.TESTS / test_file).read_text()
        for exercise in set(re.findall(r'mark\.exercise\("([\w.]+)"\)', text)):
            where.setdefault(exercise, []).append(session)
    twice = {exercise: sessions for exercise, sessions in where.items() if len(sessions) > 1}
    assert not twice, f"graded by more than one session: {twice}"


def test_the_exercises_readme_lists_the_sets_in_session_order():
    """Each set headed with its command, in homework.py's order, its table
    naming every module that session's tests grade."""
    text = (REPO / "exercises" / "README.md").read_text()
    heading = r"^## .*\(`" + re.escape("python scripts/homework.py") + r" (\w+)`\)$"
    assert re.findall(heading, text, re.M) == list(grading.SESSIONS)
    sections = re.split(heading, text, flags=re.M)[2::2]  # split also returns each key
    for session, section in zip(grading.SESSIONS, sections):
        listed = set(re.findall(r"^\| `(\w+)", section, re.M))
        missing = graded_modules(grading.SESSIONS[session][0]) - listed
        assert not missing, f"homework.py {session}: README lists no {sorted(missing)}"

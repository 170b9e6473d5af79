"""scripts/homework.py: a report per exercise, in Discord-sized parts, an honest exit status."""

import itertools
import os
import pathlib
import random
import subprocess
import sys

import pytest
from adapters import graded_tree

from scripts.harness import grading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_homework(*args):
    done = subprocess.run(
        [sys.executable, os.path.join("scripts", "homework.py"), *args],
        cwd=REPO,
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
    assert grading.session_names("7") is None and grading.session_names("") is None
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
    assert (
        grading.first_line("AssertionError: \nNot equal\nMismatch") == "AssertionError: Not equal"
    )
    numpy = "AssertionError: \nNot equal to tolerance rtol=0\nquery s=2\nMismatched elements: 8 / 8"
    assert grading.first_line(numpy) == "AssertionError: Not equal to tolerance rtol=0 (query s=2)"
    assert grading.first_line("Failed: not started: a.b") == "not started: a.b"


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

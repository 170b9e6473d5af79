"""The front door: README.md and the session guides (docs/session-1.md and on)
say only what the repository does.

    README.md       at most 200 lines; its sessions table gives each session
                    script a row naming a guide that exists and a homework
                    command whose session homework.py grades
    every snippet   of Python they show runs
    every command   shown in the README and the guides parses: each script with
                    each flag it is shown with, by a dry parse in this process
                    (the script runs as __main__ until its parser has read the
                    command line, then stops: nothing is trained or compiled);
                    so does every command in a block of the other pages (docs/,
                    CONTRIBUTING.md, exercises/ and roofline/'s READMEs)
    every path      they name exists, and every relative link resolves
    chip commands   a command that needs the chip compilers (--target,
                    max_batch.py, s4_kernels.py's step 5) says so beside it
    no issue        numbers in README.md or any page under docs/
"""

import argparse
import glob
import os
import re
import runpy
import shlex
import sys

import pytest
from helpers import REPO

README = "README.md"
MAX_README_LINES = 200
GUIDES = sorted(
    os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "session-*.md"))
)
FRONT_DOOR = [README, *GUIDES]
# Every page that shows commands: the front door, the reference pages and the rest.
PAGES = [
    *FRONT_DOOR,
    *sorted(
        os.path.relpath(p, REPO)
        for p in glob.glob(os.path.join(REPO, "docs", "*.md"))
        if os.path.relpath(p, REPO) not in GUIDES
    ),
    "CONTRIBUTING.md",
    "exercises/README.md",
    "roofline/README.md",
]
AOT = "requirements-aot.txt"
HOMEWORK = "scripts/homework.py"

# Commands shown that are not ours to parse, by their first word (or `python -m X`).
NOT_OURS = {"pip", "gcloud", "cd", "xprof", "ruff", "git", "tensorboard", "curl"}
NOT_OURS_MODULES = {"pytest", "pip"}


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


# Reading the markdown.

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
SHELL = {"bash", "sh", "shell", "console"}
PREFIX = re.compile(r"^(?:[A-Z_]+=\S+\s+)*python\s+\S")


def joined_lines(block):
    """A shell block's lines with backslash continuations joined."""
    return block.replace("\\\n", " ").splitlines()


def shown_commands(text, inline=True):
    """[(command, context)] for every command a page shows: each line of a shell
    block, each `$ `-prompted line of another block, and each inline code span
    that starts `python ` (or with VAR=value before it). The context is the
    text a reader sees around it: its block, or its line, with the 3 lines before."""
    found, spans = [], []
    for match in FENCE.finditer(text):
        language, block = match.group(1), match.group(2)
        spans.append(match.span())
        before = "\n".join(text[: match.start()].splitlines()[-3:])
        if language == "python":
            continue
        for line in joined_lines(block):
            line = line.strip()
            if language in SHELL and line and not line.startswith("#"):
                found.append((line.removeprefix("$ "), before + "\n" + block))
            elif line.startswith("$ "):
                found.append((line[2:], before + "\n" + block))
    if not inline:
        return found
    lines = text.splitlines(keepends=True)
    offset = 0
    for number, line in enumerate(lines):
        start, offset = offset, offset + len(line)
        if any(a <= start < b for a, b in spans):
            continue
        context = "".join(lines[max(0, number - 3) : number + 1])
        for span in INLINE.findall(line):
            if PREFIX.match(span):
                found.append((span, context))
    return found


def words_of(command):
    """A command line's commands, as word lists: split at &&, ||, ; and |, with
    comments gone and VAR=value assignments before each dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands, words = [], []
    for word in lexer:
        if word in {"&&", "||", ";", "|", "&"}:
            commands.append(words)
            words = []
        else:
            words.append(word)
    commands.append(words)
    result = []
    for words in commands:
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def script_of(words):
    """(file to run, its arguments) for `python SCRIPT ...` or `python -m roofline
    ...`; None for a command that is not ours (NOT_OURS)."""
    if words[0] in NOT_OURS:
        return None
    assert words[0] == "python", f"{shlex.join(words)}: not a python command (NOT_OURS?)"
    if words[1] == "-c":  # a client's one line (session 7's server), not a program of ours
        return None
    if words[1] == "-m":
        if words[2] in NOT_OURS_MODULES:
            return None
        assert words[2] == "roofline", f"{shlex.join(words)}: python -m of an unknown module"
        return "roofline/__main__.py", words[3:]
    return words[1], words[2:]


# The dry parse.


class Parsed(Exception):
    """Raised where the script's parser returns: its command line was read."""


def dry_parse(script, argv, monkeypatch, capsys):
    """Run SCRIPT as __main__ with ARGV until its parser has read the command line.
    -> None when it parsed (or printed --help), else the reason it did not."""
    capsys.readouterr()  # what earlier runs printed
    parse_args = argparse.ArgumentParser.parse_args
    parse_known_args = argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse(original):
        def wrapped(self, args=None, namespace=None):
            depth[0] += 1
            try:
                result = original(self, args, namespace)
            finally:
                depth[0] -= 1
            # Only the outermost call (a subcommand's parser is called inside it).
            if depth[0] == 0:
                raise Parsed(args)
            return result

        return wrapped

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse(parse_args))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse(parse_known_args))
    monkeypatch.setattr(sys, "argv", [os.path.join(REPO, script), *argv])
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # s4_kernels sets it
    try:
        if script == "roofline/__main__.py":
            runpy.run_module("roofline", run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.join(REPO, script), run_name="__main__")
    except Parsed as e:
        parsed = e.args[0]
        if parsed is not None and list(parsed) != argv:
            return f"its first parse read {parsed}, not the command line"
        return None
    except SystemExit as e:
        if e.code in (0, None):  # --help
            return None
        return f"exit status {e.code}: {capsys.readouterr().err.strip()[-500:]}"
    return "it ran to the end without parsing its command line"


# What runs after `--`: s2_train.py's flags, forwarded by these programs.
FORWARDS_TO_S2 = {"scripts/launch_local.py", "scripts/accelerator_check.py"}


def every_command(pages=FRONT_DOOR):
    """[(page, command words)] of every command of ours the pages show: on the
    front door also those named inline, on the other pages those in their blocks
    (where a command named in a sentence may stand for a family of them)."""
    result = []
    for page in pages:
        for line, _ in shown_commands(read(page), inline=page in FRONT_DOOR):
            result.extend((page, words) for words in words_of(line))
    return result


def test_the_front_door_shows_commands():
    """The reader finds something to run in each page (and the reader above works)."""
    pages = {page for page, _ in every_command()}
    assert pages == set(FRONT_DOOR)
    assert len(GUIDES) >= 4, GUIDES


def test_the_command_reader_finds_what_a_page_shows():
    text = (
        "Run `python sessions/s1_train.py --preset tiny` first.\n\n"
        "```bash\npip install -r requirements.txt\n"
        "XLA_FLAGS=--x=8 python sessions/s2_train.py \\\n    --mesh fsdp=8   # eight\n```\n"
        "```text\n$ python -m roofline chips\nstep 1 | loss 3.2\n```\n"
        "```python\nimport jax\n```\n"
    )
    shown = [words for line, _ in shown_commands(text) for words in words_of(line)]
    assert shown == [
        ["pip", "install", "-r", "requirements.txt"],
        ["python", "sessions/s2_train.py", "--mesh", "fsdp=8"],
        ["python", "-m", "roofline", "chips"],
        ["python", "sessions/s1_train.py", "--preset", "tiny"],
    ]


def test_every_command_shown_parses(monkeypatch, capsys):
    failures = []
    for page, words in every_command(PAGES):
        target = script_of(words)
        if target is None:
            continue
        script, argv = target
        # A shell variable ($RANK) is a value the reader gives: a number stands in for it.
        argv = ["1" if re.fullmatch(r"\$\{?[A-Z_]+\}?", a) else a for a in argv]
        runs = [(script, argv)]
        if script in FORWARDS_TO_S2 and "--" in argv:
            runs.append(("sessions/s2_train.py", argv[argv.index("--") + 1 :]))
        for script, argv in runs:
            if not os.path.isfile(os.path.join(REPO, script)):
                failures.append(f"{page}: {shlex.join(words)}: no such script {script}")
                continue
            with monkeypatch.context() as patch:
                reason = dry_parse(script, argv, patch, capsys)
            if reason:
                failures.append(f"{page}: {shlex.join(words)}: {reason}")
    assert not failures, "\n".join(failures)


def test_the_dry_parse_catches_a_misspelt_flag(monkeypatch, capsys):
    with monkeypatch.context() as patch:
        assert dry_parse("sessions/s2_train.py", ["--preset", "tiny"], patch, capsys) is None
    with monkeypatch.context() as patch:
        reason = dry_parse("sessions/s2_train.py", ["--pre-set", "tiny"], patch, capsys)
    assert reason and "exit status 2" in reason and "--pre-set" in reason
    with monkeypatch.context() as patch:
        assert dry_parse("roofline/__main__.py", ["predict", "--chips", "0"], patch, capsys)


def needs_the_chip_compilers(words):
    target = script_of(words)
    if target is None:
        return False
    script, argv = target
    if script == "sessions/s4_kernels.py":  # step 5 plans on a chip unless told not to
        return "--no-target" not in argv
    return script == "scripts/max_batch.py" or any(a.startswith("--target") for a in argv)


def test_a_command_that_needs_the_chip_compilers_says_so_beside_it():
    """On the front door; docs/chips.md, the page about those compilers, says it once."""
    missing = []
    for page in FRONT_DOOR:
        for line, context in shown_commands(read(page)):
            if any(needs_the_chip_compilers(w) for w in words_of(line)) and AOT not in context:
                missing.append(f"{page}: {line}")
    assert not missing, f"shown without {AOT} beside it:\n" + "\n".join(missing)


def test_every_python_snippet_runs():
    """A snippet a student copies runs as shown: no undefined name, no stale API."""
    for page in FRONT_DOOR:
        for match in FENCE.finditer(read(page)):
            if match.group(1) == "python":
                exec(compile(match.group(2), page, "exec"), {"__name__": "snippet"})


# Paths and links.

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TOP = r"(?:sessions|roofline|scripts|tests|exercises|solutions|docs|\.ci)"
REPO_PATH = re.compile(
    rf"(?<![\w/.-])({TOP}(?:/[\w.*-]+)+/?|(?:README|CONTRIBUTING)\.md|requirements[\w-]*\.txt)"
)


def missing_paths(page, text):
    """What a page names that is not in the repository: paths from the root in
    its text, and its relative links from the page's own folder."""
    missing = set()
    for path in REPO_PATH.findall(text):
        path = path.rstrip(".")
        if "*" not in path and not os.path.exists(os.path.join(REPO, path)):
            missing.add(path)
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        target = os.path.normpath(os.path.join(os.path.dirname(page), link.split("#")[0]))
        if not os.path.exists(os.path.join(REPO, target)):
            missing.add(link)
    return missing


@pytest.mark.parametrize("page", FRONT_DOOR)
def test_every_path_and_link_the_front_door_names_exists(page):
    assert not missing_paths(page, read(page))


def test_the_path_reader_sees_a_missing_file():
    nothing = os.path.join("sessions", "nothing.py")  # joined: no file names it whole
    text = f"see `{nothing}`, [a guide](session-9.md) and [a site](https://x.org/a.md)"
    assert missing_paths("docs/session-2.md", text) == {nothing, "session-9.md"}
    assert missing_paths("docs/session-2.md", "[s2](../sessions/s2_train.py)") == set()


# The sessions table.


def sessions_table(text):
    """[{column: cell}] of the README table whose header names a guide and homework."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
        elif {"guide", "homework"} <= set(header) and not set(line) <= set("|-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def test_the_readme_is_at_most_200_lines():
    lines = read(README).count("\n")
    assert lines <= MAX_README_LINES, f"README.md is {lines} lines"


def test_each_session_has_a_row_with_its_guide_and_homework():
    from scripts.harness import grading

    rows = sessions_table(read(README))
    scripts = sorted(os.path.basename(p) for p in glob.glob(f"{REPO}/sessions/s[0-9]_*.py"))
    assert len(rows) == len(scripts), (rows, scripts)
    for row, script in zip(rows, scripts):
        text = " ".join(row.values())
        assert f"sessions/{script}" in text, (script, row)
        session = script[1]
        guide = os.path.join("docs", f"session-{session}.md")
        assert f"({guide})" in row["guide"], (guide, row["guide"])
        assert os.path.isfile(os.path.join(REPO, guide)), guide
        homework = re.findall(rf"python {re.escape(HOMEWORK)} (\w+)", row["homework"])
        assert homework == [session], (script, row["homework"])
        assert grading.session_names(session) == [session], f"homework.py has no session {session}"


# No lab log.

ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)


def test_no_page_a_student_reads_speaks_of_issue_numbers():
    pages = [README, *sorted(glob.glob("docs/**/*.md", root_dir=REPO, recursive=True))]
    found = {page: ISSUE.findall(read(page)) for page in pages}
    assert not {page: hits for page, hits in found.items() if hits}

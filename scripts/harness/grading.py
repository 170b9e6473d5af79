"""Grading the exercises and shaping the report (scripts/homework.py is the
command): run the session's tests in a fresh pytest process, read its results,
and split the Markdown report into Discord-sized parts."""

import ast
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join("tests", "test_exercises")

# Session -> (its test file, what it practises): `homework.py N` grades session
# N's exercises, each set under the session whose concept it practises.
# exercises/README.md lists the same, in this order.
SESSIONS = {
    "1": ("test_session_1.py", "a model without attention"),
    "2": ("test_session_2.py", "attention, positions, jit, loading, multichip, FLOPs, intensity"),
    "3": ("test_session_3.py", "inference, the KV cache, decode and inference rooflines"),
    "4": ("test_session_4.py", "flash attention, FSDP and a ring matmul by hand, Pallas"),
    "5": (
        "test_session_5.py",
        "more users from the same memory: grouped-query attention, RoPE, int8, published models",
    ),
    "6": (
        "test_session_6.py",
        "training memory: bytes a parameter, remat's saved values by policy and by name, "
        "accumulation, chips, Korthikanti's table, a chunked loss",
    ),
    "7": (
        "test_session_7.py",
        "the serving loop: continuous batching, a paged KV cache, Little's law",
    ),
    "bugs": ("test_session_bugs.py", "find the bug"),
}
# An exercise that rebuilds a module of the repository (its solution mirrors
# or calls that module's functions) carries the module's name: exercises/flash.py
# practises sessions/kernels/flash.py. These practise no one module and keep a topic
# name (tests/test_exercises/test_exercise_names.py holds every name to this).
TOPIC_EXERCISES = {
    "s1_feedforward": "session 1's model as a bigram model; sessions/model/ holds the transformer",
    "jit_fusion": "XLA's fusion under jax.jit, measured; no module of ours fuses",
    "intensity": "a napkin of a relu-attention chain; no module computes a chain's intensity",
    "mfu_vs_bandwidth": "a napkin of MFU against MBU; predict.py and decode_cost.py hold one each",
    "inference_roofline": "a napkin of prefill, holding and generating; no module plans all three",
    "int8_numerics": "an int8 sum accumulated in int32; quantize.py scales matrices, never sums",
    "pallas_matmul": "a first Pallas kernel; the course's, for attention, is kernels/flash.py",
    "serving_napkin": "a napkin of batching, pages and Little's law; no one module plans them all",
    **dict.fromkeys(
        [
            "bug_zero_inputs",
            "bug_host_sync",
            "bug_recompile",
            "bug_device_put_init",
            "bug_slow_loader",
            "bug_attention_flops",
            "bug_bf16_scatter",
            "bug_remat",
            "bug_page_leak",
            "bug_shared_position",
        ],
        "a find-the-bug drill: the bug and the tool that finds it, whatever module it touches",
    ),
}
DISCORD_LIMIT = 2000  # characters per message
LINE_LIMIT = 300  # one exercise's line, at most
SEPARATOR = "----- 8< -----"  # between parts; not part of any message
MARK = {"pass": "✅", "fail": "❌", "not started": "⬜"}


def session_names(text):
    """'2', 's2', 'session2', 'bugs' or 'all' -> list of session keys; None if unknown."""
    text = text.lower()
    if text == "all":
        return list(SESSIONS)
    key = text.removeprefix("session").removeprefix("s") if text[-1:].isdigit() else text
    return [key] if key in SESSIONS else None


def session_title(session):
    """'3' -> 'session 3: inference, ...'; a set that is no session keeps its name."""
    what = SESSIONS[session][1]
    return f"session {session}: {what}" if session.isdigit() else what


def report_title(sessions):
    """The bold line that heads every Discord message of the report."""
    name = "all sessions" if len(sessions) > 1 else session_title(sessions[0])
    return f"**Homework · {name}**"


def run_tests(sessions, solutions, timeout, verbose):
    """Run the sessions' tests in a fresh pytest; returns (junit XML root or None, output)."""
    files = [os.path.join(TESTS, SESSIONS[s][0]) for s in sessions]
    env = dict(os.environ, HPLLM_EXERCISES="0" if solutions else "1")
    with tempfile.TemporaryDirectory() as tmp:
        xml_path = os.path.join(tmp, "report.xml")
        command = [
            sys.executable,
            "-m",
            "pytest",
            *files,
            "-q",
            "-n",  # in this process: the machine's properties reach the report only from here
            "0",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml_path}",
            "-o",
            "junit_family=xunit1",
            "-W",
            "ignore",
        ]
        try:
            done = subprocess.run(
                command,
                check=False,  # failing tests are the report, not an error
                cwd=REPO,
                env=env,
                timeout=timeout,
                stdout=None if verbose else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except subprocess.TimeoutExpired:
            return (
                None,
                f"the tests ran past --timeout {timeout} s (an exercise that never returns?)",
            )
        output = done.stdout or ""
        if not os.path.exists(xml_path):
            return None, output
        return ET.parse(xml_path).getroot(), output


def first_line(text):
    """The first line of a failure message, completed where it says too little."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return "failed"
    line = lines[0].removeprefix("Failed: ")
    if line.endswith(":") and len(lines) > 1:  # "AssertionError:", the message below it
        line += " " + lines[1]
        # numpy's "Not equal to tolerance ..." is followed by the test's err_msg, if any.
        numpy = lines[1].startswith(("Not equal", "Arrays are not"))
        if numpy and len(lines) > 2 and not lines[2].startswith(("Mismatch", "(shapes", "x:")):
            line += f" ({lines[2]})"
    # A test's own words (tests/test_exercises/expect.py's) need no exception name.
    return line.removeprefix("AssertionError:").strip()


def hint(name):
    """The hint for exercise 'module.function', from its docstring: the text after
    "Hint:", else the last paragraph (how to compute it); "" for no exercise.

    Read from solutions/, whose docstrings are the exercises' own (a test holds
    them equal), with ast: a student's half-written exercise may not even parse."""
    module, _, function = name.rpartition(".")
    path = os.path.join(REPO, "solutions", f"{module}.py")
    if not module or not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    doc = ast.get_docstring(functions[0]) if functions else None
    if not doc:
        return ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    hinted = [p.partition("Hint:")[2].strip() for p in paragraphs if "Hint:" in p]
    return hinted[0] if hinted else paragraphs[-1]


def results(root):
    """(machine, {exercise: {"status", "why", "hint", "measured", "session_file"}}), in
    test order; a failed exercise's hint comes from its docstring.

    A test that grades no exercise (a file that failed to import, say) is
    listed under its own name, so nothing that failed goes unreported."""
    machine, failures, exercises = {}, {}, {}
    for suite in root.iter("testsuite"):
        for prop in suite.findall("properties/property"):
            machine[prop.get("name")] = prop.get("value")
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.findall("properties/property")}
        where = f"{case.get('classname', '')}.{case.get('name', '')}"
        name = props.get("exercise") or where.strip(".")
        session_file = next((p for p in where.split(".") if p.startswith("test_session_")), "")
        entry = exercises.setdefault(
            name, {"status": "pass", "why": "", "measured": [], "session_file": session_file}
        )
        if props.get("measured"):
            entry["measured"].append(props["measured"])
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            failures.setdefault(name, []).append(first_line(problem.get("message") or problem.text))
    for name, whys in failures.items():
        real = [why for why in whys if why != f"not started: {name}"]
        exercises[name]["status"] = "fail" if real else "not started"
        exercises[name]["why"] = real[0] if real else ""
        exercises[name]["hint"] = hint(name) if real else ""
    return machine, exercises


def exercise_line(name, entry):
    line = f"{MARK[entry['status']]} `{name}`"
    if entry["status"] == "fail":
        line += f": {entry['why']}"
        if entry.get("hint"):  # last: what is cut at LINE_LIMIT is the hint's end
            line += f" · Hint: {entry['hint']}"
    elif entry["status"] == "not started":
        line += ": not started"
    if entry["measured"] and entry["status"] == "pass":
        line += " · " + "; ".join(entry["measured"])
    return line if len(line) <= LINE_LIMIT else line[: LINE_LIMIT - 1] + "…"


def machine_line(machine, solutions):
    """What ran the tests. On a CPU, JAX's devices are simulated (tests/conftest.py
    asks XLA for 8), all sharing the host's cores: said so, with the real cores
    beside them, lest 8 devices read as 8 chips."""
    backend, count = machine.get("backend", "?"), machine.get("device_count", "?")
    cores = machine.get("host_cores", "?")
    if backend == "cpu":
        devices = f"{count} simulated devices" if count != "1" else "1 device"
        what = f"cpu, {devices} on {cores} cores"
    else:
        what = f"{backend} ({machine.get('device_kind', '?')} x{count}), {cores} CPU cores"
    system = f"Python {platform.python_version()}, {platform.system()} {platform.machine()}"
    tree = "solutions/" if solutions else "exercises/"
    return f"machine: {what}, JAX {machine.get('jax', '?')}, {system} · graded {tree}"


def report_blocks(sessions, machine, exercises, solutions):
    """The report as blocks of lines, kept together in one message where they fit:
    the machine; per session its exercises; the tally."""
    blocks = [[machine_line(machine, solutions)]]
    for session in sessions:
        test_file = SESSIONS[session][0].removesuffix(".py")
        mine = {n: e for n, e in exercises.items() if e["session_file"] == test_file}
        heading = [f"__{session_title(session)}__"] if len(sessions) > 1 else []
        blocks.append(heading + [exercise_line(name, entry) for name, entry in mine.items()])
    unplaced = {n: e for n, e in exercises.items() if not e["session_file"]}
    if unplaced:
        blocks.append([exercise_line(name, entry) for name, entry in unplaced.items()])
    counts = {s: sum(e["status"] == s for e in exercises.values()) for s in MARK}
    tally = f"**{counts['pass']}/{len(exercises)} pass**"
    if counts["fail"]:
        tally += f" · {counts['fail']} fail"
    if counts["not started"]:
        tally += f" · {counts['not started']} not started"
    blocks.append([tally])
    return blocks


def discord_length(text):
    """Discord counts UTF-16 code units; most characters are one."""
    return len(text.encode("utf-16-le")) // 2


def split_parts(title, blocks, limit=DISCORD_LIMIT):
    """Messages of at most `limit` characters, the title on each, numbered when
    several. A block starts a new message when it does not fit in the current
    one; a block too long for any message is split between lines."""
    room = limit - discord_length(title + " (part 99/99)\n")
    chunks, current = [], []

    def fits(lines):
        return discord_length("\n".join(lines)) <= room

    for block in blocks:
        if current and not fits(current + block):
            chunks.append(current)
            current = []
        for line in block:
            if current and not fits([*current, line]):
                chunks.append(current)
                current = []
            current.append(line)
    chunks.append(current)
    if len(chunks) == 1:
        return ["\n".join([title, *chunks[0]])]
    n = len(chunks)
    return ["\n".join([f"{title} (part {i}/{n})", *c]) for i, c in enumerate(chunks, 1)]

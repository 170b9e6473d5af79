"""A profile that tells the truth: own times never negative, shares that add up,
and a GPU's kernels given to their HLO ops, command buffers or not.

Random event sets check the reader's invariants against a brute-force count;
two real H100 traces (tests/fixtures/h100/, cut by trim.py there from the
first GPU run) check it where it once printed "other 473.5%" and
"copy/transpose -451.9%", and lumped 99% of a step into `command_buffer_1`.
"""

import collections
import gzip
import json
import os
import random
import shutil

import pytest

from roofline import __main__ as cli
from roofline.compiled.kinds import KINDS, classify_hlo
from roofline.measured.kernel_ops import align, attribute
from roofline.measured.trace import _self_times, read_trace, step_profile
from roofline.measured.trace_ops import Op
from roofline.measured.xspace import read_xspace

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "h100")
SCATTER = "input_scatter_fusion"  # the bf16 scatter-add of the embedding's gradient


def random_ops(rng, lines=3, roots=6):
    """Events on a few lines: trees of ops nested in their parents, and siblings
    that overlap by a little, as consecutive GPU kernels do in a trace."""
    ops, seen = [], set()

    def add(line, start, end, depth):
        if end <= start or (line, start, end) in seen:
            return
        seen.add((line, start, end))
        ops.append(Op(f"op{len(ops)}", "m", (0, 0), line, start, end))
        if depth < 3:  # children clear of where the op overlaps its neighbours (< 5)
            t = start + 5
            for _ in range(rng.randint(0, 3)):
                a = t + rng.randint(0, 5) - rng.randint(0, 3)  # may overlap the last
                b = a + rng.randint(1, 40)
                if b <= end - 5 and a >= start + 5:
                    add(line, a, b, depth + 1)
                    t = b

    for line in range(lines):
        t = 0
        for _ in range(roots):
            start = t - rng.randint(0, 4)  # overlaps the previous root a little
            end = start + rng.randint(5, 120)
            add(f"line{line}", max(start, 0), end, 0)
            t = end
    return ops


def union(intervals):
    covered, reach = 0, None
    for a, b in sorted(intervals):
        a = a if reach is None else max(a, reach)
        if b > a:
            covered, reach = covered + b - a, b
    return covered


def brute_own(ops):
    """An op's own time: its interval less the union of the other ops of its
    line that start and end within it (no nesting order involved)."""
    return [
        (op.end_ps - op.start_ps)
        - union(
            (o.start_ps, o.end_ps)
            for o in ops
            if o is not op
            and o.line == op.line
            and op.start_ps <= o.start_ps
            and o.end_ps <= op.end_ps
        )
        for op in ops
    ]


@pytest.mark.parametrize("seed", range(40))
def test_random_nested_and_overlapping_events_keep_the_invariants(seed):
    rng = random.Random(seed)
    ops = random_ops(rng)
    own = _self_times(ops)
    assert own == brute_own(ops)
    assert min(own) >= 0
    kinds = ("matmul", "elementwise", "copy/transpose", "other")
    step = step_profile(1, ops, lambda op: kinds[int(op.name[2:]) % len(kinds)])
    assert all(v >= 0 for v in step.by_kind.values())
    assert sum(step.by_kind.values()) == pytest.approx(step.wall_s)  # shares add up to 100%
    assert sum(step.by_op.values()) == pytest.approx(step.busy_s)


def test_a_kernel_that_starts_before_the_last_one_ends_is_not_nested_in_it():
    """As on the H100: a transpose (22.6 us) starting 4 us before a 146 ms scatter
    ended was taken for its child; the scatter's own time must stay whole."""
    scatter = Op(SCATTER, "m", (0, 0), "stream", 0, 146_000_000)
    transpose = Op("transpose", "m", (0, 0), "stream", 145_996_000, 146_018_600)
    assert _self_times([scatter, transpose]) == [146_000_000, 22_600]


@pytest.mark.parametrize("cudnn_first", [False, True])
def test_a_library_s_kernels_go_to_a_call_of_that_library(cudnn_first):
    """Between two fusions, a cuBLAS call and a cuDNN call: cuDNN's three kernels
    go to its call, cuBLAS's one to its own, whichever call runs first."""
    calls = [("custom-call.1", "gemm"), ("attention.2", "cudnn")]
    ran = [[("gemm", None, None)], [("cudnn", None, None)] * 3]
    if cudnn_first:
        calls, ran = calls[::-1], ran[::-1]
    ops = [("loop_add_fusion.1", "kernel"), *calls, ("loop_add_fusion.2", "kernel")]
    fusion = [("kernel", "loop_add_fusion.1", None)], [("kernel", "loop_add_fusion.2", None)]
    path = align(fusion[0] + ran[0] + ran[1] + fusion[1], ops)
    assert path == [0, *[1] * len(ran[0]), *[2] * len(ran[1]), 3]


# ------------------------------------------------------------- real H100 traces


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    """{name: log directory} of the two traces, as jax.profiler lays them out."""
    found = {}
    for name in ("profile-early", "command-buffer"):
        source = os.path.join(FIXTURES, name)
        logdir = tmp_path_factory.mktemp(name.replace("-", "_"))
        run = logdir / "plugins" / "profile" / "2026_11_24_23_00_00"
        run.mkdir(parents=True)
        with gzip.open(os.path.join(source, "vm.xplane.pb.gz")) as f:
            (run / "vm.xplane.pb").write_bytes(f.read())
        with gzip.open(os.path.join(source, "step.hlo.txt.gz"), "rt") as f:
            (logdir / "step.hlo.txt").write_text(f.read())
        shutil.copy(os.path.join(source, "roofline.json"), logdir / "roofline.json")
        found[name] = str(logdir)
    return found


def step_events(logdir):
    """Each traced step's kernels of the step's program, in the order they ran,
    read straight from the XSpace: [[Event]]."""
    (path,) = [os.path.join(r, f) for r, _, fs in os.walk(logdir) for f in fs if f.endswith(".pb")]
    (gpu,) = [p for p in read_xspace(path) if p.name == "/device:GPU:0"]
    events = sorted(
        (e for line in gpu.lines for e in gpu.events(line, having="hlo_op")),
        key=lambda e: e.start_ps,
    )
    events = [e for e in events if e.stats.get("hlo_module") == "jit_train_step"]
    steps, first = [], events[0].long_name  # every step starts with the same kernel
    for e in events:
        if e.long_name == first:
            steps.append([])
        steps[-1].append(e)
    return steps


def kernels(logdir):
    """[[(kernel name, hlo_op, seconds)]] of each traced step."""
    return [
        [(e.long_name, e.stats["hlo_op"], e.duration_ps * 1e-12) for e in step]
        for step in step_events(logdir)
    ]


def busy_over_total(logdir, step):
    """The time some kernel of the step ran, over the sum of their durations."""
    events = step_events(logdir)[step]
    return union((e.start_ps, e.end_ps) for e in events) / sum(e.duration_ps for e in events)


def hlo(logdir):
    with open(os.path.join(logdir, "step.hlo.txt")) as f:
        return f.read()


def test_hidden_op_names_are_found_again_from_the_schedule(h100):
    """With command buffers off every kernel names its op: hide the names, as a
    command buffer does, and the alignment must give each kernel that op back."""
    logdir = h100["profile-early"]
    steps = kernels(logdir)
    assert [len(s) for s in steps] == [404, 404, 404]
    for step in steps:
        found = attribute([(name, "command_buffer_1") for name, _, _ in step], hlo(logdir))
        assert [found.get(i) for i in range(len(step))] == [op for _, op, _ in step]


def test_compare_names_the_scatter_as_the_slowest_op_and_says_why(h100, tmp_path, capsys):
    logdir = h100["profile-early"]
    summary = tmp_path / "summary.json"
    assert cli.main(["compare", logdir, "--summary-out", str(summary)]) == 0
    table = capsys.readouterr().out
    top = json.loads(summary.read_text())["top_measured_ops"]
    assert top[0]["name"] == SCATTER and top[0]["broken"]
    # The trace's time for it: its kernel's duration in each of the 3 steps (4.6, 6.7
    # and 31.6 ms), as the reader counts it: a step's busy time (the union of its
    # kernels) is split in proportion to their durations, so the microseconds by
    # which consecutive kernels overlap in the trace's clock count once.
    steps = kernels(logdir)
    durations = [sum(s for _, op, s in step if op == SCATTER) for step in steps]
    assert [round(d * 1e3, 1) for d in durations] == [4.6, 6.7, 31.6]
    shares = [busy_over_total(logdir, i) for i in range(3)]
    expected = sum(d * k for d, k in zip(durations, shares)) / 3
    assert 0.99 < min(shares) <= max(shares) <= 1
    assert top[0]["measured_seconds"] == pytest.approx(expected, rel=1e-9)
    assert not any(row["broken"] for row in top[1:])  # the rest within 10x of their roofs
    words = " ".join(table.split())  # the explanation is wrapped over lines
    assert f"{SCATTER} took" in words and "the prediction's assumptions broke there" in words
    assert "atomic adds" in words and "sum in float32" in words
    shares = [float(line.split()[1].rstrip("%")) for line in table.splitlines() if share(line)]
    assert len(shares) == len(KINDS)
    assert all(0 <= x <= 100 for x in shares) and sum(shares) == pytest.approx(100, abs=0.1)


def share(line):
    words = line.split()
    return len(words) > 1 and words[0] in KINDS and words[1].endswith("%")


def by_kind_without_the_scatter(profile, hlo_text):
    kinds, seconds = classify_hlo(hlo_text), collections.Counter()
    for name, s in profile.op_seconds().items():
        if name != SCATTER:
            seconds[kinds[name]] += s
    return seconds


def test_command_buffer_kernels_go_to_their_ops_and_agree_with_the_early_trace(h100):
    """The same program traced twice: with command buffers (every kernel's hlo_op
    is command_buffer_1) and without. Outside the scatter, whose time follows
    the values it sums, each kind's time agrees within 10%."""
    early_hlo, buffered_hlo = hlo(h100["profile-early"]), hlo(h100["command-buffer"])
    early = read_trace(h100["profile-early"], hlo_text=early_hlo)
    buffered = read_trace(h100["command-buffer"], hlo_text=buffered_hlo)
    assert buffered.buffered_kernels == 376 and early.buffered_kernels == 0
    names = buffered.op_seconds()
    assert not [n for n in names if n.startswith("command_buffer")]
    assert set(names) <= set(classify_hlo(buffered_hlo))  # every kernel is an op of the step
    assert max(names, key=names.get) == SCATTER
    ours, theirs = (by_kind_without_the_scatter(p, early_hlo) for p in (buffered, early))
    assert ours.keys() == theirs.keys() and min(theirs.values()) > 0
    for kind in theirs:
        assert ours[kind] == pytest.approx(theirs[kind], rel=0.10), kind


def test_without_its_hlo_a_command_buffer_trace_is_read_by_kernel_names(h100, tmp_path):
    """No step.hlo.txt and no HLO in the trace: a generated kernel's name gives
    its op, a library's kernel (nvjet, cudnn) its kind."""
    logdir = tmp_path / "bare"
    shutil.copytree(os.path.join(h100["command-buffer"], "plugins"), logdir / "plugins")
    profile = read_trace(str(logdir))
    assert profile.buffered_by == "kernel names"
    names = profile.op_seconds()
    assert max(names, key=names.get) == SCATTER
    assert any(n.startswith("nvjet_sm90") for n in names)
    by_hlo = read_trace(h100["command-buffer"], hlo_text=hlo(h100["command-buffer"]))
    matmul = by_hlo.kind_seconds()["matmul"]
    assert profile.kind_seconds()["matmul"] == pytest.approx(matmul, rel=0.10)

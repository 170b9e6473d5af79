"""Reading a compiled schedule: which collectives a program hides behind its matmuls.

A compiled program is scheduled: each computation prints its instructions in
the order they run, so the text says, for each collective-permute, whether a
matmul runs between its start and its done (the permute then flies while the
matmul units work: hidden), how many permutes are in flight at once, and how
many all-gathers the program still makes. sessions/shard/collective_matmul.py's
three ways of one FSDP matmul are told apart this way, and so is XLA's own
collective-matmul loop (a windowed einsum) in a whole training step.
"""

import itertools
from typing import NamedTuple

from roofline.compiled.hlo import parse
from roofline.compiled.kinds import classify_hlo
from roofline.compiled.program import collectives


class Schedule(NamedTuple):
    """What one device runs, in the compiled order (loop bodies once a trip)."""

    permutes: int  # collective-permutes (a start and its done count once)
    all_gathers: int
    matmuls: int  # dots and convolutions, fused or not
    hidden: int  # permutes with a matmul between their start and their done
    in_flight: int  # the most permutes started and not yet done at one time
    alternate: bool  # a matmul between every two permutes sent, in every computation
    loops: int  # XLA's own collective-matmul loops (windowed einsums)


def _steps(computation, kinds):
    """The computation's permutes and matmuls in the order they run:
    ("start" | "done" | "permute" | "matmul", instruction)."""
    for op in computation.instructions:
        if op.opcode.startswith("collective-permute"):
            yield op.opcode.removeprefix("collective-permute").lstrip("-") or "permute", op
        elif kinds.get(op.name) == "matmul":
            yield "matmul", op


def _tally(computation, kinds):
    """(permutes, matmuls, hidden permutes, most in flight, alternate) of one computation."""
    steps = list(_steps(computation, kinds))
    roles = [role for role, _ in steps]
    started = {op.name: at for at, (role, op) in enumerate(steps) if role == "start"}
    hidden = sum(
        "matmul" in roles[started[op.operands[0]] : at]
        for at, (role, op) in enumerate(steps)
        if role == "done" and op.operands and op.operands[0] in started
    )
    flying = most = 0
    for role in roles:
        flying += (role == "start") - (role == "done")
        most = max(most, flying)
    sent = [role for role in roles if role != "done"]
    alternate = all(a == "matmul" or b == "matmul" for a, b in itertools.pairwise(sent))
    permutes = roles.count("start") + roles.count("permute")
    return permutes, roles.count("matmul"), hidden, most, alternate


def schedule_summary(hlo_text):
    """The Schedule of a compiled program's text (`compiled.as_text()`).

    A compiled program is scheduled: each computation prints its instructions in
    the order they run. The entry computation is read, and each loop body it runs
    counts once a trip (`Module.trip_counts`); a matmul inside a fusion is found
    by what the fusion holds (roofline/compiled/kinds.py). All-gathers are counted
    as the `--target` report counts them (roofline/compiled/program.py: a TPU
    spreads one over several fusions that share its channel); permutes one a
    start, as an unrolled chain of them (sessions/shard/collective_matmul.py's ring)
    shares one channel."""
    module, kinds = parse(hlo_text), classify_hlo(hlo_text)
    trips = module.trip_counts
    bodies = [
        op.calls["body"][0]
        for op in module.entry.instructions
        if op.opcode == "while" and "body" in op.calls
    ]
    tallies = [(1, _tally(module.entry, kinds))]
    tallies += [(trips.get(b, 1), _tally(module.computations[b], kinds)) for b in bodies]
    permutes, matmuls, hidden = (sum(times * t[i] for times, t in tallies) for i in (0, 1, 2))
    gathers = collectives(hlo_text, devices=1).get("all-gather")  # the group size: not needed
    return Schedule(
        permutes=permutes,
        all_gathers=gathers.count if gathers else 0,
        matmuls=matmuls,
        hidden=hidden,
        in_flight=max(t[3] for _, t in tallies),
        alternate=all(t[4] for _, t in tallies),
        loops=sum("windowed_dot_general" in b for b in bodies),
    )


def schedule_line(name, schedule):
    """One line of text for a Schedule, named `name`."""
    s = schedule
    counts = [(s.permutes, "permute"), (s.all_gathers, "all-gather"), (s.matmuls, "matmul")]
    line = ", ".join(f"{n} {what}{'s' * (n != 1)}" for n, what in counts if n)
    if s.loops:
        line += f" in {s.loops} windowed-einsum loop{'s' * (s.loops != 1)}"
    if s.permutes:
        line += f"; {s.hidden} of them hidden behind a matmul, {s.in_flight} at most in flight"
    return f"{name}: {line}"

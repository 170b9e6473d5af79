"""The first GPU call's one table: each figure scripts/gpu_first_call.sh measured, beside
the roofline's prediction that the same script printed and wrote.

    python scripts/first_call_table.py WORK_DIR                  # WORK_DIR: the call's pieces
    python scripts/first_call_table.py WORK_DIR --json-out figures.json

WORK_DIR holds what gpu_first_call.sh's pieces wrote: machine.json (the chip and JAX it
found), pieces.tsv (each piece's exit status and seconds), check/*.json (each step of
scripts/accelerator_check.py, read one by one: a check stopped at its time limit still
gives the steps it finished), bench_*.json (scripts/bench.py --summary-out) and
decode_*.json (scripts/bench_decode.py --summary-out). Every row is a time a step, measured
against predicted, and their ratio (above 1: slower than predicted); a piece that failed or
ran out of time is a row that says so. --json-out gathers every JSON file into one, so that
one file brings all the figures back.
"""

import glob
import json
import os
import sys

from sessions.errors import UsageError, run_main
from sessions.run.cli import ArgumentParser

# timeout(1)'s exit statuses, and gpu_first_call.sh's for a piece its budget left no time for
FAILED = {124: "TIMED OUT", 137: "KILLED at its time limit", 125: "NOT RUN: no time left"}


def parse_args(argv):
    parser = ArgumentParser(prog="first_call_table.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("work_dir", help="the folder gpu_first_call.sh wrote its pieces to")
    parser.add_argument("--json-out", help="write every JSON file of WORK_DIR here, in one")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.work_dir):
        raise UsageError(f"{args.work_dir}: no such folder")
    return args


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pieces(work_dir):
    """{piece: (exit status, seconds, limit)} from pieces.tsv, in the order they ran."""
    found = {}
    try:
        with open(os.path.join(work_dir, "pieces.tsv")) as f:
            for line in f:
                name, status, seconds, limit = line.split()
                found[name] = int(status), int(seconds), int(limit)
    except OSError:
        pass
    return found


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:,.3f} ms"


def row(piece, what, measured, predicted, how):
    """(piece, what, measured, predicted (how), measured / predicted), a time a step each."""
    ratio = f"{measured / predicted:.2f}x" if measured and predicted else "-"
    said = f"{ms(predicted)} ({how})" if predicted else f"- ({how})"
    return piece, what, ms(measured), said, ratio


def check_rows(check):
    """accelerator_check.py's steps' JSON ({"compare": ..., "s3": ..., "bench": ...}): the
    trace's step against the roofline's bound, s3's decode steps against their estimate
    (or floor), bench_decode's batch 1 against its bytes at the read bandwidth."""
    rows, compared = [], check.get("compare")
    if compared:
        step = compared["measured_step_seconds"]
        bound = f"roofline bound, {compared.get('bound', '?')}"
        rows.append(
            row("check", "s2 trace, median step", step, compared["bound_step_seconds"], bound)
        )
        if compared.get("xla_step_seconds"):
            rows.append(row("check", "  the same", step, compared["xla_step_seconds"], "XLA's"))
    for b in (check.get("s3") or {}).get("batches", []):
        how = "estimate" if b.get("estimate_step_seconds") else f"floor, {b.get('floor_bound')}"
        predicted = b.get("estimate_step_seconds") or b.get("floor_step_seconds")
        rows.append(
            row("check", f"s3 decode, batch {b['batch']}", b["step_seconds"], predicted, how)
        )
    bench = check.get("bench")
    if bench and bench.get("tokens_per_sec_batch_1"):
        step = 1 / bench["tokens_per_sec_batch_1"]  # batch 1: a token a step
        what = f"bench_decode, {bench['mbu_preset']} batch 1"
        rows.append(row("check", what, step, bench["mbu_batch_1"] * step, "bytes at the roof"))
    return rows


def bench_rows(piece, bench):
    """bench.py --summary-out: the training step against its per-op prediction and bound."""
    what = f"train step, {bench['preset']} {bench['batch']}x{bench['seq']}, {bench['stored']}"
    step = bench["step_seconds"]
    return [
        row(piece, what, step, bench["per_op_step_seconds"], "per-op prediction"),
        row(piece, "  the same", step, bench["bound_step_seconds"], "whole-step bound"),
    ]


PREDICTED = (("estimate_step_seconds", "estimate"), ("floor_step_seconds", "floor"))


def decode_rows(piece, decode):
    """bench_decode.py --summary-out: each step it timed (impl, batch) against the
    roofline's estimate of it (roofline/plan/decode_estimate.py), else its floor; where
    the chip table lacks the GPU (or on a CPU) there is neither, and the step's bytes at
    the read bandwidth stand in (its MBU, times the step)."""
    rows = []
    model = decode.get("mbu_model") or {}
    shapes = [f"E={model.get('embed')} L={model.get('layers')}", "cached preset"]
    for shape, table in zip(shapes, decode.get("decode_impls", [])):
        for impl, batches in table.items():
            for batch, got in batches.items():
                step = int(batch) / got["tokens_per_sec"]
                said = [(got[key], how) for key, how in PREDICTED if got.get(key)]
                predicted, how = (said or [(got.get("mbu", 0) * step, "bytes at the roof")])[0]
                what = f"decode {impl}, {shape}, batch {batch}"
                rows.append(row(piece, what, step, predicted, how))
    return rows


def table_lines(work_dir):
    """The table, as lines: a header naming the machine, then a row a figure."""
    steps = ("compare", "s3", "bench")
    check = {step: read_json(os.path.join(work_dir, "check", f"{step}.json")) for step in steps}
    ran = pieces(work_dir)
    found = {"check": check_rows(check)}
    for pattern, rows_of in (("bench_*.json", bench_rows), ("decode_*.json", decode_rows)):
        for path in sorted(glob.glob(os.path.join(work_dir, pattern))):
            if data := read_json(path):
                piece = os.path.basename(path)[: -len(".json")]
                found[piece] = rows_of(piece, data)
    order = [*ran, *(piece for piece in found if piece not in ran)]  # as the pieces ran
    rows = [r for piece in order for r in found.get(piece, [])]
    for name, (status, seconds, limit) in ran.items():
        if status:
            said = FAILED.get(status, f"exit {status}")
            said += f" after {seconds} s (limit {limit} s)" if status != 125 else ""
            rows.append((name, said, "-", "-", "-"))
    machine = read_json(os.path.join(work_dir, "machine.json")) or {}
    kind, jax_version = machine.get("kind", "?"), machine.get("jax", "?")
    head = f"gpu first call | {kind} | JAX {jax_version} | measured against predicted"
    widths = [max(len(str(r[i])) for r in [HEADER, *rows]) for i in range(5)]
    lines = [head, "| " + " | ".join(h.ljust(w) for h, w in zip(HEADER, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return lines


HEADER = ("piece", "what", "measured", "predicted", "measured / predicted")


def main(argv=None):
    args = parse_args(argv)
    for line in table_lines(args.work_dir):
        print(line)
    if args.json_out:
        found = {}
        for path in sorted(glob.glob(os.path.join(args.work_dir, "**", "*.json"), recursive=True)):
            name = os.path.relpath(path, args.work_dir)
            if "checkpoints" not in name.split(os.sep):  # the model s2 saved: not figures
                found[name] = read_json(path)
        ran = pieces(args.work_dir).items()
        found["pieces"] = {n: dict(zip(("exit", "seconds", "limit"), p)) for n, p in ran}
        with open(args.json_out, "w") as f:
            json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

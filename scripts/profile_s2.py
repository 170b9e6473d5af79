"""Profile a short session-2 training run and print the roofline table.

    python scripts/profile_s2.py                      # the default preset, 5 steps: under a minute
    python scripts/profile_s2.py --preset tiny --steps 10
    python scripts/profile_s2.py --mesh fsdp=8        # on a host of 8 chips, as it trains
    xprof --logdir runs/profile_s2 --port 8791        # then look at the same trace by eye

It runs sessions/s2_train.py itself with `--profile`, which traces steps 1-3
on the mesh it trains on, logs every step, and prints the three columns
(napkin, XLA's count of the step it compiled, the trace). Then it holds the
trace's step time against the training log's for the same steps: the trace
times each step on the device, first op to last; the log times it on the
host, so a gap between them is time the device spent waiting for the host.
"""

import json
import os
import statistics
import subprocess
import sys

from roofline.measured.record import METADATA, load_metadata
from roofline.measured.trace import read_trace
from sessions.errors import course_preset
from sessions.model.config import PRESETS
from sessions.run.cli import ArgumentParser, positive_int


def parse_args(argv):
    parser = ArgumentParser(prog="profile_s2.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset",
        type=course_preset,
        choices=sorted(PRESETS),
        help="named shapes (default: cpu on a CPU, course on GPU/TPU)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=5,
        help="steps to train; steps 1-3 are traced (at least 4)",
    )
    parser.add_argument("--batch", type=positive_int, help="sequences per step")
    parser.add_argument("--mesh", help="axis=size,... as s2_train.py takes it (default: fsdp=all)")
    parser.add_argument(
        "--logdir", default="runs/profile_s2", help="trace, metrics, chart and loss curve go here"
    )
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4: steps 1-3 are traced")
    return args


def main(argv=None):
    args = parse_args(argv)
    metrics_path = os.path.join(args.logdir, "metrics.jsonl")
    s2_argv = [
        "--steps",
        str(args.steps),
        "--log-every",
        "1",
        "--sample-bytes",
        "0",
        "--profile",
        args.logdir,
        "--metrics-out",
        metrics_path,
        "--run-dir",
        args.logdir,
    ]
    for flag in ("preset", "batch", "mesh"):
        if getattr(args, flag):
            s2_argv += [f"--{flag}", str(getattr(args, flag))]
    os.makedirs(args.logdir, exist_ok=True)
    saved = os.path.join(args.logdir, METADATA)
    if os.path.exists(saved):
        os.remove(saved)  # from an earlier run; s2_train.py writes it afresh
    print("$ python sessions/s2_train.py " + " ".join(s2_argv))
    s2_train = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sessions", "s2_train.py"
    )
    # Its own process, its lines passed on as they come.
    with subprocess.Popen(
        [sys.executable, s2_train, *s2_argv], stdout=subprocess.PIPE, text=True
    ) as run:
        for line in run.stdout:
            print(line, end="", flush=True)
    status = run.returncode
    if status:
        return status
    # What the run compiled and traced, on its own mesh: roofline.json holds
    # XLA's count of the step as partitioned there, and the chip it ran on.
    record = load_metadata(args.logdir)
    trace = read_trace(args.logdir)

    # The training log's time for the steps the trace holds. Its line for
    # step n+1 times step n; the last traced step's line also includes writing
    # the trace out (s2_train.py stops the profiler inside that step), so it
    # is left out.
    traced = [s.step for s in trace.steps][:-1]
    with open(metrics_path) as f:
        logged = {r["step"] - 1: r for r in map(json.loads, f)}
    tokens = record.batch * record.cfg.seq
    log_s = statistics.median(tokens / logged[n]["tokens_per_sec"] for n in traced)
    trace_s = statistics.median(s.wall_s for s in trace.steps if s.step in traced)
    log_mfu = statistics.median(logged[n]["mfu"] for n in traced)
    waited = (log_s - trace_s) / log_s
    shown = ", ".join(str(n + 1) for n in traced)
    print(
        f"step time: the log {log_s * 1e3:,.1f} ms (its lines for steps {shown}, MFU "
        f"{100 * log_mfu:.1f}%), the trace {trace_s * 1e3:,.1f} ms on the device "
        f"(MFU {100 * log_mfu * log_s / trace_s:.1f}%)"
    )
    if abs(waited) <= 0.10:
        print("  within 10%: the device was busy for the whole step the host timed")
    else:
        print(
            f"  {100 * waited:+.0f}% of the logged step the device was not running the step: "
            "time on the host (dispatch, Python, the loader) it waited for, or, if negative, "
            "a trace that disagrees with the log"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

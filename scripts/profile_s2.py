"""Profile a short session-2 training run and print the roofline table.

    python scripts/profile_s2.py                      # the cpu preset, 5 steps: under a minute
    python scripts/profile_s2.py --preset tiny --steps 10
    xprof --logdir runs/profile_s2 --port 8791        # then look at the same trace by eye

It runs sessions/s2_train.py itself with `--profile`, which traces steps 1-3,
and logs every step; then it compiles the same step once more for XLA's cost
analysis, reads the trace back, prints the three columns (napkin, XLA,
measured), and checks the trace's MFU against the training log's own.
"""

import json
import os
import statistics
import sys

import jax

from roofline.compare import METADATA, profile_comparison, report_lines, xla_cost
from roofline.hardware import local_peak_flops
from sessions import s2_train
from sessions.aot import compile_train_step
from sessions.cli import ArgumentParser, positive_int
from sessions.config import PRESETS


def parse_args(argv):
    parser = ArgumentParser(prog="profile_s2.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="named shapes (default: cpu on a CPU, course on GPU/TPU)")
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="steps to train; steps 1-3 are traced (at least 4)")
    parser.add_argument("--batch", type=positive_int, help="sequences per step")
    parser.add_argument("--logdir", default="runs/profile_s2",
                        help="trace, metrics, chart and loss curve go here")
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4: steps 1-3 are traced")
    return args


def main(argv=None):
    args = parse_args(argv)
    metrics_path = os.path.join(args.logdir, "metrics.jsonl")
    s2_argv = ["--steps", str(args.steps), "--log-every", "1", "--sample-bytes", "0",
               "--profile", args.logdir, "--metrics-out", metrics_path, "--run-dir", args.logdir]
    s2_argv += ["--preset", args.preset] if args.preset else []
    s2_argv += ["--batch", str(args.batch)] if args.batch else []
    os.makedirs(args.logdir, exist_ok=True)
    saved = os.path.join(args.logdir, METADATA)
    if os.path.exists(saved):
        os.remove(saved)  # from an earlier run; profile_table writes it afresh
    print("$ python sessions/s2_train.py " + " ".join(s2_argv))
    status = s2_train.cli(s2_argv)
    if status:
        return status
    # A session script that prints the table itself (profile_table) leaves its
    # roofline.json behind; then it is not printed twice.
    printed = os.path.exists(saved)

    # The same configuration s2_train.py resolved from these flags.
    _, cfg, tc, _ = s2_train.choose_configs(s2_train.parse_args(s2_argv))
    peak = local_peak_flops(cfg.dtype)
    c = profile_comparison(args.logdir, cfg, tc.batch, xla_cost(compile_train_step(cfg, tc)), peak,
                           devices=jax.device_count())
    if not printed:
        print()
        for line in report_lines(c, args.logdir):
            print(line)

    # The training log's MFU for the same steps the trace holds. Its line for
    # step n+1 times step n; the last traced step's line also includes writing
    # the trace out (s2_train.py stops the profiler inside that step), so it
    # is left out.
    traced = [s.step for s in c.trace.steps][:-1]
    with open(metrics_path) as f:
        logged = {r["step"] - 1: r["mfu"] for r in map(json.loads, f)}
    log_mfu = statistics.median(logged[n] for n in traced)
    trace_mfu = c.use.flops_per_s / peak[0]
    gap = trace_mfu / log_mfu - 1
    shown = ", ".join(str(n + 1) for n in traced)
    print(f"MFU check: s2_train.py's log {100 * log_mfu:.1f}% (its lines for steps {shown}), "
          f"the trace {100 * trace_mfu:.1f}%: {100 * gap:+.1f}% apart "
          f"({'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

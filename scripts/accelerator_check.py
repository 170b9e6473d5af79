"""The end-to-end check a maintainer runs on a real chip: every session's
default path, on whatever accelerator this machine has, in one table.

    python scripts/accelerator_check.py                 # a GPU box or a TPU VM: about 10 minutes
    python scripts/accelerator_check.py --cpu -- --preset tiny --steps 8   # a rehearsal, here
    python scripts/accelerator_check.py --table RUN_DIR/check.json          # a past check's table

In order, each a process of its own (so each gets the chip to itself, as a
student's run would: libtpu lets one process hold a TPU, and this parent
never starts a backend):

    1. python sessions/s2_train.py --profile DIR        the default run, steps 1-3 traced,
                                                        a checkpoint kept for 3.
    2. python -m roofline compare DIR                   the trace against the napkin and XLA
    3. python sessions/s3_infer.py                      the checkpoint, decoded
    4. python scripts/bench_decode.py                   decode MBU at gpt2-bytes shapes

Then one table: MFU of the training run, the trace's step against the
roofline's bound, decode's MBU. Each step's own output is in RUN_DIR/*.log;
RUN_DIR/check.json holds every figure. Paste the table into docs/results.md with
the chip's name, and keep RUN_DIR/profile's .xplane.pb as a test fixture.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = (
    "import json, jax; d = jax.devices(); print(json.dumps({'platform': d[0].platform, "
    "'devices': len(d), 'kind': d[0].device_kind, 'jax': jax.__version__}))"
)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="accelerator_check.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run-dir", default="runs/accelerator_check")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run on the CPU (a rehearsal of the check, not its result)",
    )
    parser.add_argument("--s3-args", default="", help="flags for s3_infer.py (e.g. '--batches 1')")
    parser.add_argument(
        "--bench-args", default="", help="flags for bench_decode.py (e.g. '--mbu-preset tiny')"
    )
    parser.add_argument(
        "--table",
        metavar="CHECK_JSON",
        help="print the table of an earlier check from its check.json, and run nothing",
    )
    parser.add_argument(
        "s2_args",
        nargs=argparse.REMAINDER,
        help="after --: extra flags for s2_train.py (e.g. --preset tiny)",
    )
    args = parser.parse_args(argv)
    args.s2_args = args.s2_args[1:] if args.s2_args[:1] == ["--"] else args.s2_args
    return args


def run(name, command, run_dir):
    """Run one step's command from the repo root, its output into RUN_DIR/NAME.log.
    Returns (exit status, seconds)."""
    print(f"[{name}] $ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    with open(os.path.join(run_dir, f"{name}.log"), "w") as log:
        status = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    print(f"[{name}] exit {status} after {seconds:.0f} s", flush=True)
    return status, seconds


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def table(chip, s2, compared, s3, bench):
    """The figures as rows of (what, measured, against)."""
    rows = []
    if s2:
        mfu = "n/a (peak wrong)" if s2.get("mfu_exceeds_peak") else pct(s2["mfu"])
        val = f", val loss {s2['val_loss']:.3f}" if s2.get("val_loss") is not None else ""
        rows.append(
            (
                "s2 training run",
                f"{s2['tokens_per_sec']:,.0f} tokens/s{val}",
                f"MFU {mfu} of {s2['peak_tflops_per_device']:.1f} TFLOP/s ({s2['peak_source']})",
            )
        )
        if s2.get("steadiness") is not None:  # checks before it kept no such figure
            rows.append(("  its steadiness", pct(s2["steadiness"]), "of the median log interval"))
    if compared:
        measured, bound = compared["measured_step_seconds"], compared["bound_step_seconds"]
        xla = compared.get("xla_step_seconds")
        rows.append(
            (
                "s2 trace, median step",
                f"{measured * 1e3:,.2f} ms",
                f"roofline bound {bound * 1e3:,.2f} ms ({compared['bound']}), "
                f"{100 * bound / measured:.0f}% of it"
                + (f"; XLA's estimate {xla * 1e3:,.2f} ms" if xla else ""),
            )
        )
        rows.append(
            (
                "  its MFU",
                pct(compared.get("mfu_datasheet") or compared.get("mfu_measured_roof")),
                compared["roof"],
            )
        )
    if s3:
        for b in (s3["batches"][0], s3["batches"][-1]):
            rows.append(
                (
                    f"s3 decode, batch {b['batch']}",
                    f"{b['decode_tokens_per_sec']:,.0f} tokens/s",
                    f"MBU {pct(b['mbu'])}, MFU {pct(b['mfu'])}",
                )
            )
    if bench:
        rows.append(
            (
                f"bench_decode, {bench['mbu_preset']} batch 1",
                f"{bench['tokens_per_sec_batch_1']:,.0f} tokens/s",
                f"MBU {pct(bench['mbu_batch_1'])}; cached {bench['cached_over_uncached']:.0f}x "
                "uncached",
            )
        )
    lines = [
        f"accelerator check | {chip['devices']} x {chip['kind']} | JAX {chip['jax']}",
        f"| {'what':<28} | {'measured':<34} | against |",
        f"|{'-' * 30}|{'-' * 36}|---|",
    ]
    lines += [f"| {what:<28} | {got:<34} | {against} |" for what, got, against in rows]
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.table:
        check = read_json(args.table)
        if not check:
            print(f"error: {args.table}: no check.json to read", file=sys.stderr)
            return 2
        for line in table(
            check["chip"], check["s2"], check["compare"], check["s3"], check["bench"]
        ):
            print(line)
        return 0
    os.makedirs(args.run_dir, exist_ok=True)
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    if probe.returncode:
        print(
            f"error: JAX did not start: {probe.stderr.strip().splitlines()[-1:]}", file=sys.stderr
        )
        return 2
    chip = json.loads(probe.stdout.strip().splitlines()[-1])
    if chip["platform"] == "cpu" and not args.cpu:
        print(
            "error: JAX sees no GPU or TPU here; this check is for a real chip "
            "(--cpu rehearses it on the CPU)",
            file=sys.stderr,
        )
        return 2
    out = {
        name: os.path.join(args.run_dir, f"{name}.json")
        for name in ("s2", "compare", "s3", "bench")
    }
    profile_dir = os.path.join(args.run_dir, "profile")
    checkpoints = os.path.join(args.run_dir, "checkpoints")
    shutil.rmtree(checkpoints, ignore_errors=True)  # the last check's: s2 will not overwrite them
    python = sys.executable
    steps = [
        # --checkpoint-every far past the run's end: one save, at the end, for s3.
        (
            "s2",
            [
                python,
                "sessions/s2_train.py",
                "--profile",
                profile_dir,
                "--summary-out",
                out["s2"],
                "--run-dir",
                args.run_dir,
                "--checkpoint-dir",
                checkpoints,
                "--checkpoint-every",
                "1000000",
                *args.s2_args,
            ],
        ),
        (
            "compare",
            [python, "-m", "roofline", "compare", profile_dir, "--summary-out", out["compare"]],
        ),
        (
            "s3",
            [
                python,
                "sessions/s3_infer.py",
                "--checkpoint-dir",
                checkpoints,
                "--summary-out",
                out["s3"],
                "--run-dir",
                args.run_dir,
                *shlex.split(args.s3_args),
            ],
        ),
        (
            "bench",
            [
                python,
                "scripts/bench_decode.py",
                "--summary-out",
                out["bench"],
                *shlex.split(args.bench_args),
            ],
        ),
    ]
    statuses = {}
    for name, command in steps:
        statuses[name], _ = run(name, command, args.run_dir)
        if name == "s2" and statuses[name]:
            break  # nothing to compare or decode
    figures = {name: read_json(path) for name, path in out.items()}
    print()
    for line in table(chip, figures["s2"], figures["compare"], figures["s3"], figures["bench"]):
        print(line)
    with open(os.path.join(args.run_dir, "check.json"), "w") as f:
        json.dump({"chip": chip, "exit": statuses, **figures}, f, indent=1)
    failed = [name for name, status in statuses.items() if status]
    if failed or len(statuses) < len(steps):
        print(f"failed: {', '.join(failed)} (see {args.run_dir}/<step>.log)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

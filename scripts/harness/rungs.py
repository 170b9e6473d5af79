"""The ladder's rungs (scripts/ladder.py): which flags each one runs
s2_train.py with, the child process that finds the platform, and one rung run
in a child of its own, with what it reports about where it ran.

Everything that touches a device runs in a child: libtpu lets one process
hold the chips, so the ladder's own process never starts a JAX backend.
"""

import json
import os
import statistics
import subprocess
import sys

from scripts.harness import simulated_cpu_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "sessions", "s2_train.py")

# (rung, what it changed, the s2_train.py flags that leave the later rungs off)
RUNGS = [
    (
        "session 1",
        "feed-forward only, op by op, blocking loads, one device",
        ["--no-attention", "--no-positions", "--no-jit", "--no-overlap"],
    ),
    ("+ attention", "tokens read earlier tokens", ["--no-positions", "--no-jit", "--no-overlap"]),
    ("+ positions", "and know their order", ["--no-jit", "--no-overlap"]),
    ("+ whole-step jit", "forward, backward and AdamW as one program", ["--no-overlap"]),
    ("+ overlapped loading", "the next batch loads while the step runs", []),
]


# Run in a child, which lets the chips go when it exits. (On a GPU too: a parent
# holding a backend would have preallocated 75% of the memory, leaving each rung a quarter.)
PROBE = (
    "import json, jax; d = jax.devices(); print(json.dumps({'platform': d[0].platform, "
    "'devices': len(d), 'kind': d[0].device_kind, 'jax': jax.__version__}))"
)


def probe_platform():
    """What a child process finds: {platform, devices, kind, jax}, e.g.
    {"platform": "tpu", "devices": 8, "kind": "TPU v5 lite", "jax": "0.10.2"}."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=False
    )
    if result.returncode:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the platform probe failed: {last}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def ran_elsewhere(summary, platform, devices):
    """Why a rung's figures are not this table's (None when they are): it ran on
    another platform (a backend that failed quietly falls back to the CPU), or
    on another number of devices than it asked for."""
    ran = (summary["platform"], summary["n_devices"])
    if ran == (platform, devices):
        return None
    return f"ran on {ran[1]} {ran[0]} device(s), not the {devices} {platform} it asked for"


def run_rung(flags, args, devices, tmp, platform):
    """The rung's summary, its throughput taken as the median over log
    intervals after the first (which still warms up)."""
    summary, metrics = os.path.join(tmp, "summary.json"), os.path.join(tmp, "metrics.jsonl")
    env = dict(os.environ)
    if platform == "cpu":
        env["XLA_FLAGS"] = simulated_cpu_flags(devices, env.get("XLA_FLAGS"))
    command = [
        sys.executable,
        SCRIPT,
        "--preset",
        args.preset,
        "--steps",
        str(args.steps),
        "--log-every",
        str(max(args.steps // 8, 1)),
        "--eval-every",
        str(args.steps),
        "--sample-bytes",
        "0",
        "--data-delay-ms",
        str(args.data_delay_ms),
        "--run-dir",
        tmp,
        "--summary-out",
        summary,
        "--metrics-out",
        metrics,
        *flags,
    ]
    if devices == 1:
        command += ["--mesh", "fsdp=1"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"error: a rung failed: {' '.join(flags)}: {result.stderr.strip()}")
    with open(summary) as f:
        result = json.load(f)
    with open(metrics) as f:
        records = [json.loads(line) for line in f][1:] or [result]
    for key in ("tokens_per_sec", "mfu"):
        result[key] = statistics.median(r[key] for r in records)
    return result

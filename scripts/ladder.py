"""The ladder: what each concept of session 2 buys, one rung at a time, on
this machine. One s2_train.py run per rung, each adding one thing to the
last, all with the same shapes, seed and number of tokens; printed as a
Markdown table (after LLMs-from-scratch's speed study of GPT-2 small).

    python scripts/ladder.py                    # the cpu preset, 40 steps a rung
    python scripts/ladder.py --preset course --steps 100

Every rung loads batches from a simulated slow store (--data-delay-ms, 100
by default): that is the cost the overlapped loader exists to hide.

This process never starts a JAX backend: libtpu lets one process hold the
chips, and a rung started while the parent held them would fall back to the
CPU under a table headed with the TPU's name. A child probes the platform
first, and every rung reports where it ran.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sessions", "s2_train.py"
)

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
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--data-delay-ms", type=int, default=100)
    parser.add_argument(
        "--devices",
        type=int,
        help="for the multichip rung (default: all; on a CPU, one simulated device per core)",
    )
    args = parser.parse_args(argv)
    probe = probe_platform()
    platform = probe["platform"]
    on_cpu = platform == "cpu"
    devices = args.devices or (os.cpu_count() if on_cpu else probe["devices"])
    rungs = [(name, what, flags, 1) for name, what, flags in RUNGS]
    multichip = f"params born sharded over {devices} devices (fsdp)"
    if on_cpu:
        multichip += "; on a CPU the simulated devices share the same cores"
    rungs.append(("+ multichip", multichip, [], devices))

    print(
        f"ladder: preset {args.preset}, {args.steps} steps a rung, batches delayed "
        f"{args.data_delay_ms} ms | {probe['kind']}, {os.cpu_count()} cores | "
        f"jax {probe['jax']}\n"
    )
    print("| rung | tokens/s | MFU | val loss | memory/device | what it changed |")
    print("|---|---:|---:|---:|---:|---|")
    for name, what, flags, n in rungs:
        with tempfile.TemporaryDirectory() as tmp:
            s = run_rung(flags, args, n, tmp, platform)
        elsewhere = ran_elsewhere(s, platform, n)
        if elsewhere:  # its figures are another chip's: no row
            print(f"error: rung '{name}' {elsewhere}", file=sys.stderr)
            return 2
        memory = s["memory_bytes_per_device"]
        memory = f"{memory / 2**20:,.0f} MiB" if memory else "n/a"
        print(
            f"| {name} | {s['tokens_per_sec']:,.0f} | {100 * s['mfu']:.1f}% | "
            f"{s['val_loss']:.3f} | {memory} | {what} |",
            flush=True,
        )
    print(
        "\ntokens/s and MFU: the median over log intervals after the first; MFU: model FLOPs "
        "(6·B·P plus attention) over the peak of the devices used; val loss "
        "after the same number of tokens; memory from XLA's plan of the compiled step "
        "(n/a when run op by op)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

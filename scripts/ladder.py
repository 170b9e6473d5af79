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
import os
import sys
import tempfile

from scripts.harness import rungs


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
    probe = rungs.probe_platform()
    platform = probe["platform"]
    on_cpu = platform == "cpu"
    devices = args.devices or (os.cpu_count() if on_cpu else probe["devices"])
    ladder = [(name, what, flags, 1) for name, what, flags in rungs.RUNGS]
    multichip = f"params born sharded over {devices} devices (fsdp)"
    if on_cpu:
        multichip += "; on a CPU the simulated devices share the same cores"
    ladder.append(("+ multichip", multichip, [], devices))

    print(
        f"ladder: preset {args.preset}, {args.steps} steps a rung, batches delayed "
        f"{args.data_delay_ms} ms | {probe['kind']}, {os.cpu_count()} cores | "
        f"jax {probe['jax']}\n"
    )
    print("| rung | tokens/s | MFU | val loss | memory/device | what it changed |")
    print("|---|---:|---:|---:|---:|---|")
    for name, what, flags, n in ladder:
        with tempfile.TemporaryDirectory() as tmp:
            s = rungs.run_rung(flags, args, n, tmp, platform)
        elsewhere = rungs.ran_elsewhere(s, platform, n)
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

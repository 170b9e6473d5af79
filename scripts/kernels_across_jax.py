"""Our decode kernels with the JAX this runs under: does each compile for the GPU it is for?

Mosaic GPU's API moves between JAX releases, and the course supports several (0.10 on
Python 3.11, 0.11 and 0.12 on 3.12 and later: requirements.txt). This compiles, deviceless
for h100:1 (no GPU needed: the chip compilers of requirements-aot.txt), the attention
kernel (sessions/kernels/decode_attention.py) and the MLP kernel (decode_mlp.py), each
alone over one layer, the head kernel (decode_head.py), and then the whole decode loop with them
(sessions/plan/kernels_on_target.py), and prints one line each: compiled, and in how many
seconds; refused, with the API this JAX lacks; or no answer within --seconds, and where the
compiler was. Then the whole decode's compile beside XLA's decode of the same shapes,
measured here (sessions/plan/compile_times.py). Where this machine cannot compile for
h100:1, it says so in one line. Run it under each JAX:

    python scripts/kernels_across_jax.py                  # GPT-2's shapes, bf16, batch 1
    python scripts/kernels_across_jax.py --preset cpu --batch 8

Exit status: 0 when all compiled, 1 when one did not or nothing could compile here.
"""

import dataclasses
import os
import sys

import jax

from sessions.errors import course_preset, run_main
from sessions.inference import kernel_step
from sessions.model.config import PRESETS
from sessions.plan import compile_times, kernels_on_target
from sessions.run.cli import ArgumentParser, positive_int


def parse_args(argv):
    parser = ArgumentParser(prog="kernels_across_jax.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", type=course_preset, choices=sorted(PRESETS), default="gpt2-bytes"
    )
    parser.add_argument("--batch", type=positive_int, default=1, help="rows, at most 8")
    parser.add_argument(
        "--seconds",
        type=positive_int,
        default=120,
        help="give a compile up after this long (JAX 0.12's Mosaic GPU may search for longer)",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # Compile-only devices need no GPU. This process's own backend is pinned to the CPU
    # before one starts, so the CUDA plugin starts only when asked for the target, with
    # its driver check off (roofline/plan/targets.py), and needs no driver.
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    cfg = dataclasses.replace(PRESETS[args.preset].model, dtype="bfloat16")
    kernel_step.check_supported(cfg, args.batch)  # what the kernels do not take: exit 2
    target_text = kernels_on_target.TARGET
    head = f"JAX {jax.__version__}, {args.preset}'s shapes in bfloat16, batch {args.batch}"
    found, why = kernels_on_target.target_devices(target_text)
    if found is None:
        print(f"{head}: cannot compile for {target_text} here: it needs {why}")
        return 1
    print(f"{head}, compiled ({target_text}, deviceless):")
    results = kernels_on_target.compile_kernels(cfg, args.batch, *found, seconds=args.seconds)
    for r in results:
        took = f" in {r.seconds:.1f} s" if r.status == "compiled" else ""
        print(f"  {r.what}: {r.status if took else r.status.upper()}{took}: {r.said}", flush=True)
    print(compile_times.decode_line(results, target_text))
    return 0 if all(r.status == "compiled" for r in results) else 1


if __name__ == "__main__":
    sys.exit(run_main(main))

"""Session 4, a level deeper: our own flash-attention kernel in Pallas, and the
collectives of FSDP and of a collective matmul written by hand with jax.shard_map.

Sessions 2 and 3 used other people's kernels (cuDNN's, JAX's splash) and let
the partitioner insert every collective. Here we write both, check each against
the reference on this machine, then compile them for a chip it may lack:

    1. the online softmax (one pass over key blocks) == softmax
    2. our Pallas kernel == einsum attention, forward and gradients
    3. FSDP by hand == the partitioner's FSDP, step for step, collectives counted
    4. a collective matmul (ppermute around the ring) == all-gather, then matmul
    5. attention's memory and time on the target chip: einsum, ours, the vendor's
    6. on a GPU target, how long session 3's decode kernels take to compile, beside XLA's

    python sessions/s4_kernels.py                       # every check, then h100:1's table
    python sessions/s4_kernels.py --target tpu-v5e:2x2  # the table for another chip

The checks run on the CPU's 8 simulated devices when there is no accelerator
(our kernel then runs interpreted: slow, the same arithmetic); on a GPU or TPU
the kernel runs compiled. Each check prints the precision its matmuls ran in and
the tolerance that follows from it (sessions/kernels/precision.py): a GPU or a TPU rounds
float32 matmuls more than a CPU unless asked.
"""

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Before JAX starts: the multichip checks need 8 devices, simulated on the CPU.
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp

from roofline.compiled.program import collectives_table
from roofline.compiled.schedule import schedule_line, schedule_summary
from roofline.plan.targets import missing_extras
from sessions.errors import UsageError, run_main
from sessions.kernels import flash, precision
from sessions.kernels.precision import biggest
from sessions.model.attention import einsum_attention
from sessions.model.config import PRESETS
from sessions.plan import compile_times, kernels_on_target, programs
from sessions.plan.attention_on_target import SEQUENCES, attention_on_target, attention_table_lines
from sessions.plan.collective_matmul_on_target import programs_on
from sessions.run.accelerator import check_accelerator_visible
from sessions.shard import collective_matmul, sharding
from sessions.train import manual_fsdp

VENDOR = {"gpu": "cudnn", "tpu": "splash"}  # the chip maker's (or JAX's) flash kernel
NAMES = ("forward == einsum attention", *(f"d{x} == einsum attention's" for x in "qkv"))
FLOORS = (1e-4, 1e-3, 1e-3, 1e-3)  # float32's: the forward, and its three gradients
COMPILE_SECONDS = 120  # step 6 gives a compile up after this (Mosaic GPU's layout search)


def kernel_flags(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2, help="the kernel check's B")
    parser.add_argument("--seq", type=int, default=200, help="its S (any length: padded)")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64, choices=flash.HEAD_DIMS)
    parser.add_argument("--fsdp-steps", type=int, default=4, help="steps of each FSDP run")
    parser.add_argument("--target", default="h100:1", help="the chip of step 5's table")
    parser.add_argument("--no-target", action="store_true", help="skip step 5")
    return parser.parse_args(argv)


def report(name, error, tolerance):
    """One check's line; returns whether it held."""
    held = bool(error <= tolerance)
    mark = "ok  " if held else "FAIL"
    print(f"  {mark} {name}: largest difference {error:.2e} (within {tolerance:.1e})")
    return held


def softmax_reference(q, k, v):
    """Softmax attention, every score at once: q [S, D], k, v [T, D] -> [S, D]."""
    return jax.nn.softmax(q @ k.T / q.shape[1] ** 0.5, axis=-1) @ v


def check_online_softmax(key):
    """1. Keep a running max, sum and weighted sum; rescale when the max grows."""
    print("1. online softmax: 128 queries over 512 keys, 4 key blocks of 128")
    q, k, v = 4 * jax.random.normal(key, (3, 512, 64))  # x4: later blocks raise the max
    q = q[:128]
    # The idea, checked in float32 on every chip. At a chip's default precision
    # scores this large move by u of themselves, and the tolerance that takes
    # (2u(1 + 75) x 14: 1.0 for TF32, 8.2 for bf16) is as large as a bug's error.
    online = functools.partial(flash.online_softmax, block_k=128)
    exact = precision.exact(softmax_reference, q, k, v)
    u, D = precision.roundoff(precision.FLOAT32, q.shape[1]), q.shape[1]
    print("     ours and the reference at precision HIGHEST:")
    print(f"     {precision.precision_line(precision.FLOAT32, D)}")
    tolerance = tolerance_for(u, largest_score(q[None, :, None], k[None, :, None]), exact, 1e-5)
    error = biggest(precision.exact(online, q, k, v), exact)
    held = report("online softmax == softmax", error, tolerance)
    chip = precision.default_matmul_precision()
    if chip != precision.FLOAT32:
        rounded = biggest(online(q, k, v), exact)
        print(f"     (at this chip's default, {chip.name} matmuls: {rounded:.1e} from softmax)")
    return held


def largest_score(q, k):
    """The largest |q . k| / sqrt(D) over every pair of q, k [B, S, H, D]."""
    scores = jnp.einsum("BSHD,BTHD->BHST", q, k, precision="highest") * q.shape[-1] ** -0.5
    return float(jnp.max(jnp.abs(scores)))


def tolerance_for(u, max_score, reference, floor):
    """precision.attention_tolerance for a check against `reference`, its formula
    printed where it adds to float32's floor."""
    scale = float(jnp.max(jnp.abs(reference)))
    if u:
        print(
            f"     tolerance {floor:.0e} + 2u(1 + {max_score:.2f}, the largest score) x {scale:.2f}"
        )
    return precision.attention_tolerance(u, max_score, scale, floor)


def attention_and_grads(attend, q, k, v, dout):
    """attend(q, k, v) [B, S, H, D], and the gradients of sum(attend(q, k, v) *
    dout) by q, k and v: what the backward pass computes from dout."""
    out, backward = jax.vjp(attend, q, k, v)
    return out, backward(dout)


def check_kernel(args, key):
    """2. Our kernel against the einsums, the output and all three gradients."""
    B, S, H, D = args.batch, args.seq, args.heads, args.head_dim
    tiles = flash.default_tiles(S)
    where = jax.default_backend()
    how = "interpreted" if where == "cpu" else "compiled"
    shapes = f"B={B} S={S} H={H} D={D}, tiles {tiles[0]} x {tiles[1]}"
    print(f"2. our flash kernel, {shapes}, {how} on {where}")
    q, k, v, dout = jax.random.normal(key, (4, B, S, H, D))
    ours = jax.jit(functools.partial(attention_and_grads, flash.flash_attention))(q, k, v, dout)
    exact = precision.exact(functools.partial(attention_and_grads, einsum_attention), q, k, v, dout)
    # The kernel's forward (Triton's TF32 on a GPU, Mosaic's default on a TPU) and
    # its backward (XLA's) run at the chip's default precision: no finer than this.
    chip = precision.default_matmul_precision()
    u = precision.roundoff(chip, D)
    print("     the reference at precision HIGHEST (float32 matmuls), ours at the default:")
    print(f"     {precision.precision_line(chip, D)}")
    max_score, held = largest_score(q, k), True
    for name, a, b, floor in zip(NAMES, jax.tree.leaves(ours), jax.tree.leaves(exact), FLOORS):
        held &= report(name, biggest(a, b), tolerance_for(u, max_score, b, floor))
    return held


def check_fsdp(steps):
    """3. The same training, its collectives written by hand or by the partitioner."""
    held = True
    for mesh_text in ("fsdp=8", "data=2,fsdp=4"):
        print(f"3. FSDP over {mesh_text} (8 simulated CPU devices, the tiny preset, {steps} steps)")
        runs = manual_fsdp.train_both_ways(mesh_text, steps, jax.devices("cpu")[:8])
        (auto_losses, auto_program), (losses, program) = runs["auto"], runs["manual"]
        print(f"     auto   losses {' '.join(f'{x:.4f}' for x in auto_losses)}")
        print(f"     manual losses {' '.join(f'{x:.4f}' for x in losses)}")
        error = max(abs(a - b) / abs(a) for a, b in zip(losses, auto_losses))
        held &= report("manual == auto, step for step (relative)", error, 1e-5)
        for line in collectives_table({"manual": program, "auto": auto_program}, 8):
            print(f"     {line}")
    return held


def check_collective_matmul(key):
    """4. N - 1 hops of the weight's shards, each behind a shard's matmul."""
    print("4. collective matmul over fsdp=8: x [8, 16, 64] @ w_in [64, 96]")
    mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tp": 1}, jax.devices("cpu")[:8])
    x, w = jax.random.normal(key, (8, 16, 64)), jax.random.normal(key, (64, 96))
    # Each jitted, one program as a step would hold it: op by op, every op would be
    # dispatched to the 8 devices on its own, about 20 times as long.
    plain = jax.jit(collective_matmul.allgather_matmul, static_argnums=2)(x, w, mesh)
    ours = jax.jit(collective_matmul.collective_matmul, static_argnums=2)(x, w, mesh)
    return report("ring of ppermutes == all-gather, then matmul", biggest(ours, plain), 1e-4)


def target_tables(target, devices):
    """5. What each attention needs and takes on the chip, as its compiler plans it."""
    chip = target.chip
    impls = ("einsum", "pallas", VENDOR[chip.platform])
    print(f"5. attention compiled for {target.name}: einsum, ours (pallas) and {impls[2]}'s")
    rows = [attention_on_target(impl, seq, target, devices) for seq in SEQUENCES for impl in impls]
    for line in attention_table_lines(rows, target):
        print(f"   {line}")
    hbm = target.hbm_per_device
    wall = [r.seq for r in rows if r.impl == "einsum" and (r.bytes is None or r.bytes > hbm)]
    if wall:
        print(f"   einsum attention stops fitting at S = {wall[0]:,}; the flash kernels hold O(S)")
    if not missing_extras("tpu"):
        print("   the collective matmul compiled for tpu-v5e:2x4, gpt2's MLP (schedule_summary):")
        for name, text in programs_on("tpu-v5e:2x4").items():
            print(f"     {schedule_line(name, schedule_summary(text))}")


def decode_compile_times(target, devices):
    """6. Session 3's decode kernels (sessions/kernels/decode_*.py) compiled for the GPU
    at GPT-2's shapes: how long each takes alone, and the whole decode beside XLA's."""
    cfg = dataclasses.replace(PRESETS["gpt2-bytes"].model, dtype="bfloat16")
    print(f"6. our decode kernels compiled for {target.name}, gpt2-bytes in bfloat16, batch 1:")
    attempts = kernels_on_target.compile_kernels(cfg, 1, target, devices, COMPILE_SECONDS)
    print(f"   {compile_times.decode_line(attempts, target.name)}")
    print(f"   {compile_times.kernels_line(attempts)}")


def main(argv=None):
    args = kernel_flags(argv)
    if args.seq < 1 or args.batch < 1 or args.heads < 1 or args.fsdp_steps < 1:
        raise UsageError("--batch, --seq, --heads and --fsdp-steps must be positive")
    planned = None if args.no_target else programs.devices_to_plan_on(args.target, say=print)
    check_accelerator_visible()
    keys = jax.random.split(jax.random.key(0), 3)
    held = check_online_softmax(keys[0])
    held &= check_kernel(args, keys[1])
    held &= check_fsdp(args.fsdp_steps)
    held &= check_collective_matmul(keys[2])
    if planned:
        target_tables(*planned)
        target, _ = planned
        if target.chip.platform == "gpu" and target.devices == 1:  # the kernels take one GPU
            decode_compile_times(*planned)
    print("every check held" if held else "a check failed: see FAIL above")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(run_main(main))

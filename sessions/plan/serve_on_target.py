"""Plan session 5's levers on a chip this machine lacks: `s5_serve.py --target
CHIP` compiles the decode loop of each lever (full precision, int8 weights, int8
cache, both) for one device of the chip, and reads the compiled program: the bytes
a step moves, op by op, against the roofline's count; the memory it holds;
whether it makes a float copy of an int8 weight or cache; and the kernels a token
launches (roofline/compiled/launches.py).

The bytes are read off the program itself (roofline/compiled/op_work.py: each op's
operands and result, each op times the times it runs in one call of STEPS steps,
over STEPS), not from XLA's cost analysis: the NVIDIA compiler gives none when it
compiles without a device, and the TPU's counts each slice of an array it streams
on chip as a read of the whole array (docs/results.md, "Session 5").
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from roofline import decode_cost
from roofline.compiled.launches import kernel_launches
from roofline.compiled.op_work import program_work
from roofline.compiled.widened import widened_copies
from roofline.flops import model_line
from sessions.inference import kv_cache, shapes
from sessions.plan import programs
from sessions.run.serving import inference_config
from sessions.shard import sharding

LEVERS = [("full", "full"), ("int8", "full"), ("full", "int8"), ("int8", "int8")]


class LeversPlanned(NamedTuple):
    summary: dict  # --summary-out: `levers`, one object per lever and batch
    compiled: object  # the last program compiled, both levers at the largest batch (--hlo-out)


def bytes_per_step(hlo_text):
    """HBM bytes of one decode step: every op's, times its runs in one call, over STEPS."""
    return sum(w.hbm_bytes * w.count for w in program_work(hlo_text)) / kv_cache.STEPS


def smallest_int8_array(cfg, batch):
    """Elements of the smallest int8 weight (E·K·D, wk) or cache array (B·K·T·D): no
    decode activation is as large, so a float array this size is a weight's copy."""
    K = cfg.n_kv_heads
    return min(cfg.embed * K * cfg.head_dim, batch * K * cfg.seq * cfg.head_dim)


def float_copies_here(int8_weights, cfg, batch):
    """The ops of the decode loop with int8 weights and cache, compiled for this
    machine, that write an int8 weight or cache out as floats (roofline/compiled/widened.py:
    each with how often it runs a call); none where the dots read int8 themselves."""
    cache = kv_cache.init_cache(cfg, batch, int8=True)
    tokens = jnp.zeros((batch, cfg.seq), jnp.int32)
    logits = jnp.zeros((batch, cfg.vocab), jnp.float32)
    lowered = kv_cache.decode_steps.lower(
        int8_weights, cache, tokens, logits, 0, 1, jax.random.key(0), 1.0, cfg=cfg, greedy=True
    )
    return widened_copies(lowered.compile().as_text(), smallest_int8_array(cfg, batch))


def plan_levers(serving, batches, target, devices, say=print):
    """Compile each lever's decode for each of `batches` on one device of `target`,
    print its bytes beside the roofline's and its memory, and return LeversPlanned."""
    cfg, _ = inference_config(serving)
    mesh = sharding.make_mesh(sharding.parse_mesh(None, 1), devices=devices[:1])
    chip = target.chip
    peak, bandwidth = chip.peak(cfg.dtype), chip.hbm_bandwidth * target.chips / target.devices
    say(f"target: {target.name}, 1 x {devices[0].device_kind} (compile-only: nothing runs)")
    say(f"model: {model_line(cfg, length='T')} | {cfg.dtype} | preset {serving.preset}")
    say("decode, each lever compiled; bytes a step per device, read off the compiled program:")
    say(
        f"  {'lever':<12}{'batch':>6}{'compiled MB':>13}{'roofline MB':>13}{'ratio':>7}"
        f"{'memory GB':>11}{'float copies':>14}{'kernels':>9}"
    )
    rows, compiled = [], None
    for w, c in LEVERS:
        for B in batches:
            args, static = shapes.abstract_decode_inputs(cfg, B, mesh, w == "int8", c == "int8")
            compiled, oom, _ = programs.compile_or_oom(
                kv_cache.decode_steps, args, static, mesh, chip, say
            )
            if compiled is None:
                say(f"  {w}/{c} batch {B} does not fit: {oom}")
                continue
            text = compiled.as_text()
            kinds = {"weights": None if w == "full" else w, "cache": None if c == "full" else c}
            step = decode_cost.decode_step_cost(
                cfg, B, peak_flops=peak, bandwidth=bandwidth, **kinds
            )
            memory = compiled.memory_analysis()
            held = memory.argument_size_in_bytes + memory.temp_size_in_bytes
            read = bytes_per_step(text)
            copies = (
                len(widened_copies(text, smallest_int8_array(cfg, B))) if "int8" in (w, c) else 0
            )
            kernels = kernel_launches(text).per_token
            say(
                f"  {w + '/' + c:<12}{B:>6}{read / 1e6:>13,.1f}{step.bytes / 1e6:>13,.1f}"
                f"{read / step.bytes:>7.2f}{held / 1e9:>11.2f}{copies:>14}{kernels:>9}"
            )
            rows.append(
                {
                    "weights": w,
                    "cache": c,
                    "batch": B,
                    "xla_bytes_accessed": read,
                    "roofline_bytes": step.bytes,
                    "memory_bytes": held,
                    "float_copies": copies,
                    "kernels_per_token": kernels,
                }
            )
    say(
        "  (lever: weights/cache; compiled MB: each op's operands and result, as XLA laid "
        "them out; float copies: ops that write an int8 weight or cache as floats; "
        "kernels: those a token launches)"
    )
    summary = {
        "target": target.name,
        "model": dataclasses.asdict(cfg),
        "peak_flops_per_device": peak,
        "hbm_bandwidth_per_device": bandwidth,
        "levers": rows,
    }
    return LeversPlanned(summary, compiled)

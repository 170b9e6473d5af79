"""Plan session 7's engine on a chip this machine lacks: `s7_engine.py --target CHIP`
compiles the engine's two programs, the paged decode step over every slot (R = slots
rows of one token) and a prefill chunk (one row of prefill_chunk tokens), for one device
of the chip, from shapes alone, and reads each compiled program: the memory it holds
(the pool of pages among it), its kernels, and its gathers and scatters, the paging that
XLA does by hand where a paged-attention kernel would read the pages in place
(jax.experimental.pallas.ops.tpu.paged_attention on a TPU, pallas.ops.gpu.paged_attention
on a GPU: sessions/serve/paged_cache.py).

Beside each step, the napkin's bytes (roofline/plan/batching.py paged_step_cost): the
contiguous step's weights and caches, and the paged step's three passes over the caches.
"""

import dataclasses
import math
import re
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from roofline.compiled.launches import kernel_launches
from roofline.flops import model_line
from roofline.plan import batching
from sessions.inference.shapes import abstract_decode_weights, abstract_weights
from sessions.plan import programs
from sessions.run.engine_flags import pool_pages
from sessions.run.serving import inference_config
from sessions.serve.paged_cache import init_pool, slot_step
from sessions.shard import sharding


class EnginePlanned(NamedTuple):
    summary: dict  # --summary-out: `steps`, one object a program
    compiled: object  # the decode step's program (--hlo-out)


def abstract_engine_inputs(cfg, slots, pages, page_size, rows, chunk, mesh):
    """(arguments, static keywords) of paged_cache.slot_step for `rows` rows of `chunk`
    tokens (a decode: rows = slots, chunk 1, its tokens taken from the device), as
    ShapeDtypeStructs on `mesh`'s one device."""
    weights = abstract_decode_weights(abstract_weights(cfg, mesh))
    pool = jax.eval_shape(lambda: init_pool(cfg, pages, page_size))
    P = math.ceil(cfg.seq / page_size)
    whole = NamedSharding(mesh, PartitionSpec())  # one device: every array whole on it

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=whole)

    pool = jax.tree.map(lambda x: spec(x.shape, x.dtype), pool)
    last = spec((slots,), np.int32)
    packed = spec((rows, P + 6), np.int32)  # pack_rows: the page table, then six columns
    tokens = spec((rows, chunk), np.int32)
    return (weights, pool, last, packed, tokens), {"cfg": cfg, "from_last": chunk == 1}


def gathers_and_scatters(hlo_text):
    """(gathers, scatters) in a compiled program's text, fused or not."""
    return len(re.findall(r"\bgather\(", hlo_text)), len(re.findall(r"\bscatter\(", hlo_text))


def plan_engine(serving, engine, pages, target, devices, say=print):
    """Compile the engine's decode step and prefill chunk for one device of `target`,
    print what each holds and launches beside the napkin's bytes; EnginePlanned. engine:
    the Engine's options (slots, page_size, prefill_chunk, ...); pages: the pool, None for
    its default (sessions/run/engine_flags.py pool_pages)."""
    slots, page_size, chunk = engine["slots"], engine["page_size"], engine["prefill_chunk"]
    cfg, _ = inference_config(serving)
    mesh = sharding.make_mesh(sharding.parse_mesh(None, 1), devices=devices[:1])
    chip = target.chip
    peak, bandwidth = chip.peak(cfg.dtype), chip.hbm_bandwidth * target.chips / target.devices
    pages = pool_pages(pages, slots, page_size, cfg.seq)
    napkin = batching.paged_step_cost(cfg, slots, peak_flops=peak, bandwidth=bandwidth)
    say(f"target: {target.name}, 1 x {devices[0].device_kind} (compile-only: nothing runs)")
    say(f"model: {model_line(cfg, length='T')} | {cfg.dtype} | preset {serving.preset}")
    say(f"engine: {slots} slots | {pages} pages of {page_size} | chunks of "
        f"{chunk}")  # fmt: skip
    say(
        f"  {'program':<16}{'rows x tokens':>14}{'memory MB':>11}{'kernels':>9}"
        f"{'gathers':>9}{'scatters':>10}{'compile s':>11}"
    )
    rows, decode = [], None
    for name, R, C in (("decode step", slots, 1), ("prefill chunk", 1, chunk)):
        inputs, static = abstract_engine_inputs(cfg, slots, pages, page_size, R, C, mesh)
        compiled, oom, seconds = programs.compile_or_oom(slot_step, inputs, static, mesh, chip, say)
        if compiled is None:
            say(f"  {name} does not fit: {oom}")
            continue
        text = compiled.as_text()
        memory = compiled.memory_analysis()
        held = memory.argument_size_in_bytes + memory.temp_size_in_bytes
        kernels = kernel_launches(text).per_token
        gathers, scatters = gathers_and_scatters(text)
        say(
            f"  {name:<16}{f'{R} x {C}':>14}{held / 1e6:>11,.1f}{kernels:>9}"
            f"{gathers:>9}{scatters:>10}{seconds:>11.1f}"
        )
        rows.append(
            {
                "program": name,
                "rows": R,
                "tokens": C,
                "memory_bytes": held,
                "kernels": kernels,
                "gathers": gathers,
                "scatters": scatters,
                "compile_seconds": seconds,
            }
        )
        decode = decode or compiled
    say(
        f"  predicted (napkin): a decode step moves {napkin.contiguous.bytes / 1e6:,.2f} MB "
        f"contiguous, {napkin.paged_bytes / 1e6:,.2f} MB paged through XLA's gather: "
        f"{napkin.contiguous_s * 1e6:,.1f} us against {napkin.paged_s * 1e6:,.1f} us at "
        f"{chip.name}'s roofs"
    )
    summary = {
        "target": target.name,
        "model": dataclasses.asdict(cfg),
        "slots": slots,
        "pages": pages,
        "page_size": page_size,
        "steps": rows,
        "predicted_contiguous_step_s": napkin.contiguous_s,
        "predicted_paged_step_s": napkin.paged_s,
    }
    return EnginePlanned(summary, decode)

"""Plan inference on a chip this machine lacks: `s3_infer.py --target
CHIP[:SHAPE]` compiles prefill and the decode loop for each batch (sessions/plan/programs.py),
prints what each device holds, the decode roofline and what the compiler did
(roofline/plan/decode.py), and exits.
"""

import dataclasses
from typing import NamedTuple

from roofline import decode_cost
from roofline.compiled.launches import kernel_launches
from roofline.compiled.program import Collective, collectives, read_program
from roofline.flops import model_line, param_count
from roofline.launch_bound import launch_bound, launch_cost
from roofline.plan.decode import DecodePlan, decode_lines, decode_summary, launch_lines
from roofline.plan.decode_estimate import decode_times
from roofline.predict import comm_time
from roofline.units import capacity
from sessions.errors import UsageError
from sessions.inference import kernel_step, kv_cache, shapes
from sessions.model.attention_choice import KERNEL_PLATFORM
from sessions.model.attention_choice import choose as choose_attention
from sessions.plan import programs
from sessions.run.serving import inference_config
from sessions.shard import sharding
from sessions.train.data import text_to_tokens


def plan_inference(serving, mesh_text, batches, target, devices, say=print):
    """--target: plan prefill and decode of the model `serving` (sessions.run.cli.Serving,
    resolved for the target's chip) describes over `mesh_text`, for `batches` (None:
    the default), and return it as DecodePlanned (programs.write_plan writes it)."""
    cfg, _ = inference_config(serving)
    prompt_len = len(text_to_tokens(serving.prompt))
    kv_cache.check_lengths(cfg, prompt_len, 1)  # the decode program takes any count of steps
    impl = kernel_step.impl_for(serving.decode_impl, target.chip.platform)  # --decode-impl
    return plan_decode(
        mesh_text, cfg, batches, prompt_len, serving.preset, target, devices, say, impl
    )


def plan_prefill(cfg, batch, prompt_len, mesh, target, say):
    """Compile prefill of `batch` prompts for the target, say how it went (memory,
    FLOPs against the napkin) and return it as JSON. Attention as s2_train.py
    picks it for the chip."""
    chip, n = target.chip, target.devices
    impl, note = choose_attention(None, chip.platform, cfg, batch, seq=prompt_len)
    cfg = dataclasses.replace(cfg, attention_impl=impl)

    def inputs_for(mesh, cfg=cfg):
        return shapes.abstract_prefill_inputs(cfg, batch, prompt_len, mesh)

    compiled, oom, seconds = programs.compile_or_oom(
        kv_cache.prefill, *inputs_for(mesh), mesh, chip, say
    )
    napkin = decode_cost.prefill_flops(cfg, batch, prompt_len) / n
    summary = {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "attention_impl": impl,
        "compile_seconds": seconds,
        "napkin_flops_per_device": napkin,
    }
    head = f"prefill: {batch} x {prompt_len} tokens, attention {impl}" + (
        f" ({note})" if note else ""
    )
    if compiled is None:
        say(f"{head}: does not fit: {oom}")
        return {**summary, "fits": False, "error": oom}
    facts = read_program(compiled, n)
    xla, source = facts.xla_flops, "XLA's cost analysis of the compiled program"
    if xla is None or impl in KERNEL_PLATFORM:  # no count, or one blind to the kernel
        einsum = dataclasses.replace(cfg, attention_impl="einsum")
        xla = (
            programs.count_on_this_cpu(lambda mesh: (kv_cache.prefill, *inputs_for(mesh, einsum)))
            / n
        )
        source = "XLA's count before optimisation, lowered for this CPU, attention as einsums"
    fits = facts.memory_bytes <= target.hbm_per_device
    say(
        f"{head} | compiled in {seconds:.1f} s | {facts.memory_bytes / 1e6:,.1f} MB of "
        f"{capacity(target.hbm_per_device)} HBM per device{'' if fits else ': DOES NOT FIT'}"
    )
    say(
        f"  FLOPs per device: XLA {xla / 1e9:,.3f} GFLOP, napkin {napkin / 1e9:,.3f} GFLOP: "
        f"{100 * (xla / napkin - 1):+.1f}%; {source}"
    )
    return {
        **summary,
        "fits": fits,
        "memory_per_device_bytes": facts.memory_bytes,
        "xla_flops_per_device": xla,
        "xla_flops_source": source,
    }


def plan_decode_batch(cfg, batch, mesh, target, say, impl=None):
    """(DecodePlan, the compiled program) of the decode loop for `batch`
    sequences, or (None, why the compiler refused it)."""
    chip, n = target.chip, target.devices
    inputs, static = shapes.abstract_decode_inputs(cfg, batch, mesh)
    static = {**static, "impl": impl}  # XLA's step (None) or our kernels' (kernel_step.py)
    compiled, oom, seconds = programs.compile_or_oom(
        kv_cache.decode_steps, inputs, static, mesh, chip, say
    )
    if compiled is None:
        return None, oom
    facts, text = read_program(compiled, n), compiled.as_text()
    # XLA's cost analysis counts a while loop's body once, whatever its trip count (here
    # the constant kv_cache.STEPS), so the decode program's count is one step's plus
    # what runs outside the loop: nothing, as the weights come as decode reads them.
    # Its collectives are counted once a trip (roofline/compiled/program.py reads the constant):
    # the loop's, over its steps, are one step's.
    xla, source = facts.xla_flops, "XLA's cost analysis of the compiled loop (one step)"
    if xla is None:
        xla = (
            programs.count_on_this_cpu(
                lambda mesh: (
                    kv_cache.decode_steps,
                    *shapes.abstract_decode_inputs(cfg, batch, mesh),
                )
            )
            / n
        )
        source = (
            "the target's compiler gives none: XLA's count of the loop before "
            "optimisation, lowered for this CPU, shared by the devices"
        )
    per_step = {
        kind: Collective(*(x // kv_cache.STEPS for x in c))
        for kind, c in collectives(text, n, in_loops=True).items()
    }
    memory = compiled.memory_analysis()
    peak = chip.peak(cfg.dtype, facts.matmul_precision)
    bandwidth = chip.hbm_bandwidth * target.chips / n
    step = decode_cost.decode_step_cost_per_device(
        cfg, batch, dict(mesh.shape), peak_flops=peak, bandwidth=bandwidth
    )
    launches = kernel_launches(text)
    floor = launch_bound(step, launches.per_token, launch_cost(chip).seconds)
    all_reduces = sum(c.count for c in per_step.values())  # each charged a ring's latency
    streams = kernel_step.byte_streams(cfg, batch) if impl else None  # ours: their grids'
    times = decode_times(
        step, launches.per_token, chip, streams=streams, all_reduces=all_reduces, chips=n
    )
    decoded = DecodePlan(
        batch=batch,
        weight_bytes=sharding.held_bytes(inputs[0]),
        cache_bytes=sharding.held_bytes(inputs[1]),
        argument_bytes=memory.argument_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        memory_bytes=facts.memory_bytes,
        hbm_bytes=target.hbm_per_device,
        step=step,
        comm_s=comm_time(per_step, chip)[1],
        collectives=per_step,
        per_call=collectives(text, n, in_loops=False),
        kernels=facts.kernels,
        launches=launches,
        launch=floor,
        times=times,
        matmul_dtypes=facts.matmul_dtypes,
        xla_flops=xla,
        xla_source=source,
        compile_s=seconds,
    )
    return decoded, compiled


class DecodePlanned(NamedTuple):
    plans: list  # roofline.plan.decode.DecodePlan, one per batch the compiler took
    summary: dict  # --summary-out; "error" if no batch fits
    compiled: object  # the decode program of the largest batch compiled (--hlo-out), or None


def plan_decode(mesh_text, cfg, batches, prompt_len, preset, target, devices, say=print, impl=None):
    """Compile prefill (the largest batch) and the decode loop (each of `batches`;
    None: programs.DECODE_ROWS per data x fsdp group) for `target` over `mesh_text` (None:
    all on fsdp, as s2_train.py), print what each device holds, the decode
    roofline and what the compiler did, and return DecodePlanned."""
    sizes, mesh = programs.target_mesh(mesh_text, target, devices)
    ways = sizes["data"] * sizes["fsdp"]
    batches = batches or [rows * ways for rows in programs.DECODE_ROWS]
    for b in batches:
        if b % ways:
            raise UsageError(f"--batches: {b} does not divide over data x fsdp = {ways} of --mesh")
    sharding.check_divisible(cfg, ways, sizes)
    chip, n = target.chip, target.devices
    peak, bandwidth = chip.peak(cfg.dtype), chip.hbm_bandwidth * target.chips / n
    link = f", {chip.interconnect / 2e9:,.0f} GB/s a link direction" if chip.interconnect else ""
    say(
        f"target: {target.name}, {n} x {devices[0].device_kind} (compile-only: nothing runs) "
        f"| preset {preset}"
    )
    say(
        f"model: {model_line(cfg, length='T')} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype}"
    )
    per_launch = launch_cost(chip)
    launch = "none" if per_launch.seconds is None else f"{per_launch.seconds * 1e6:.1f} us"
    say(
        f"mesh: {', '.join(f'{a}={k}' for a, k in sizes.items())} | per device "
        f"{peak / 1e12:,.1f} TFLOP/s ({cfg.dtype}), {bandwidth / 1e9:,.0f} GB/s HBM{link}"
    )
    say(f"a kernel launch: {launch} ({per_launch.source})")
    summary = {
        "target": target.name,
        "devices": n,
        "mesh": sizes,
        "preset": preset,
        "model": dataclasses.asdict(cfg),
        "peak_flops_per_device": peak,
        "hbm_bandwidth_per_device": bandwidth,
        "per_launch_seconds": per_launch.seconds,
        "per_launch_source": per_launch.source,
    }
    summary["prefill"] = plan_prefill(cfg, max(batches), prompt_len, mesh, target, say)

    plans, refused, compiled = [], {}, None
    for b in sorted(batches):  # the last program compiled is the largest batch's (--hlo-out)
        decoded, out = plan_decode_batch(cfg, b, mesh, target, say, impl)
        if decoded is None:
            refused[b] = out
        else:
            plans.append(decoded)
            compiled = out
            if not decoded.fits:
                refused[b] = (
                    f"XLA's plan needs {decoded.memory_bytes / 1e9:,.2f} GB a device, "
                    f"more than its {capacity(target.hbm_per_device)} of HBM"
                )
    say(
        "decode, one token per sequence a step, per device (it reads every weight tp does not "
        "split):"
    )
    for line in decode_lines(plans, target.hbm_per_device) if plans else []:
        say(line)
    for b, why in refused.items():
        say(f"  batch {b} does not fit: {why}")
    best = decode_cost.compute_bound_batch_per_device(
        cfg, sizes, peak_flops=peak, bandwidth=bandwidth
    )
    say(
        f"decode turns compute-bound from batch {best:,.0f} on this mesh"
        if best
        else f"bytes against FLOPs, decode is memory-bound at every batch here (T={cfg.seq}: "
        "the cache outweighs the work)"
    )
    for line in launch_lines(plans, cfg.layers, per_launch.seconds):
        say(line)
    if any("all-gather" in p.collectives for p in plans) and sizes["fsdp"] > 1:
        say(
            "fsdp gathers the weights again every step (the all-gathers): --mesh tp=N splits "
            "them where they lie, data=N keeps a whole copy on each device"
        )
    summary["compute_bound_batch"] = best
    summary["batches"] = {str(p.batch): decode_summary(p) for p in plans}
    for b, why in refused.items():
        summary["batches"].setdefault(str(b), {"fits": False})["error"] = why
    if not any(p.fits for p in plans):
        tries = ["smaller --batches", "a shorter --seq (the cache grows with it)"]
        if sizes["data"] > 1:
            tries.append("fsdp or tp for data in --mesh (data copies every weight)")
        summary["error"] = (
            f"no batch of {', '.join(map(str, batches))} fits on {target.name} "
            f"({capacity(target.hbm_per_device)} HBM per device); try "
            f"{', '.join(tries)}, or a bigger slice"
        )
    return DecodePlanned(plans, summary, compiled)

"""Compile the training step ahead of time, from shapes alone: for this machine,
or for a chip it lacks (`s2_train.py --target CHIP[:SHAPE]`); and inference's
prefill and decode loop for such a chip (`s3_infer.py --target CHIP[:SHAPE]`).

A compiled step is what the chip would run: XLA's memory plan, its FLOP count,
the collectives the partitioner inserted and the kernels it chose can all be
read off it (roofline/program.py) before anyone rents the chip. Nothing is
executed and no array is ever allocated: the state is `jax.ShapeDtypeStruct`s
carrying their shardings, exactly as s2_train.py builds it for real.
"""

import dataclasses
import functools
import os
import time
from typing import NamedTuple

import jax
import numpy as np

from roofline import decode_cost
from roofline.decode_plan import DecodePlan, decode_lines, decode_summary
from roofline.flops import param_count
from roofline.program import Collective, collectives, read_program
from roofline.targets import TargetError, compile_only_devices
from roofline.training_plan import comm_time, plan_lines, plan_summary, training_plan
from sessions import inference, sharding
from sessions.attention import KERNEL_PLATFORM
from sessions.attention import choose as choose_attention
from sessions.config import UsageError
from sessions.decode_layout import abstract_decode_weights
from sessions.model import init_params
from sessions.train import init_state, make_optimizer, make_train_step


def abstract_step(cfg, tc, mesh):
    """(step function, abstract state, abstract batch) for `mesh`: the jitted
    train step with its shardings, and the shapes it is compiled for."""
    optimizer = make_optimizer(tc, tc.steps)
    init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
    key = jax.random.key(tc.seed)  # a concrete key on this machine: only its shape is used
    with jax.set_mesh(mesh):
        state = sharding.abstract_sharded(init, key, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    batch_sharding = sharding.batch_sharding(mesh)
    tokens = jax.ShapeDtypeStruct((tc.batch, cfg.seq), np.int32, sharding=batch_sharding)
    step = make_train_step(cfg, optimizer, state_shardings=shardings, batch_sharding=batch_sharding)
    return step, state, {"inputs": tokens, "targets": tokens}


def one_device_mesh():
    return sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=jax.devices()[:1])


def compile_train_step(cfg, tc):
    """The training step compiled for one device of this machine: what XLA's
    cost analysis is asked about (scripts/profile_s2.py)."""
    mesh = one_device_mesh()
    step, state, batch = abstract_step(cfg, tc, mesh)
    with jax.set_mesh(mesh):
        return step.lower(state, batch).compile()


def count_before_optimisation(cfg, tc):
    """XLA's FLOP count of the whole step before any target's optimisation: the
    program lowered for this CPU, unpartitioned, attention as einsums (a
    custom kernel's FLOPs are invisible to the count)."""
    cfg = dataclasses.replace(cfg, attention_impl="einsum")
    mesh = one_device_mesh()
    step, state, batch = abstract_step(cfg, tc, mesh)
    with jax.set_mesh(mesh):
        cost = step.lower(state, batch).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def devices_for(target_text):
    """(Target, compile-only devices); a target this machine cannot reach is a UsageError.

    This machine's own backend is then only needed for shapes and a CPU count,
    so it is pinned to the CPU before JAX starts one: otherwise, with the chip
    compilers installed, JAX would first try to start a TPU and a GPU it lacks,
    and say so at length."""
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    try:
        return compile_only_devices(target_text)
    except TargetError as e:
        raise UsageError(str(e)) from None


def compiler_needs(error):
    """The compiler's out-of-memory error, from what it says it needed, on one line."""
    needed = " ".join(str(error).split())
    for marker in ("total memory required", "Ran out of memory"):
        if marker in needed:
            return needed[needed.index(marker) :][:200].rstrip(". ")
    return needed


def too_big(error, target, tc, sizes):
    """The compiler's out-of-memory error as one line with what to try."""
    needed = compiler_needs(error)
    tries = [f"a smaller --batch (now {tc.batch})"]
    if sizes["fsdp"] < target.devices:
        tries.append("a larger fsdp axis in --mesh")
    tries.append("a bigger slice")
    return UsageError(
        f"the step does not fit on {target.name} ({target.hbm_per_device / 1e9:.2f} GB HBM per "
        f"device): {needed}; try {', '.join(tries)}"
    )


def compile_for(lowered, chip, say):
    """lowered.compile(), with one known detour on NVIDIA targets.

    Compiling deviceless, XLA cannot autotune its Triton matmul tiles on a GPU,
    and for some small shapes (E=48, say) its default tiling finds none and
    gives up; then the matmuls are left to cuBLAS, as a real GPU may also
    choose, and the header says so."""
    try:
        return lowered.compile()
    except Exception as e:
        if chip.platform != "gpu" or "tile sizes" not in str(e):
            raise
    say(
        "matmuls: XLA's Triton tiling found no tiles for these shapes without a GPU to "
        "autotune on; compiled with cuBLAS matmuls instead (xla_gpu_enable_triton_gemm=false)"
    )
    return lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False})


class Planned(NamedTuple):
    """One step compiled for a target, and what was read off it."""

    plan: object  # roofline.training_plan.TrainingPlan
    summary: dict  # the plan as JSON (--summary-out); "error" if the step does not fit
    compiled: object  # jax.stages.Compiled, for the target: inspect it, never run it
    state_bytes_per_device: int  # params + optimizer state, by the sharding rules


def plan_target(mesh_text, cfg, tc, preset, target, devices, say, attention_note=None):
    """Compile the step `cfg, tc` for `target` over the mesh `mesh_text`
    ('fsdp=4,tp=2', None: all on fsdp), print its report, and return it as
    Planned. Raises UsageError for a mesh the target cannot hold or a step the
    compiler refuses for want of memory."""
    try:
        sizes = sharding.parse_mesh(mesh_text, len(devices))
    except UsageError as e:
        raise UsageError(f"{e} (--target {target.name})") from None
    sharding.check_divisible(cfg, tc.batch, sizes)
    mesh = sharding.make_mesh(sizes, devices=np.array(devices))
    chip = target.chip
    say(
        f"target: {target.name}, {target.devices} x {devices[0].device_kind} "
        f"(compile-only: nothing runs) | preset {preset}"
    )
    say(
        f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
        f"S={cfg.seq} V={cfg.vocab} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype} "
        f"matmuls | attention: {cfg.attention_impl}"
    )
    if attention_note:
        say(f"attention: {attention_note}")
    say(f"step: {tc.batch} x {cfg.seq} = {tc.batch * cfg.seq:,} tokens")

    step, state, batch = abstract_step(cfg, tc, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    for line in sharding.describe(state["params"], shardings["params"], mesh):
        say(line)
    held, total = sharding.bytes_per_device(state, shardings)
    say(
        f"params + optimizer state: {total / 2**20:,.1f} MiB in all, "
        f"{held / 2**20:,.1f} MiB per device"
    )

    start = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = step.lower(state, batch)
        try:
            compiled = compile_for(lowered, chip, say)
        except Exception as e:  # XlaRuntimeError: the compiler's verdict
            if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
                raise too_big(e, target, tc, sizes) from None
            raise
    seconds = time.perf_counter() - start
    say(
        f"compiled for {target.name} in {seconds:.1f} s ({jax.__version__}, "
        f"{'libtpu' if chip.platform == 'tpu' else 'the CUDA plugin'})"
    )

    facts = read_program(compiled, target.devices)
    kernel_attention = cfg.attention and cfg.attention_impl in KERNEL_PLATFORM
    xla_flops, source = facts.xla_flops, "XLA's cost analysis of the compiled step"
    if xla_flops is None:
        xla_flops = count_before_optimisation(cfg, tc) / target.devices
        source = (
            "the target's compiler gives none; this is XLA's count of the step "
            "before optimisation (lowered for this CPU, attention as einsums)"
        )
        kernel_attention = False  # that program has no kernel to hide FLOPs in
    p = training_plan(
        cfg,
        tc.batch,
        target,
        facts,
        mesh=sizes,
        kernel_attention=kernel_attention,
        xla_flops=xla_flops,
        xla_source=source,
    )
    for line in plan_lines(p):
        say(line)
    summary = plan_summary(p)
    summary.update(
        preset=preset,
        batch=tc.batch,
        seq=cfg.seq,
        dtype=cfg.dtype,
        attention_impl=cfg.attention_impl,
        compile_seconds=seconds,
    )
    if not p.fits:
        # Written out first (--summary-out), then refused: exit 2 with what to try.
        summary["error"] = str(
            too_big(
                f"the compiled step needs {p.memory_per_device_bytes / 1e9:.2f} GB per device",
                target,
                tc,
                sizes,
            )
        )
    return Planned(p, summary, compiled, held)


# Inference (s3_infer.py --target): prefill and the decode loop, compiled from shapes alone.

DECODE_ROWS = (1, 4, 16, 64)  # the default batches, per data x fsdp group of devices


def abstract_weights(cfg, mesh):
    """The params as a server keeps them: ShapeDtypeStructs in the compute dtype
    (cast once, at load), each with its sharding rule over `mesh`."""
    key = jax.eval_shape(lambda: jax.random.key(0))  # an abstract key: no device is touched
    params = sharding.abstract_sharded(functools.partial(init_params, cfg), key, mesh)
    return jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape, cfg.dtype, sharding=w.sharding), params
    )


def abstract_decode_inputs(cfg, batch, mesh):
    """(arguments, static keywords) of inference.decode_steps for `batch` sequences over
    `mesh`: ShapeDtypeStructs carrying their shardings. The one place that knows
    decode's signature.

    The weights come as decode reads them, in the compute dtype, so nothing
    runs outside the loop: the program is one step, repeated. The cache's
    layout is inference.init_cache's own, read off a small copy of that
    program compiled (zeros, never run: one row per group of devices and one
    position, so it fits whatever the batch), which lays out every batch and
    length alike. Tokens and logits are split by rows like every batch.
    Greedy: no random draw in the step."""
    rows = sharding.batch_sharding(mesh)
    small = rows.mesh.shape["data"] * rows.mesh.shape["fsdp"]
    with jax.set_mesh(mesh):
        make = jax.jit(inference.init_cache, static_argnums=(0, 1))
        layouts = make.lower(dataclasses.replace(cfg, seq=1), small).compile().output_shardings
    shapes = jax.eval_shape(functools.partial(inference.init_cache, cfg, batch))
    cache = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, layouts
    )
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq), np.int32, sharding=rows)
    logits = jax.ShapeDtypeStruct((batch, cfg.vocab), np.float32, sharding=rows)
    start = n = jax.ShapeDtypeStruct((), np.int32)  # traced: one program for every length
    key = jax.eval_shape(lambda: jax.random.key(0))
    temperature = jax.ShapeDtypeStruct((), np.float32)
    weights = abstract_decode_weights(abstract_weights(cfg, mesh))
    args = (weights, cache, tokens, logits, start, n, key, temperature)
    return args, {"cfg": cfg, "greedy": True}


def held_bytes(tree):
    """Bytes of a tree of sharded ShapeDtypeStructs that one device holds."""
    return sharding.bytes_per_device(tree, jax.tree.map(lambda x: x.sharding, tree))[0]


def compile_or_oom(fn, args, static, mesh, chip, say):
    """(compiled or None, the compiler's out-of-memory verdict or None, seconds)."""
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = fn.lower(*args, **static)
        try:
            compiled, oom = compile_for(lowered, chip, say), None
        except Exception as e:  # XlaRuntimeError: the compiler's verdict
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
            compiled, oom = None, compiler_needs(e)
    return compiled, oom, time.perf_counter() - start


def count_on_this_cpu(fn, args_for):
    """XLA's FLOP count of fn(*args) lowered for one device of this CPU, before
    optimisation, with args_for(mesh) -> (args, static): for a target whose
    compiler gives no count (NVIDIA, deviceless)."""
    mesh = one_device_mesh()
    args, static = args_for(mesh)
    with jax.set_mesh(mesh):
        cost = fn.lower(*args, **static).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def plan_prefill(cfg, batch, prompt_len, mesh, target, say):
    """Compile prefill of `batch` prompts for the target, say how it went (memory,
    FLOPs against the napkin) and return it as JSON. Attention as s2_train.py
    picks it for the chip."""
    chip, n = target.chip, target.devices
    impl, note = choose_attention(None, chip.platform, cfg, batch, seq=prompt_len)
    cfg = dataclasses.replace(cfg, attention_impl=impl)

    def args_for(mesh, cfg=cfg):
        prompts = jax.ShapeDtypeStruct(
            (batch, prompt_len), np.int32, sharding=sharding.batch_sharding(mesh)
        )
        return (abstract_weights(cfg, mesh), prompts), {"cfg": cfg}

    compiled, oom, seconds = compile_or_oom(inference.prefill, *args_for(mesh), mesh, chip, say)
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
        xla = count_on_this_cpu(inference.prefill, functools.partial(args_for, cfg=einsum)) / n
        source = "XLA's count before optimisation, lowered for this CPU, attention as einsums"
    fits = facts.memory_bytes <= target.hbm_per_device
    say(
        f"{head} | compiled in {seconds:.1f} s | {facts.memory_bytes / 1e6:,.1f} MB of "
        f"{target.hbm_per_device / 1e9:.2f} GB HBM per device{'' if fits else ': DOES NOT FIT'}"
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


def plan_decode_batch(cfg, batch, mesh, target, say):
    """(DecodePlan, the compiled program) of the decode loop for `batch`
    sequences, or (None, why the compiler refused it)."""
    chip, n = target.chip, target.devices
    args, static = abstract_decode_inputs(cfg, batch, mesh)
    compiled, oom, seconds = compile_or_oom(inference.decode_steps, args, static, mesh, chip, say)
    if compiled is None:
        return None, oom
    facts, text = read_program(compiled, n), compiled.as_text()
    # XLA's cost analysis counts a while loop's body once, whatever its trip count (here
    # the constant inference.STEPS), so the decode program's count is one step's plus
    # what runs outside the loop: nothing, as the weights come as decode reads them.
    # Its collectives are counted once a trip (roofline/program.py reads the constant):
    # the loop's, over its steps, are one step's.
    xla, source = facts.xla_flops, "XLA's cost analysis of the compiled loop (one step)"
    if xla is None:
        xla = (
            count_on_this_cpu(
                inference.decode_steps, functools.partial(abstract_decode_inputs, cfg, batch)
            )
            / n
        )
        source = (
            "the target's compiler gives none: XLA's count of the loop before "
            "optimisation, lowered for this CPU, shared by the devices"
        )
    per_step = {
        kind: Collective(*(x // inference.STEPS for x in c))
        for kind, c in collectives(text, n, in_loops=True).items()
    }
    memory = compiled.memory_analysis()
    peak = chip.peak(cfg.dtype, facts.matmul_precision)
    bandwidth = chip.hbm_bandwidth * target.chips / n
    decoded = DecodePlan(
        batch=batch,
        weight_bytes=held_bytes(args[0]),
        cache_bytes=held_bytes(args[1]),
        argument_bytes=memory.argument_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        memory_bytes=facts.memory_bytes,
        hbm_bytes=target.hbm_per_device,
        step=decode_cost.decode_step_cost_per_device(
            cfg, batch, dict(mesh.shape), peak_flops=peak, bandwidth=bandwidth
        ),
        comm_s=comm_time(per_step, chip)[1],
        collectives=per_step,
        per_call=collectives(text, n, in_loops=False),
        kernels=facts.kernels,
        matmul_dtypes=facts.matmul_dtypes,
        xla_flops=xla,
        xla_source=source,
        compile_s=seconds,
    )
    return decoded, compiled


class DecodePlanned(NamedTuple):
    plans: list  # roofline.decode_plan.DecodePlan, one per batch the compiler took
    summary: dict  # --summary-out; "error" if no batch fits
    compiled: object  # the decode program of the largest batch compiled (--hlo-out), or None


def plan_decode(mesh_text, cfg, batches, prompt_len, preset, target, devices, say=print):
    """Compile prefill (the largest batch) and the decode loop (each of `batches`;
    None: DECODE_ROWS per data x fsdp group) for `target` over `mesh_text` (None:
    all on fsdp, as s2_train.py), print what each device holds, the decode
    roofline and what the compiler did, and return DecodePlanned."""
    try:
        sizes = sharding.parse_mesh(mesh_text, len(devices))
    except UsageError as e:
        raise UsageError(f"{e} (--target {target.name})") from None
    ways = sizes["data"] * sizes["fsdp"]
    batches = batches or [rows * ways for rows in DECODE_ROWS]
    for b in batches:
        if b % ways:
            raise UsageError(f"--batches: {b} does not divide over data x fsdp = {ways} of --mesh")
    sharding.check_divisible(cfg, ways, sizes)
    mesh = sharding.make_mesh(sizes, devices=np.array(devices))
    chip, n = target.chip, target.devices
    peak, bandwidth = chip.peak(cfg.dtype), chip.hbm_bandwidth * target.chips / n
    link = f", {chip.interconnect / 2e9:,.0f} GB/s a link direction" if chip.interconnect else ""
    say(
        f"target: {target.name}, {n} x {devices[0].device_kind} (compile-only: nothing runs) "
        f"| preset {preset}"
    )
    say(
        f"model: L={cfg.layers} E={cfg.embed} F={cfg.ff} H={cfg.heads} D={cfg.head_dim} "
        f"T={cfg.seq} V={cfg.vocab} | {param_count(cfg) / 1e6:.2f}M params | {cfg.dtype}"
    )
    say(
        f"mesh: {', '.join(f'{a}={k}' for a, k in sizes.items())} | per device "
        f"{peak / 1e12:,.1f} TFLOP/s ({cfg.dtype}), {bandwidth / 1e9:,.0f} GB/s HBM{link}"
    )
    summary = {
        "target": target.name,
        "devices": n,
        "mesh": sizes,
        "preset": preset,
        "model": dataclasses.asdict(cfg),
        "peak_flops_per_device": peak,
        "hbm_bandwidth_per_device": bandwidth,
    }
    summary["prefill"] = plan_prefill(cfg, max(batches), prompt_len, mesh, target, say)

    plans, refused, compiled = [], {}, None
    for b in sorted(batches):  # the last program compiled is the largest batch's (--hlo-out)
        decoded, out = plan_decode_batch(cfg, b, mesh, target, say)
        if decoded is None:
            refused[b] = out
        else:
            plans.append(decoded)
            compiled = out
            if not decoded.fits:
                refused[b] = (
                    f"XLA's plan needs {decoded.memory_bytes / 1e9:,.2f} GB a device, "
                    f"more than its {target.hbm_per_device / 1e9:.2f} GB of HBM"
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
        else f"decode is memory-bound at every batch here (T={cfg.seq}: the cache outweighs "
        "the work)"
    )
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
            f"({target.hbm_per_device / 1e9:.2f} GB HBM per device); try "
            f"{', '.join(tries)}, or a bigger slice"
        )
    return DecodePlanned(plans, summary, compiled)

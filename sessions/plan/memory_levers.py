"""Session 6's levers, each one training step compiled as s2_train.py compiles it: XLA's
memory plan beside the napkin's, the compile time, and, on this machine, a few steps run
for their time and loss.

    row = measure_lever(run, Lever("block", scan=True), steps=4)          # here
    row = measure_lever(run, Lever("block", scan=True), target=target)    # a chip, deviceless

A lever changes what the step holds and how it is compiled, never its arithmetic: every
lever's loss after the same steps on the same batches is the same, to float rounding.
"""

import dataclasses
import math
import re
import time
from typing import NamedTuple

import jax

from roofline.compiled.hlo import parse
from roofline.flops import train_flops
from roofline.hardware import find_chip
from roofline.memory import planned_bytes
from roofline.plan.training_memory import Recipe, plan_memory, recompute_flops
from roofline.timing import time_calls
from sessions.plan import programs
from sessions.train import data, step


class Lever(NamedTuple):
    remat: str = "none"  # ModelConfig.remat: a policy (sessions/model/remat.py)
    scan: bool = False  # ModelConfig.scan_layers
    accum: int = 1  # TrainConfig.accum: microbatches a step
    weights: str = "float32"  # TrainConfig.weights: bfloat16 weights compute in bfloat16
    master: bool = False  # TrainConfig.master
    dtype: str | None = None  # the compute dtype (None: the run's, or bf16 weights')

    @property
    def name(self):
        return f"remat {self.remat:<9} {'scan' if self.scan else 'loop'}  accum {self.accum}"

    @property
    def recipe(self):
        """How the weights are stored, in words."""
        return {"float32": "float32, cast each step", "bfloat16": "bfloat16"}[self.weights] + (
            " + float32 master" if self.master else ""
        )


# The napkin here plans bytes, not fit: any chip's table entry serves.
H100 = find_chip("h100")
# The session's table: remat unrolled (what a laptop sees), remat scanned (what the
# compiler does with it), then accumulation on top of the smallest.
TABLE = (
    Lever("none"),
    Lever("dots"),
    Lever("block"),
    Lever("none", scan=True),
    Lever("dots", scan=True),
    Lever("block", scan=True),
    Lever("block", scan=True, accum=4),
    # Korthikanti et al.'s selective recompute: all but attention's [S, S] values.
    Lever("selective", scan=True),
)
# The weights' recipes, each with bf16 matmuls: float32 weights cast inside the step (the
# course's mixed precision), bf16 weights with a float32 master, bf16 weights alone.
RECIPES = (
    Lever("block", scan=True, dtype="bfloat16"),
    Lever("block", scan=True, weights="bfloat16", master=True),
    Lever("block", scan=True, weights="bfloat16"),
)


@dataclasses.dataclass
class LeverRow:
    """One lever measured: --summary-out's levers[...] (bytes per device, FLOPs a step)."""

    remat: str
    scan: bool
    accum: int
    weights: str  # the stored weights' dtype (TrainConfig.weights)
    master: bool  # a float32 master copy beside bf16 weights (TrainConfig.master)
    dtype: str  # the matmuls' (ModelConfig.dtype)
    planned_bytes: float  # the napkin's (roofline/plan/training_memory.py)
    xla_bytes: int | None  # XLA's plan of the compiled step; None: the compiler refused it
    step_seconds: float | None  # the median step after the first; None: not run (a target)
    flops: int  # the step's FLOPs with remat's recompute, predicted
    compile_seconds: float
    loss: float | None  # after the steps; None: not run
    recompute_in_forward: bool | None  # the schedule rebuilds during the forward (below)
    float32_dots: tuple | None  # (dots with a float32 result, all dots) of the compiled step


def lever_configs(run, lever):
    """(ModelConfig, TrainConfig) of the run with the lever pulled."""
    dtype = lever.dtype or ("bfloat16" if lever.weights == "bfloat16" else run.model.dtype)
    cfg = dataclasses.replace(run.model, remat=lever.remat, scan_layers=lever.scan, dtype=dtype)
    recipe = {"accum": lever.accum, "weights": lever.weights, "master": lever.master}
    return cfg, dataclasses.replace(run.train, **recipe)


def measure_lever(run, lever, *, steps=0, corpus=None, target=None, devices=None):
    """A LeverRow: compiled here on one device and run `steps` steps over `corpus`'s
    training split, or, with target (programs.devices_for), compiled for it only."""
    cfg, tc = lever_configs(run, lever)
    sizes = {"data": 1, "fsdp": 1, "tp": 1}
    if target:
        sizes, mesh = programs.target_mesh(None, target, devices)
        fn, inputs, static = programs.train_step_program(cfg, tc, mesh)
        compiled, _, seconds = programs.compile_or_oom(fn, inputs, static, mesh, target.chip, print)
    else:
        mesh = programs.one_device_mesh()
        compiled, seconds = compile_here(cfg, tc, mesh)
    xla = None if compiled is None else planned_bytes(compiled.memory_analysis())
    hlo = None if compiled is None else compiled.as_text()
    early = None if hlo is None else recompute_runs_in_forward(hlo)
    # The napkin on the same mesh: the batch over data x fsdp, ZeRO-3 where fsdp shards.
    plan = plan_memory(
        cfg, target.chip if target else H100, chips=math.prod(sizes.values()), tp=sizes["tp"],
        batch_tokens=tc.batch * cfg.seq, remat=lever.remat, accum=lever.accum, scan=lever.scan,
        shard="params" if sizes["fsdp"] > 1 else "none", recipe=stored(lever),
    )  # fmt: skip
    flops = train_flops(cfg, tc.batch) + recompute_flops(cfg, tc.batch, lever.remat)
    timing, loss = None, None
    if steps > 1 and compiled is not None:
        timing, loss = run_steps(compiled, cfg, tc, mesh, corpus, steps)
    return LeverRow(
        lever.remat, lever.scan, lever.accum, lever.weights, lever.master, cfg.dtype,
        plan.per_chip["total"], xla, timing and timing.median, flops, seconds, loss, early,
        None if hlo is None else float32_dots(hlo),
    )  # fmt: skip


def stored(lever):
    """The napkin's Recipe for the lever. The step hands the optimizer float32 gradients
    whatever the weights (sessions/train/master_weights.py casts bf16 ones), and XLA
    holds them so: with a master, Megatron-LM's 18 bytes a parameter, not ZeRO's 16."""
    return Recipe(lever.weights, lever.master)  # its grads: float32


def float32_dots(hlo_text):
    """(dots whose result is float32, all dots) of a compiled program. In a bf16 step,
    a dot XLA runs in float32 leaves float32 temporaries where the napkin counts 2 bytes:
    JAX 0.10's CPU backend runs all of them so, JAX 0.12's about a third."""
    dots = [op for _, op in parse(hlo_text).instructions() if op.opcode == "dot"]
    return sum(op.dtype == "f32" for op in dots), len(dots)


def run_steps(compiled, cfg, tc, mesh, corpus, steps):
    """(roofline.timing.Timing of steps 2..steps, the last step's loss): the same batches
    and initial weights for every lever (seed tc.seed); the first step is not counted."""
    optimizer = step.make_optimizer(tc, tc.steps)
    batches = iter(
        [
            data.get_batch(corpus.train, i, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
            for i in range(steps)
        ]
    )
    with jax.set_mesh(mesh):
        key = jax.random.key(tc.seed)
        carry = {"state": step.init_state(key, cfg=cfg, optimizer=optimizer, weights=tc.weights)}

        def call():
            carry["state"], metrics = compiled(carry["state"], next(batches))
            carry["loss"] = metrics["loss"]
            return carry["loss"]

        timing = time_calls(call, repeats=steps - 1, warmup=1)
    return timing, float(carry["loss"])


def recompute_runs_in_forward(hlo_text):
    """Whether a compiled step's schedule runs remat's rebuilt forward before its
    backward begins. Then the rebuilt values live from the forward to their use, as
    saved ones would, and remat saves nothing: XLA's CPU backend in JAX 0.10 schedules
    an unrolled step so, JAX 0.12's does not. A scanned step's rebuilding sits in the
    backward loop's body, which cannot run early.

    A compiled module's entry computation is printed in its schedule's order; JAX
    names the backward's ops transpose(...), the rebuilt ones among them
    .../rematted_computation/..."""
    names = [op_name(op) for op in parse(hlo_text).entry.instructions]
    rebuilt = ["rematted_computation" in name for name in names]  # in the backward's name too
    backward = next(
        (i for i, name in enumerate(names) if "transpose(" in name and not rebuilt[i]),
        len(names),
    )
    return any(rebuilt[:backward])


def op_name(op):
    """The JAX name an HLO instruction's metadata gives it ("" where none)."""
    found = re.search(r'op_name="([^"]*)"', op.attributes.get("metadata", ""))
    return found.group(1) if found else ""


def compile_here(cfg, tc, mesh):
    """(the step compiled for this machine's first device, seconds it took)."""
    fn, inputs, _ = programs.train_step_program(cfg, tc, mesh)
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = fn.lower(*inputs).compile()
    return compiled, time.perf_counter() - start


def compile_seconds(run, layers, scan):
    """Seconds to compile the step with `layers` layers, unrolled or scanned, here."""
    cfg = dataclasses.replace(run.model, layers=layers, scan_layers=scan)
    return compile_here(cfg, run.train, programs.one_device_mesh())[1]

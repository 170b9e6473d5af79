"""A training step's memory on N chips, on a napkin: what fills each chip's HBM, and
the levers that move it (python -m roofline memory).

Four kinds of bytes, each counted for the whole model and batch, then per chip:

    state        P parameters x bytes a parameter, by recipe and ZeRO stage
                 (roofline/plan/training_state.py)
    activations  what the forward saves for the backward, per layer per token, by the
                 remat policy (roofline/plan/saved_activations.py)
    transients   the largest temporary, held apart: the logits and their gradient
                 [tokens, V], or one layer's backward, which holds about one set of
                 what the layer saves under none: those values' gradients (none), or
                 the values rebuilt, each gradient freed as the next op takes it
                 (remat); with the layers scanned (--scan-layers), their weights
                 stacked in the compute dtype, and that stack's gradient, beside it
    gathered     under --shard params (FSDP), the one layer whose weights are gathered
                 whole (the chip's tp share, in the compute dtype) and their gradient
                 before the reduce-scatter: 2 x (the layer's matrices / tp + its norms)

The chips' layout (roofline/plan/memory_layout.py): tp splits the matrices and the
activations with an H, K, F, S or V axis; the replicas x seq_shards chips that hold the
same weights share the tokens, and --shard divides the state over them; --accum N
microbatches run one at a time, so activations and transients are one microbatch's.

The levers practitioners add:
    --sequence-parallel  with tp, the activations tp copies onto every chip (the norms,
        the layer's input, the residual stream: split=False in saved_per_layer_per_token)
        are sharded along the sequence over tp too (Korthikanti et al. 2022, section
        4.2.2): every saved byte, and the transients' [tokens, E] parts, divided by tp.
    --loss-chunks N      the cross-entropy over N token chunks: the logits and their
        gradient are [tokens / N, V]. What stays whole: the final norm's output [tokens,
        E] (an activation), the gradient flowing into it (no larger than a layer's
        backward, the other transient) and the unembedding's gradient (in grads).
    --offload optimizer|activations  those bytes live in host memory (host_per_chip),
        and cross the host link (roofline/plan/host_link.py) there and back each step.
    --pipeline-stages P --microbatches M  stage 0 under 1F1B holds min(P, M)
        microbatches' activations of its L / P layers (Narayanan et al. 2021, section
        2.2.1), each microbatch 1/M of its replica's batch, and 1/P of the state. The
        course's step does not pipeline: a napkin term only.

What the napkin leaves out, and the compiler's plan holds: the runtime's workspace,
fusion buffers, alignment, a compute-dtype copy of the weights, and the compiler's own
choices (roofline/README.md, "Training memory, on a napkin").
"""

import dataclasses
import math

from roofline.flops import train_flops
from roofline.memory import usable_fraction
from roofline.plan.host_link import host_link
from roofline.plan.memory_layout import fewest_accepted, model_problem, pick_layout
from roofline.plan.saved_activations import (
    layer_matrices,
    recompute_flops,
    remat_problem,
    saved_bytes,
    saved_per_layer_per_token,
)
from roofline.plan.training_state import (  # noqa: F401 (the planner's names, re-exported)
    CONVENTIONS,
    DTYPE_BYTES,
    SHARDED,
    SHARDS,
    STATE,
    Recipe,
    split_params,
)

OFFLOADS = ("optimizer", "activations")


@dataclasses.dataclass(frozen=True)
class Levers:
    """Everything of a plan but the model, the chip, the chip count and the batch."""

    tp: int = 1
    remat: object = "none"
    recipe: Recipe = Recipe()  # noqa: RUF009 (frozen: one shared default is safe)
    shard: str = "none"
    accum: int = 1
    scan: bool = False
    seq_shards: int | None = None  # None: the planner picks
    sequence_parallel: bool = False
    loss_chunks: int = 1
    offload: str | None = None
    stages: int = 1
    microbatches: int | None = None  # None: as many as stages


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    cfg: object  # a ModelConfig
    chip: object  # roofline.chip.Chip
    chips: int
    tp: int
    batch_tokens: int
    remat: object
    recipe: Recipe
    shard: str
    accum: int
    whole: dict  # bytes for the whole model and batch: STATE, activations, transients
    per_chip: dict  # HBM bytes on one chip, by part, gathered, and total
    flops_per_step: int
    saved: dict  # saved_per_layer_per_token
    min_chips: int | None  # the fewest chips the command accepts that hold it; None: none
    max_batch_tokens: int  # the most tokens a step that fit on these chips (0: none)
    layout: object = None  # roofline/plan/memory_layout.py Layout
    levers: Levers = Levers()
    host_per_chip: dict = dataclasses.field(default_factory=dict)  # offloaded bytes
    usable_bytes: float = 0.0  # what the framework may use of one chip's HBM
    pcie_seconds: float = 0.0  # the offloaded bytes there and back, a step
    compute_seconds: float | None = None  # the step's FLOPs a chip at the chip's peak

    @property
    def fits(self):
        return self.per_chip["total"] <= self.usable_bytes


def compute_dtype(cfg, recipe):
    return "bfloat16" if recipe.weights == "bfloat16" else cfg.dtype


def _a_token(saved, act_bytes, tp, sequence_parallel):
    """Bytes a token of `saved` on one chip: tp splits what it splits, and under
    sequence parallelism the rest too."""
    if sequence_parallel:
        return saved_bytes(saved, act_bytes) / tp
    return saved_bytes(saved, act_bytes, tp)


def _per_chip(cfg, lv, copies, tokens):
    """(whole, per chip, host per chip, bytes over the host link a step) when `copies`
    chips share each weight shard and the batch's tokens: see the module's docstring."""
    tp, stages, sp = lv.tp, lv.stages, lv.sequence_parallel
    m = lv.microbatches or stages
    act_bytes = DTYPE_BYTES[compute_dtype(cfg, lv.recipe)]
    matrices, rest = split_params(cfg)
    whole, per_chip = {}, {}
    for part, size in lv.recipe.bytes_per_param(lv.accum).items():
        whole[part] = size * (matrices + rest)
        divide = copies if part in SHARDED[lv.shard] else 1
        per_chip[part] = size * (matrices / tp + rest) / divide / stages
    saved = saved_per_layer_per_token(cfg, lv.remat)
    micro = tokens / lv.accum  # the whole batch's tokens of one microbatch
    here = micro / copies / (m if stages > 1 else 1)  # one microbatch's, on one chip
    # After the layers: the final norm's input and output, E each (the last stage's).
    outside = 2 * cfg.embed * act_bytes
    whole["activations"] = (cfg.layers * saved_bytes(saved, act_bytes) + outside) * micro
    once = cfg.layers / stages * _a_token(saved, act_bytes, tp, sp) * here
    once += (outside / (tp if sp else 1)) * here if stages == 1 else 0
    in_flight = min(stages, m) if stages > 1 else 1  # 1F1B: stage 0 holds P microbatches
    per_chip["activations"] = in_flight * once
    # The logits and their gradient (over --loss-chunks chunks); or one layer's backward,
    # one set of its values alive at a time (XLA's CPU plan of the scanned step: 0.9-1.13
    # sets; roofline/README.md).
    logits = 2 * cfg.vocab * act_bytes / lv.loss_chunks
    full = saved_per_layer_per_token(cfg, "none")
    whole["transients"] = max(logits, saved_bytes(full, act_bytes)) * micro
    per_chip["transients"] = max(logits / tp, _a_token(full, act_bytes, tp, sp)) * here
    if lv.scan:  # the stacked copy and its gradient, the stage's share of them on each chip
        stacked = 2 * (layer_matrices(cfg) + 2 * cfg.layers * cfg.embed) * act_bytes
        whole["transients"] += stacked
        divide = copies if lv.shard == "params" else 1
        per_chip["transients"] += stacked / tp / stages / divide
    layer = layer_matrices(cfg) / cfg.layers / tp + 2 * cfg.embed  # its matrices, norms
    per_chip["gathered"] = 2 * layer * act_bytes if lv.shard == "params" else 0.0
    host, over_link = {}, 0.0
    if lv.offload == "optimizer":  # to the chip for the update, and back
        host["optimizer"], per_chip["optimizer"] = per_chip["optimizer"], 0.0
        over_link = 2 * host["optimizer"]
    elif lv.offload == "activations":  # out after each layer's forward, in for its backward
        host["activations"], per_chip["activations"] = per_chip["activations"], 0.0
        over_link = 2 * once * lv.accum * (m if stages > 1 else 1)
    per_chip["total"] = sum(per_chip.values())
    return whole, per_chip, host, over_link


def lever_problem(cfg, chip, lv):
    """Why these levers make no plan whatever the chip count, in one line, or None."""
    m = lv.microbatches
    checks = [
        (remat_problem(lv.remat, cfg), None),
        (lv.recipe.problem(), None),
        (model_problem(cfg, lv.tp, lv.stages), None),
        (lv.sequence_parallel and lv.tp == 1, "--sequence-parallel shards what tp copies: "
         "it needs --tp 2 or more"),
        (m and lv.stages == 1, f"--microbatches {m}: a pipeline's; give --pipeline-stages"),
        (lv.stages > 1 and lv.accum > 1, "--accum with --pipeline-stages: the pipeline's "
         "--microbatches are its accumulation"),
        (lv.offload and chip.platform == "cpu", f"--offload {lv.offload}: a CPU's memory is "
         "the host's, there is no separate device memory to offload from"),
    ]  # fmt: skip
    return next((why if isinstance(why, str) else say for why, say in checks if why), None)


def plan_memory(cfg, chip, *, chips=1, batch_tokens, usable=None, **levers):
    """The MemoryPlan of one training step of batch_tokens tokens (sequences of
    cfg.seq) on `chips` chips of `chip`; levers are Levers' fields. "Fits" is against
    `usable` bytes a chip: by default what JAX may use of it (roofline/memory.py
    usable_fraction). Activations in the compute dtype: bfloat16 with bfloat16
    weights, else cfg.dtype. ValueError, one line, for a plan the levers cannot make."""
    lv = Levers(**levers)
    if why := lever_problem(cfg, chip, lv):
        raise ValueError(why)
    if chips % (lv.tp * lv.stages):
        pipeline = f" x --pipeline-stages {lv.stages}" if lv.stages > 1 else ""
        raise ValueError(f"--tp {lv.tp}{pipeline} must divide --chips {chips}")
    m = lv.microbatches or lv.stages
    fixed = {"tp": lv.tp, "stages": lv.stages, "microbatches": m, "accum": lv.accum}
    layout = pick_layout(cfg, batch_tokens, chips, seq_shards=lv.seq_shards, **fixed)
    if why := chunks_problem(cfg, layout, batch_tokens, lv.loss_chunks):
        raise ValueError(why)
    usable = chip.hbm_bytes * usable_fraction(chip.platform) if usable is None else usable

    def total(copies, tokens):
        return _per_chip(cfg, lv, copies, tokens)[1]["total"]

    whole, per_chip, host, over_link = _per_chip(cfg, lv, layout.copies, batch_tokens)
    # Per chip, at a fixed batch, bytes = A + R / copies: R the state the stage divides
    # and the tokens' bytes, A the rest (the gathered layer, what no stage divides).
    once, twice = total(1, batch_tokens), total(2, batch_tokens)
    divided = 2 * (once - twice)
    kept = once - divided

    def accepted_and_fits(n):
        try:
            there = pick_layout(cfg, batch_tokens, n, seq_shards=lv.seq_shards, **fixed)
        except ValueError:
            return False
        good = not chunks_problem(cfg, there, batch_tokens, lv.loss_chunks)
        return good and total(there.copies, batch_tokens) <= usable

    min_chips = None
    if usable > kept:
        least = lv.tp * lv.stages * max(1, math.ceil(divided / (usable - kept)))
        min_chips = fewest_accepted(
            cfg, batch_tokens, least, lv.seq_shards, fixed, accepted_and_fits
        )
    max_batch = largest_batch_tokens(cfg, layout, lv.loss_chunks, usable, total)
    batch = batch_tokens // cfg.seq
    flops = train_flops(cfg, batch) + recompute_flops(cfg, batch, lv.remat)
    link = host_link(chip)
    peak = chip.peak(compute_dtype(cfg, lv.recipe)) if chip.flops else None
    return MemoryPlan(
        cfg, chip, chips, lv.tp, batch_tokens, lv.remat, lv.recipe, lv.shard, lv.accum,
        whole, per_chip, flops, saved_per_layer_per_token(cfg, lv.remat), min_chips,
        max_batch, layout, lv, host, usable, over_link / link[0] if link else 0.0,
        flops / chips / peak if peak else None,
    )  # fmt: skip


def chunks_problem(cfg, layout, batch_tokens, chunks):
    """--loss-chunks must divide each chip's tokens of a microbatch, or one line."""
    tokens = batch_tokens // (layout.copies * layout.accum * layout.microbatches)
    if tokens % chunks:
        return f"--loss-chunks {chunks}: must divide each chip's {tokens:,} tokens a microbatch"
    return None


def largest_batch_tokens(cfg, layout, chunks, usable, total):
    """The most tokens a step that fit on this layout: whole sequences, a multiple of
    accum x microbatches x replicas, each chip's share divisible by --loss-chunks."""
    unit = cfg.seq * layout.accum * layout.microbatches * layout.replicas
    fixed = total(layout.copies, 0)
    per_unit = total(layout.copies, unit) - fixed
    units = math.floor((usable - fixed) / per_unit) if usable > fixed else 0
    while units and (units * cfg.seq // layout.seq_shards) % chunks:
        units -= 1
    return units * unit

"""A training step's memory on N chips, on a napkin: what fills each chip's HBM, and
the levers that move it (python -m roofline memory).

Three kinds of bytes, each counted for the whole model and batch, then per chip:

    state        P parameters x bytes a parameter, by recipe:
                   params     the stored weights: float32 (4) or bfloat16 (2)
                   master     a float32 copy the optimizer updates (--master, bf16 weights): 4
                   grads      one gradient a parameter: 4 or 2; with --accum, a float32
                              running sum beside it (4 more)
                   optimizer  AdamW's m and v (2 x 4 or 2 x 2), SGD's momentum (1 x ...)
    activations  what the forward saves for the backward, per layer per token, by the
                 remat policy (jax.checkpoint around each layer):
                   none   what JAX's autodiff saves of our layer (saved_per_layer_per_token),
                          with attention's [S, S] scores, exponentials and probabilities
                          unless a flash kernel recomputes them
                   dots   the matmul outputs without batch dimensions (q, k, v, wo's,
                          w_in's and w_gate's; jax.checkpoint_policies.
                          dots_with_no_batch_dims_saveable) and the layer's input
                   block  the layer's input alone (nothing_saveable)
                   N      N tensors of [tokens, E] a layer: the scaling book's convention
    transients   the largest temporary, held apart: the logits and their gradient
                 [tokens, V], or one layer's backward, which holds about one set of
                 what the layer saves under none: those values' gradients (none), or
                 the values rebuilt, each gradient freed as the next op takes it
                 (remat); with the layers scanned (--scan-layers), their weights
                 stacked in the compute dtype, and that stack's gradient, beside it

Sharding: --tp T splits every weight matrix (the embedding's too) and the activations
with an H, K, F or S axis over T chips; the other chips = N / T hold data-parallel
replicas, over which --shard divides the state as ZeRO's stages do (Rajbhandari et al.
2020, Table 1): optimizer (stage 1: optimizer and master), gradients (stage 2: and the
gradients), params (stage 3, which is FSDP: and the weights). The batch's tokens split
over the replicas, and --accum N microbatches run one at a time, so activations and
transients are those of tokens / (N·replicas).

FLOPs: 6 a parameter a token plus attention (roofline/flops.py train_flops); remat
recomputes in the backward what it did not save: block, each layer's forward again
(about 8·B·P in all); dots, attention's score and value products, which have batch
dimensions and are not saved.

What the napkin leaves out, and the compiler's plan holds: the runtime's workspace,
fusion buffers, alignment, a compute-dtype copy of the weights, and the compiler's own
choices. A GPU's fusions keep less than JAX saves, recomputing cheap values such as a
norm's x·rsqrt and ReLU's output, and near the memory limit XLA rematerializes on its
own (roofline/README.md, "Training memory, on a napkin").
"""

import dataclasses
import math

from roofline.flops import param_count, train_flops
from roofline.plan.saved_activations import (
    layer_matrices,
    recompute_flops,
    remat_problem,
    saved_bytes,
    saved_per_layer_per_token,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
SHARDS = ("none", "optimizer", "gradients", "params")  # ZeRO's stages 0 to 3
STATE = ("params", "master", "grads", "optimizer")
# Which state each stage divides over the data-parallel replicas.
SHARDED = {
    "none": (),
    "optimizer": ("optimizer", "master"),
    "gradients": ("optimizer", "master", "grads"),
    "params": ("optimizer", "master", "grads", "params"),
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How each parameter is stored: weights, an optional float32 master copy, its
    gradient, the optimizer's state."""

    weights: str = "float32"
    master: bool = False
    grads: str = "float32"
    optimizer: str = "adamw"  # or "sgd": SGD with momentum
    optimizer_dtype: str = "float32"

    def problem(self):
        """Why this recipe makes no sense, or None."""
        if self.master and self.weights == "float32":
            return "--master keeps a float32 copy of bfloat16 weights: give --weights bfloat16"
        return None

    def bytes_per_param(self, accum=1):
        """{params, master, grads, optimizer}: bytes each parameter costs."""
        moments = 2 if self.optimizer == "adamw" else 1
        return {
            "params": DTYPE_BYTES[self.weights],
            "master": 4 if self.master else 0,
            "grads": DTYPE_BYTES[self.grads] + (4 if accum > 1 else 0),
            "optimizer": moments * DTYPE_BYTES[self.optimizer_dtype],
        }


# Three published conventions, as recipes, and the parts of the state each counts.
CONVENTIONS = {
    # The JAX scaling book ("How to Scale Your Model", training chapter): bf16 weights
    # and float32 Adam moments; no gradients, no master copy.
    "the scaling book (10)": (Recipe("bfloat16"), ("params", "optimizer")),
    # ZeRO (Rajbhandari et al. 2020, section 3.1): fp16 weights and gradients, float32
    # master, m and v: 2 + 2 + 12 = 16.
    "ZeRO (16)": (Recipe("bfloat16", True, "bfloat16"), STATE),
    # Megatron-LM's distributed optimizer: bf16 weights, float32 gradients, master, m, v.
    "Megatron-LM (18)": (Recipe("bfloat16", True, "float32"), STATE),
}


def split_params(cfg):
    """(matrices, the rest): parameters tensor parallelism splits (every matrix,
    the embedding and the untied unembedding too: sessions/shard/sharding.py) and
    those it copies onto each chip (norm scales, a learned position table)."""
    matrices = cfg.vocab * cfg.embed * (1 if cfg.tied else 2) + layer_matrices(cfg)
    return matrices, param_count(cfg) - matrices


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
    per_chip: dict  # the same on one chip, and total
    flops_per_step: int
    saved: dict  # saved_per_layer_per_token
    min_chips: int | None  # the fewest chips (a multiple of tp) that hold this batch; None: none
    max_batch_tokens: int  # the most tokens a step that fit on these chips (0: none)

    @property
    def fits(self):
        return self.per_chip["total"] <= self.chip.hbm_bytes


def _per_chip(cfg, chips, tp, tokens, remat, recipe, shard, accum, act_bytes, scan):
    """(whole, per chip) bytes: see the module's docstring."""
    replicas = chips // tp
    matrices, rest = split_params(cfg)
    whole, per_chip = {}, {}
    for part, size in recipe.bytes_per_param(accum).items():
        whole[part] = size * (matrices + rest)
        divide = replicas if part in SHARDED[shard] else 1
        per_chip[part] = size * (matrices / tp + rest) / divide
    saved = saved_per_layer_per_token(cfg, remat)
    micro = tokens / accum  # one microbatch's tokens are alive at a time
    # After the layers: the final norm's input and output, E each, on every tp chip.
    outside = 2 * cfg.embed
    layers = cfg.layers * micro
    whole["activations"] = layers * saved_bytes(saved, act_bytes) + outside * micro * act_bytes
    per_chip["activations"] = (
        layers * saved_bytes(saved, act_bytes, tp) + outside * micro * act_bytes
    ) / replicas
    # The logits and their gradient; or one layer's backward, one set of its values alive
    # at a time (XLA's CPU plan of the scanned step: 0.9-1.13 sets; roofline/README.md).
    logits = 2 * cfg.vocab * act_bytes
    full = saved_per_layer_per_token(cfg, "none")

    def layer(tp):  # one layer's values a token, on one chip
        return saved_bytes(full, act_bytes, tp)

    whole["transients"] = max(logits, layer(1)) * micro
    per_chip["transients"] = max(logits / tp, layer(tp)) * micro / replicas
    if scan:  # the stacked copy and its gradient, the stage's share of them on each chip
        stacked = 2 * (layer_matrices(cfg) + 2 * cfg.layers * cfg.embed) * act_bytes
        whole["transients"] += stacked
        per_chip["transients"] += stacked / tp / (replicas if shard == "params" else 1)
    per_chip["total"] = sum(per_chip.values())
    return whole, per_chip


def problem(cfg, chips, tp, batch_tokens, remat, recipe, accum):
    """Why these levers make no plan, in one line, or None."""
    if why := remat_problem(remat):
        return why
    if chips % tp:
        return f"--tp {tp} must divide --chips {chips}"
    sequences, parts = batch_tokens // cfg.seq, accum * (chips // tp)
    if batch_tokens % cfg.seq or sequences % parts:
        return (
            f"--batch-tokens {batch_tokens:,}: whole sequences of {cfg.seq:,}, as many as a "
            f"multiple of --accum x replicas ({accum} x {chips // tp})"
        )
    return recipe.problem()


def plan_memory(cfg, chip, *, chips=1, tp=1, batch_tokens, remat="none", recipe=Recipe(),
                shard="none", accum=1, scan=False):  # fmt: skip
    """The MemoryPlan of one training step of batch_tokens tokens (sequences of
    cfg.seq) on `chips` chips of `chip`. Activations in the compute dtype: bfloat16
    with bfloat16 weights, else cfg.dtype."""
    if why := problem(cfg, chips, tp, batch_tokens, remat, recipe, accum):
        raise ValueError(why)
    act_bytes = DTYPE_BYTES["bfloat16" if recipe.weights == "bfloat16" else cfg.dtype]

    def layout(n, tokens):
        return _per_chip(cfg, n, tp, tokens, remat, recipe, shard, accum, act_bytes, scan)

    whole, per_chip = layout(chips, batch_tokens)
    hbm = chip.hbm_bytes
    # Per chip, at a fixed batch, bytes = A + R / replicas: R the state the stage divides
    # and the activations (the tokens split over replicas), A the rest.
    once, twice = (layout(tp * r, batch_tokens)[1]["total"] for r in (1, 2))
    divided = 2 * (once - twice)
    kept = once - divided
    min_chips = tp * math.ceil(divided / (hbm - kept)) if hbm > kept else None
    # The largest batch on these chips: whole sequences, a multiple of accum x replicas.
    unit = cfg.seq * accum * (chips // tp)
    fixed = layout(chips, 0)[1]["total"]
    per_unit = layout(chips, unit)[1]["total"] - fixed
    units = math.floor((hbm - fixed) / per_unit) if hbm > fixed else 0
    batch = batch_tokens // cfg.seq
    flops = train_flops(cfg, batch) + recompute_flops(cfg, batch, remat)
    return MemoryPlan(
        cfg, chip, chips, tp, batch_tokens, remat, recipe, shard, accum, whole, per_chip,
        flops, saved_per_layer_per_token(cfg, remat), min_chips, units * unit,
    )  # fmt: skip

"""A training step's state, bytes a parameter by recipe, and how ZeRO's stages divide
it over the data-parallel copies (roofline/plan/training_memory.py counts the rest).

    params     the stored weights: float32 (4) or bfloat16 (2)
    master     a float32 copy the optimizer updates (--master, bf16 weights): 4
    grads      one gradient a parameter: 4 or 2; with --accum, a float32 running sum
               beside it (4 more)
    optimizer  AdamW's m and v (2 x 4 or 2 x 2), SGD's momentum (1 x ...)

--shard divides the state as ZeRO's stages do (Rajbhandari et al. 2020, Table 1):
optimizer (stage 1: optimizer and master), gradients (stage 2: and the gradients),
params (stage 3, which is FSDP: and the weights).
"""

import dataclasses

from roofline.flops import param_count
from roofline.plan.saved_activations import layer_matrices

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

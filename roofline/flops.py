"""Counting: parameters, FLOPs per training step, and what the napkin ignores.

The course's napkin: a matmul [B, E] @ [E, F] costs 2·B·E·F FLOPs (a multiply
and an add per weight per token). Its backward pass is two matmuls of the same
size (gradient w.r.t. the input and w.r.t. the weight), so a training step
costs 6 FLOPs per parameter per token: 6·B·P, with B the tokens in the step.
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1.)

That formula ignores attention's own matmuls, q·k and probs·v, which have no
parameters: per layer, forward, 2·B·S·S·H·D each (B sequences of S tokens).
"""

import functools
import math

import jax


def count_params(tree):
    """Number of scalars in a param tree (or a tree of ShapeDtypeStructs)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_count(cfg):
    """P for a ModelConfig, without building the params."""
    from sessions.model import init_params

    return count_params(jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0)))


def matmul_params(cfg):
    """Parameters that take part in a matmul, once per token: every weight
    matrix, and the embedding through the tied output projection. Norm scales
    and the positional table are added, not multiplied: no FLOPs to speak of."""
    E, F, H, D, V = cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.vocab
    per_layer = 2 * E * F + (4 * E * H * D if cfg.attention else 0)
    return cfg.layers * per_layer + V * E


def attention_flops(cfg, batch, causal_half=False):
    """Forward FLOPs of q·k^T and probs·v over all layers, for `batch` sequences.

    Counted in full by default: the einsum computes the whole [S, S] score
    matrix and masks half of it, and that is what XLA counts too. Some trainers
    halve it for the causal mask (causal_half=True)."""
    if not cfg.attention:
        return 0
    full = cfg.layers * 2 * (2 * batch * cfg.seq * cfg.seq * cfg.heads * cfg.head_dim)
    return full // 2 if causal_half else full


def napkin_train_flops(cfg, batch):
    """6·B·P with B = tokens in the step and P = all parameters."""
    return 6 * batch * cfg.seq * param_count(cfg)


def train_flops(cfg, batch, causal_half=False):
    """The exact matmul count of one training step: 6 per matmul weight per
    token, plus attention's forward and its two-matmul backward (3x)."""
    tokens = batch * cfg.seq
    return 6 * tokens * matmul_params(cfg) + 3 * attention_flops(cfg, batch, causal_half)


def forward_flops(cfg, batch, causal_half=False):
    """One forward pass (inference, prefill): 2 per matmul weight per token plus attention."""
    return 2 * batch * cfg.seq * matmul_params(cfg) + attention_flops(cfg, batch, causal_half)

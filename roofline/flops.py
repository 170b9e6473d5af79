"""Counting: parameters, FLOPs and bytes per training step, and what the napkin ignores.

The course's napkin: a matmul [B, E] @ [E, F] costs 2·B·E·F FLOPs (a multiply
and an add per weight per token). Its backward pass is two matmuls of the same
size (gradient w.r.t. the input and w.r.t. the weight), so a training step
costs 6 FLOPs per parameter per token: 6·B·P, with B the tokens in the step.
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1.)

That formula ignores attention's own matmuls, q·k and probs·v, which have no
parameters: per layer, forward, 2·B·S·S·H·D each (B sequences of S tokens).
Grouped-query attention (K key/value heads shared by the H query heads) changes
the parameters of wk and wv, E·K·D each, and not these: every query head still
scores every key, H of them whatever K.

Bytes are counted the same way, as a lower bound: what a step must read and
write at least once (weights, gradients, optimizer state, activations kept for
the backward pass), however cleverly the compiler fuses everything else.
"""

import math
from typing import NamedTuple

import jax

# Attention kernels that recompute the [B, H, S, T] probabilities in the backward
# pass instead of keeping them (flash attention: cuDNN's, Pallas splash, ours).
FLASH_KERNELS = ("cudnn", "splash", "pallas")


def count_params(tree):
    """Number of scalars in a param tree (or a tree of ShapeDtypeStructs)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_count(cfg):
    """P for a ModelConfig, counted from its shapes (sessions/model/transformer.py's params):

    embedding V·E (tied: also the output projection; untied: V·E more for it),
    learned positions S·E (rotary positions have none),
    per layer: q, o 2·E·H·D, k, v 2·E·K·D and a norm scale E (with attention),
               w_in, w_out 2·E·F (gated: w_gate, E·F more) and a norm scale E,
    final norm scale E."""
    E, V = cfg.embed, cfg.vocab
    per_layer = mlp_matrices(cfg) + E + ((attention_matrices(cfg) + E) if cfg.attention else 0)
    positions = cfg.seq * E if position_table(cfg) else 0
    unembed = 0 if cfg.tied else V * E
    return V * E + unembed + positions + cfg.layers * per_layer + E


def attention_matrices(cfg):
    """One layer's attention weights: wq and wo E·H·D each, wk and wv E·K·D each."""
    E, H, K, D = cfg.embed, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    return 2 * E * H * D + 2 * E * K * D


def mlp_matrices(cfg):
    """One layer's MLP weights: w_in and w_out E·F each, and w_gate when gated."""
    return (3 if cfg.gated else 2) * cfg.embed * cfg.ff


def position_table(cfg):
    """Whether the model holds a table of positions: positions on, and not rotary."""
    return cfg.positions and not cfg.rope


def model_line(cfg, *, length="S", vocab=True):
    """A model's shapes in one line, as every report prints them:
    'L=4 E=128 F=512 H=2 D=64 S=128 V=256' (layers, embedding, feed-forward,
    heads, head dimension, sequence, vocabulary). length: the letter for
    cfg.seq ("S" a training sequence, "T" decode's cache positions), or None
    to leave it out; vocab=False leaves V out. Session 5's switches follow
    where set: 'K=1' (key/value heads, when fewer than H), rope, gated, untied."""
    parts = [
        f"L={cfg.layers}",
        f"E={cfg.embed}",
        f"F={cfg.ff}",
        f"H={cfg.heads}",
        f"D={cfg.head_dim}",
    ]
    if cfg.n_kv_heads != cfg.heads:
        parts.append(f"K={cfg.n_kv_heads}")
    if length:
        parts.append(f"{length}={cfg.seq}")
    if vocab:
        parts.append(f"V={cfg.vocab}")
    switches = {"rope": cfg.positions and cfg.rope, "gated": cfg.gated, "untied": not cfg.tied}
    return " ".join(parts + [name for name, on in switches.items() if on])


def flash_kernel(cfg):
    """True if attention runs in a flash kernel, which keeps no probabilities."""
    return cfg.attention_impl in FLASH_KERNELS


def matmul_params(cfg):
    """Parameters that take part in a matmul, once per token: every weight
    matrix, and the output projection V·E (the tied embedding, or the untied
    unembed). Norm scales, the positional table and an untied embedding's
    table are added or looked up, not multiplied: no FLOPs to speak of."""
    per_layer = mlp_matrices(cfg) + (attention_matrices(cfg) if cfg.attention else 0)
    return cfg.layers * per_layer + cfg.vocab * cfg.embed


def attention_flops(cfg, batch, causal_half=False):
    """Forward FLOPs of q·k^T and probs·v over all layers, for `batch` sequences:
    H heads, whatever K (each query head scores every key on its own).

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


class StepBytes(NamedTuple):
    """Bytes one training step must move at least, by what they hold."""

    weights: int  # the float32 master weights, read once for the forward pass
    gradients: int  # one float32 gradient per parameter, written once
    optimizer: int  # AdamW's update: reads weights, gradients, m, v; writes weights, m, v
    activations: int  # tensors kept for the backward pass: written once, read once

    @property
    def total(self):
        return self.weights + self.gradients + self.optimizer + self.activations


def activations_per_token(cfg):
    """Values each token keeps for the backward pass, without recomputation.

    The backward pass of y = x @ W needs x (for W's gradient); a nonlinearity
    needs its input. Per layer, the course's model keeps:
        attention: the normed input E; q H·D, k and v K·D each; the heads' output H·D
        MLP:       the normed input E; ReLU's input F and output F
                   (gated: SiLU's input F, x·w_in F and their product F)
    and after the last layer the final normed stream E. Rotary positions keep
    nothing more: the rotation is linear, with angles recomputed from the
    positions, so its backward needs only q's and k's gradients. The score matrix
    (H·S per token) and the logits (V per token) are counted apart, in
    `train_bytes`: the scores exist only without a flash kernel."""
    E, F, H, K, D = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    attention = E + 2 * H * D + 2 * K * D if cfg.attention else 0
    mlp = E + (3 if cfg.gated else 2) * F
    return cfg.layers * (attention + mlp) + E


def train_bytes(cfg, batch, opt_states=2):
    """A lower bound on the bytes one training step moves to and from memory.

    Parameters (P of them, float32): read once for the forward pass (4·P),
    gradients written once (4·P), and AdamW (opt_states=2 moments) reading
    weights, gradients and both moments and writing weights and both moments
    (7 arrays: 28·P). 36 bytes per parameter in all.

    Activations (compute dtype, cfg.dtype): `activations_per_token` values per
    token, plus the softmax probabilities [B, H, S, S] unless attention runs in
    a flash kernel (cuDNN's, Pallas splash), which recomputes them instead, plus
    the logits [B, S, V] (compute dtype too: sessions/model/transformer.py's unembed); each
    written in the forward pass and read in the backward pass (x2).

    Everything else a compiler might spill between kernels is not counted:
    that is what makes this a lower bound. XLA's own count
    (`compiled.cost_analysis()["bytes accessed"]`) adds every operand of every
    kernel and is usually several times larger."""
    P = param_count(cfg)
    param_bytes = 4  # float32 master weights (sessions/model/transformer.py)
    act_bytes = 2 if cfg.dtype == "bfloat16" else 4
    tokens = batch * cfg.seq
    kept = tokens * activations_per_token(cfg) * act_bytes
    if cfg.attention and not flash_kernel(cfg):
        kept += cfg.layers * batch * cfg.heads * cfg.seq * cfg.seq * act_bytes
    kept += tokens * cfg.vocab * act_bytes
    return StepBytes(
        weights=param_bytes * P,
        gradients=param_bytes * P,
        optimizer=param_bytes * P * (2 + 2 * opt_states + 1),
        activations=2 * kept,
    )


class Ledger(NamedTuple):
    """The FLOPs of one training step, counted each way trainers count them."""

    tokens: int  # B: tokens in the step
    params: int  # P: every parameter
    matmul_params: int  # parameters that multiply a token (the tied embedding once)
    kaplan_params: int  # Kaplan et al.'s N: no embedding (nor unembedding) or positional ones
    napkin: int  # 6·B·P
    kaplan: int  # 6·B·N
    matmul: int  # 6·B·P_matmul, attention left out
    attention_full: int  # attention's training FLOPs, whole score matrix (3x forward)
    attention_causal: int  # ... only the unmasked half
    exact: int  # matmul + attention_full: what XLA computes, and what s2_train reports
    exact_causal: int  # matmul + attention_causal
    forward: int  # one forward pass (inference prefill), attention in full
    forward_causal: int


def ledger(cfg, batch):
    """Every count of one training step of `batch` sequences, side by side."""
    tokens = batch * cfg.seq
    P, Pm = param_count(cfg), matmul_params(cfg)
    vocabulary = cfg.vocab * cfg.embed * (1 if cfg.tied else 2)
    N = P - vocabulary - (cfg.seq * cfg.embed if position_table(cfg) else 0)
    full, causal = 3 * attention_flops(cfg, batch), 3 * attention_flops(cfg, batch, True)
    return Ledger(
        tokens=tokens,
        params=P,
        matmul_params=Pm,
        kaplan_params=N,
        napkin=6 * tokens * P,
        kaplan=6 * tokens * N,
        matmul=6 * tokens * Pm,
        attention_full=full,
        attention_causal=causal,
        exact=6 * tokens * Pm + full,
        exact_causal=6 * tokens * Pm + causal,
        forward=forward_flops(cfg, batch),
        forward_causal=forward_flops(cfg, batch, causal_half=True),
    )


def ledger_lines(cfg, batch):
    """The ledger as text: each count, how far it is from 6·B·P, and why."""
    g = ledger(cfg, batch)
    scale, unit = (1e12, "TFLOP") if g.napkin >= 1e12 else (1e9, "GFLOP")

    def row(label, flops, why, against_napkin=True):
        change = f"{100 * (flops / g.napkin - 1):+.1f}%" if against_napkin else ""
        return f"  {label:<34}{flops / scale:>10,.3f} {unit} {change:>7}  {why}"

    non_matmul = g.params - g.matmul_params
    lines = [
        f"FLOPs per training step: B = {g.tokens:,} tokens ({batch} x {cfg.seq}), "
        + f"P = {g.params:,} parameters",
        row("6·B·P, every parameter", g.napkin, "the napkin", against_napkin=False),
        row("6·B·N, Kaplan's N", g.kaplan, "no embedding or positional parameters"),
        row(
            "6·B·P_matmul, matmul weights only",
            g.matmul,
            f"{non_matmul:,} norm scales and positional values multiply nothing"
            + ("" if cfg.tied else ", nor the untied embedding's lookup table"),
        ),
        row(
            "+ attention, full score matrix",
            g.exact,
            "exact: q·k and probs·v over all S x S, as XLA computes them",
        ),
        row(
            "+ attention, causal half",
            g.exact_causal,
            "only the unmasked half (some trainers' convention)",
        ),
        row(
            "forward only (inference prefill)",
            g.forward,
            "a third of exact: no backward",
            against_napkin=False,
        ),
    ]
    if cfg.attention:
        lines.append(
            f"  attention is {100 * g.attention_full / g.exact:.1f}% of the exact count; "
            + "it grows with S (12·L·H·D·S per token against 6·P_matmul)"
        )
    return lines

"""Training FLOPs: 6·B·P, attention's share, and MFU.

A matmul's forward pass costs 2 FLOPs per weight per token (a multiply and
an add); its backward pass is two matmuls of the same size (the gradient
with respect to the input, and with respect to the weight). So a training
step costs about 6·B·P FLOPs, B being the tokens in the step and P the
parameters (Kaplan et al. 2020, section 2.1). Attention's q·k and probs·v
have no parameters, so 6·B·P misses them; their share grows with S.

MFU (model FLOPs utilisation) = model FLOPs per second / peak FLOP/s of the
chips (Chowdhery et al. 2022, "PaLM", appendix B).
"""

import functools
import math

import jax

from sessions.model import init_params


def param_count(cfg):
    """P: the number of scalars in init_params(cfg, key), an int.

    Hint: jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    gives the param tree as shapes only, no memory; add up math.prod(x.shape).
    """
    raise NotImplementedError


def train_flops(cfg, batch):
    """6·B·P for one training step of `batch` sequences of cfg.seq tokens.

    B = batch * cfg.seq tokens; P = param_count(cfg).
    """
    raise NotImplementedError


def attention_flops(cfg, batch):
    """Attention's own training FLOPs in one step (zero when cfg.attention is False).

    Forward, per layer: q·k^T [B, H, S, T] and probs·v each cost
    2·batch·S·S·H·D (the whole S x S score matrix is computed, half of it
    then masked); the backward pass costs twice the forward. So:
    3 · layers · 2 · (2·batch·S·S·H·D), with S = cfg.seq, H = cfg.heads,
    D = cfg.head_dim.
    """
    raise NotImplementedError


def attention_share(cfg, batch):
    """Attention's fraction of a step: attention_flops / (train_flops + attention_flops).

    A number between 0 and 1; it grows with cfg.seq (attention is S² per
    sequence, the rest S).
    """
    raise NotImplementedError


def mfu(flops_per_step, step_s, peak_flops, chips=1):
    """Model FLOPs utilisation: flops_per_step / step_s / (chips * peak_flops).

    flops_per_step: the model's FLOPs in one step, over all chips (e.g. 6·B·P
    plus attention); step_s: measured seconds per step; peak_flops: one
    chip's peak FLOP/s (roofline/hardware.py). A number between 0 and 1.
    """
    raise NotImplementedError

"""What one layer keeps for the backward, and what the backward rebuilds, by remat
policy: the activations term of a training step's memory (roofline/plan/training_memory.py)
and its recompute FLOPs.

The policies are jax.checkpoint's around each layer (sessions/model/transformer.py REMAT):
    none   what JAX's autodiff saves of our layer (saved_per_layer_per_token), with
           attention's [S, S] scores, exponentials and probabilities unless a flash
           kernel recomputes them
    dots   the matmul outputs without batch dimensions (q, k, v, wo's, w_in's and
           w_gate's; jax.checkpoint_policies.dots_with_no_batch_dims_saveable) and the
           layer's input
    block  the layer's input alone (nothing_saveable)
    N      N tensors of [tokens, E] a layer: the scaling book's convention
"""

from roofline.flops import attention_flops, flash_kernel, mlp_matrices

POLICIES = ("none", "dots", "block")


def remat_problem(remat):
    """Why `remat` names no policy the napkin knows, in one line, or None."""
    if remat in POLICIES or (isinstance(remat, int) and remat > 0):
        return None
    return f"--remat {remat}: one of {', '.join(POLICIES)}, or N tensors of [tokens, E] a layer"


def layer_matrices(cfg):
    """The L layers' weight matrices: attention's q, k, v, o and the MLP's."""
    E, H, K, D = cfg.embed, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    attention = 2 * E * (H + K) * D if cfg.attention else 0
    return cfg.layers * (attention + mlp_matrices(cfg))


def saved_per_layer_per_token(cfg, remat):
    """{tensor: (values a token, split by tp, bytes a value or None for the compute
    dtype's)} one layer keeps for the backward. remat: 'none', 'dots', 'block', or an
    int N (N tensors of E).

    none is what JAX's autodiff keeps of our layer (print_saved_residuals lists it),
    each buffer once: each norm's input, its statistics (2 a token), its input times
    the statistic and its output (in bf16, the input's float32 copy too); q, k, v and
    the heads' output; without a flash kernel, the causal mask (bool), the scores, their
    exponentials and the probabilities, H·S each, and two sums a head; ReLU's mask
    (bool) and output (gated: 6 tensors of F). Each float32 buffer counts 4 bytes in
    any compute dtype."""
    E, F, H, K, D, S = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    if isinstance(remat, int):
        return {f"{remat} x [tokens, E]": (remat * E, False, None)}
    saved = {"the layer's input": (E, False, None)}
    if remat == "block":
        return saved
    gate = {"w_gate's output": (F, True, None)} if cfg.gated else {}
    if remat == "dots":
        if cfg.attention:
            saved |= {"q": (H * D, True, None), "k and v": (2 * K * D, True, None)}
            saved["wo's output"] = (E, False, None)
        return saved | {"w_in's output": (F, True, None), **gate}
    # A norm runs in float32 (rms_norm): its statistics and x·rsqrt are float32 whatever
    # the compute dtype, and below float32 its input's float32 copy is a buffer of its own.
    norm = {"statistics": (2, False, 4), "x·rsqrt": (E, False, 4), "output": (E, False, None)}
    if cfg.dtype != "float32":
        norm["input in float32"] = (E, False, 4)
    if cfg.attention:
        saved |= {f"the attention norm's {name}": t for name, t in norm.items()}
        saved |= {"q": (H * D, True, None), "k and v": (2 * K * D, True, None)}
        if not flash_kernel(cfg):  # the softmax runs in float32 too, its output cast back
            saved["the causal mask (bool)"] = (H * S, True, 1)
            saved["scores and exp (float32)"] = (2 * H * S, True, 4)
            saved["probabilities"] = (H * S, True, None)
            saved["the softmax's sums (float32)"] = (2 * H, True, 4)
        saved["the heads' output"] = (H * D, True, None)
        saved["the stream into the MLP's norm"] = (E, False, None)
    saved |= {f"the MLP norm's {name}": t for name, t in norm.items()}
    if cfg.gated:
        return saved | {"w_in, w_gate, SiLU's 3, their product": (6 * F, True, None)}
    return saved | {"ReLU's mask (bool)": (F, True, 1), "ReLU's output": (F, True, None)}


def saved_bytes(saved, act_bytes, tp=1):
    """Bytes a token keeps on one chip: the split tensors divided by tp."""
    return sum(n * (size or act_bytes) / (tp if split else 1) for n, split, size in saved.values())


def recompute_flops(cfg, batch, remat):
    """FLOPs the backward spends rebuilding what remat did not save (batch sequences)."""
    if remat == "none":
        return 0
    if remat == "dots":  # the score and value products: batch dimensions, never saved
        return attention_flops(cfg, batch)
    return 2 * batch * cfg.seq * layer_matrices(cfg) + attention_flops(cfg, batch)

"""What one layer keeps for the backward, and what the backward rebuilds, by remat
policy: the activations term of a training step's memory (roofline/plan/training_memory.py)
and its recompute FLOPs.

The policies are jax.checkpoint's around each layer (sessions/model/remat.py defines them
for the step; the napkin knows them by name, as roofline imports nothing from sessions):
    none        no jax.checkpoint: what JAX's autodiff saves of our layer (NONE below),
                attention's [S, S] scores, exponentials and probabilities among them
                unless a flash kernel recomputes them
    dots        the outputs of matmuls without batch dimensions, and the layer's input
                (jax.checkpoint_policies.dots_with_no_batch_dims_saveable): q, k, v, wo's,
                w_in's and w_gate's outputs, the same bytes and rebuilding as minimal
    block       the layer's input alone (nothing_saveable): MaxText's full
    minimal, save_dot_except_mlp, save_qkv_proj, full
                MaxText's, by the names they save (SAVED_BY_NAME)
    selective   Korthikanti et al. 2022's selective recompute: everything but the [S, S]
    names:a,b   the layer's input and the tensors named a, b (jax.checkpoint_policies.
                save_only_these_names)
    N           N tensors of [tokens, E] a layer: the scaling book's convention

Under a policy, the backward reads what it reads without one (READ below); each value it
reads is kept if the policy saves it (or it is the layer's input, jax.checkpoint's
argument), else rebuilt from the values its op reads, kept or rebuilt in turn. So a name
a policy saves costs bytes only where the backward needs it: mlpwo (w_out's output, added
to the stream) never, out_proj only to rebuild the stream into the MLP's norm. The
rebuilt ops are the recompute: w_out's matmul is never among them, so even block rebuilds
the layer's forward less w_out (XLA's count of the scanned step agrees, tests/test_remat.py).
Attention's probabilities have no name and are always rebuilt from q and k; a flash kernel
(cudnn, splash, pallas) re-runs its whole forward, as its log-sum-exp has no name either.
"""

from roofline.flops import flash_kernel, mlp_matrices

COURSE_POLICIES = ("none", "dots", "block")
# The names MaxText's policies save (src/maxtext/layers/decoders.py, get_remat_policy;
# sessions/model/remat.py quotes it); selective's are Korthikanti et al.'s kept tensors.
QKV = ("query_proj", "key_proj", "value_proj")
MLP_IN = ("mlpwi", "mlpwi_0", "mlpwi_1")
KORTHIKANTI = ("attention_norm", *QKV, "context", "attention_residual", "mlp_norm")  # and MLP's
SAVED_BY_NAME = {
    "dots": (*QKV, "out_proj", *MLP_IN, "mlpwo"),  # the matmuls' outputs (q, k before RoPE)
    "block": (),
    "minimal": (*QKV, "out_proj", *MLP_IN, "mlpwo"),
    "save_dot_except_mlp": (*QKV, "out_proj"),
    "save_qkv_proj": QKV,
    "full": (),
    "selective": (*KORTHIKANTI, *MLP_IN, "mlp_activation"),
}
POLICIES = (*COURSE_POLICIES, *(p for p in SAVED_BY_NAME if p not in COURSE_POLICIES))
NAMES = "names:"
# Every name any of our layers gives (named_tensors: gated or not), for remat_problem.
ALL_NAMES = ("decoder_layer_input", "attention_norm", *QKV, "context", "out_proj")
ALL_NAMES += ("attention_residual", "mlp_norm", *MLP_IN, "mlp_activation", "mlpwo")
# The scaling book's tensors a layer (jax-ml.github.io/scaling-book/transformers,
# "Gradient checkpointing"): about 20 kept with no remat, 7 the big matmuls' outputs
# (rebuilding the rest of attention), 1 the layer's input (block: the whole forward).
BOOK_ALL, BOOK_MATMULS = 20, 7


def named_tensors(cfg):
    """{name: (values a token, split by tp)} of the tensors the layer of cfg names
    (checkpoint_name, sessions/model/transformer.py), in the order the forward makes them."""
    E, F, H, K, D = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    named = {"decoder_layer_input": (E, False)}
    if cfg.attention:
        named |= {"attention_norm": (E, False), "query_proj": (H * D, True)}
        named |= {"key_proj": (K * D, True), "value_proj": (K * D, True)}
        named |= {"context": (H * D, True), "out_proj": (E, False)}
        named |= {"attention_residual": (E, False)}
    named["mlp_norm"] = (E, False)
    named |= dict.fromkeys(("mlpwi_0", "mlpwi_1") if cfg.gated else ("mlpwi",), (F, True))
    return named | {"mlp_activation": (F, True), "mlpwo": (E, False)}


def layer_ops(cfg):
    """The layer's forward as ops on its named tensors: (outputs, inputs, FLOPs a token,
    whether its backward reads its inputs). The probabilities and a flash kernel's
    log-sum-exp have no name: rebuilt whenever the backward reads them."""
    E, F, H, K, D, S = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    stream = "decoder_layer_input"
    ops = []
    if cfg.attention:
        ops += [(("attention_norm",), (stream,), 0, True)]
        ops += [((n,), ("attention_norm",), 2 * E * h * D, True) for n, h in zip(QKV, (H, K, K))]
        if flash_kernel(cfg):  # one kernel; its backward reads its output and log-sum-exp
            ops += [(("context", "log-sum-exp"), QKV, 4 * S * H * D, True)]
        else:  # q·k, the softmax, then p·v: each 2·S·H·D a token over the whole [S, S]
            ops += [(("probabilities",), QKV[:2], 2 * S * H * D, True)]
            ops += [(("context",), ("probabilities", "value_proj"), 2 * S * H * D, True)]
        ops += [(("out_proj",), ("context",), 2 * H * D * E, True)]
        ops += [(("attention_residual",), (stream, "out_proj"), 0, False)]
        stream = "attention_residual"
    ops += [(("mlp_norm",), (stream,), 0, True)]
    ins = ("mlpwi_0", "mlpwi_1") if cfg.gated else ("mlpwi",)
    ops += [((n,), ("mlp_norm",), 2 * E * F, True) for n in ins]
    ops += [(("mlp_activation",), ins, 0, True), (("mlpwo",), ("mlp_activation",), 2 * F * E, True)]
    return ops


def kept_and_rebuilt(cfg, saved):
    """(the names kept, the ops rebuilt) when the policy saves the names `saved`."""
    ops = layer_ops(cfg)
    made_by = {name: op for op in ops for name in op[0]}
    wanted = [name for outputs, inputs, _, reads in ops if reads for name in inputs]
    if flash_kernel(cfg) and cfg.attention:
        wanted += ["context", "log-sum-exp"]
    kept, rebuilt = set(), []
    while wanted:
        name = wanted.pop()
        if name in saved or name == "decoder_layer_input":
            kept.add(name)
        elif made_by[name] not in rebuilt:
            rebuilt.append(made_by[name])
            wanted += made_by[name][1]
    return [n for n in named_tensors(cfg) if n in kept], rebuilt


def chosen(remat):
    """The names a policy saves: SAVED_BY_NAME's, or those `names:a,b` lists."""
    if remat in SAVED_BY_NAME:
        return SAVED_BY_NAME[remat]
    return tuple(remat.removeprefix(NAMES).split(","))


def remat_problem(remat, cfg=None):
    """Why `remat` names no policy the napkin knows, in one line, or None. The names of
    `names:a,b` are checked against cfg's layer, or any of our layers' without cfg."""
    if remat in POLICIES or (isinstance(remat, int) and remat > 0):
        return None
    known = tuple(named_tensors(cfg)) if cfg else ALL_NAMES
    if isinstance(remat, str) and remat.startswith(NAMES):
        unknown = [name for name in chosen(remat) if name not in known]
        if not unknown:
            return None
        return f"--remat {remat}: no tensor is named {', '.join(unknown)} ({', '.join(known)})"
    return (
        f"--remat {remat}: one of {', '.join(POLICIES)}, names:a,b of {', '.join(known)}, "
        "or N tensors of [tokens, E] a layer"
    )


def layer_matrices(cfg):
    """The L layers' weight matrices: attention's q, k, v, o and the MLP's."""
    E, H, K, D = cfg.embed, cfg.heads, cfg.n_kv_heads, cfg.head_dim
    attention = 2 * E * (H + K) * D if cfg.attention else 0
    return cfg.layers * (attention + mlp_matrices(cfg))


def saved_per_layer_per_token(cfg, remat):
    """{tensor: (values a token, split by tp, bytes a value or None for the compute
    dtype's)} one layer keeps for the backward. remat: a policy of POLICIES, names:a,b,
    or an int N (N tensors of E)."""
    if isinstance(remat, int):
        return {f"{remat} x [tokens, E]": (remat * cfg.embed, False, None)}
    if remat == "none":
        return none_saved(cfg)
    named = named_tensors(cfg)
    kept, _ = kept_and_rebuilt(cfg, chosen(remat))
    return {name: (*named[name], None) for name in kept}


def none_saved(cfg):
    """What JAX's autodiff keeps of our layer without remat (print_saved_residuals lists
    it), each buffer once: each norm's statistics (2 a token), its input times the
    statistic and its input (in float32: below it, only the input's float32 copy is
    kept) and output; q, k, v and the heads' output; without a flash kernel, the causal
    mask (bool), the scores, their exponentials and the probabilities, H·S each, and two
    sums a head; with one, its log-sum-exp (H, float32) and, for the heads-first kernels
    (splash, pallas), their copies of q, k and v (k and v repeated to the H heads) and of
    the output; ReLU's mask (bool) and output (gated: 6 tensors of F). Each float32
    buffer counts 4 bytes in any compute dtype."""
    E, F, H, K, D, S = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    # A norm runs in float32 (rms_norm): its statistics and x·rsqrt are float32 whatever
    # the compute dtype; below float32 its input's float32 copy is what the backward
    # reads, and the input itself is not kept.
    norm = {"statistics": (2, False, 4), "x·rsqrt": (E, False, 4), "output": (E, False, None)}
    if cfg.dtype == "float32":
        norm["input"] = (E, False, None)
    else:
        norm["input in float32"] = (E, False, 4)
    saved = {}
    if cfg.attention:
        saved |= {f"the attention norm's {name}": t for name, t in norm.items()}
        saved |= {"q": (H * D, True, None), "k and v": (2 * K * D, True, None)}
        if not flash_kernel(cfg):  # the softmax runs in float32 too, its output cast back
            saved["the causal mask (bool)"] = (H * S, True, 1)
            saved["scores and exp (float32)"] = (2 * H * S, True, 4)
            saved["probabilities"] = (H * S, True, None)
            saved["the softmax's sums (float32)"] = (2 * H, True, 4)
        else:
            saved["the kernel's log-sum-exp (float32)"] = (H, True, 4)
            if cfg.attention_impl != "cudnn":  # heads first: its own q, k, v and output
                saved["the kernel's q, k, v and output"] = (4 * H * D, True, None)
                del saved["q"], saved["k and v"]
        saved["the heads' output"] = (H * D, True, None)
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
    if isinstance(remat, int):
        return book_recompute(cfg, batch, remat)
    _, rebuilt = kept_and_rebuilt(cfg, chosen(remat))
    return cfg.layers * batch * cfg.seq * sum(flops for _, _, flops, _ in rebuilt)


def book_recompute(cfg, batch, n):
    """--remat N's recompute, by the scaling book's three points: N = 1 rebuilds what
    block does, N = 7 (the big matmuls' outputs) what dots does (the rest of attention),
    N = 20 nothing; linear in N between them. A convention of the napkin: N names no
    tensors, so no compiler can check it."""
    block, dots = recompute_flops(cfg, batch, "block"), recompute_flops(cfg, batch, "dots")
    if n < BOOK_MATMULS:
        return block - (block - dots) * (n - 1) / (BOOK_MATMULS - 1)
    return dots * max(0, BOOK_ALL - n) / (BOOK_ALL - BOOK_MATMULS)

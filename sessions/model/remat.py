"""What a layer keeps for the backward (session 6): the names the layer gives its tensors,
and the remat policies by what they save (remat() applies them).

Without remat, JAX keeps every value of the layer's forward that its backward reads. Under
jax.checkpoint with a policy it keeps the layer's input and what the policy saves, and
re-runs the rest of the layer's forward inside the backward. The layer names its tensors
with jax.ad_checkpoint.checkpoint_name (transformer.py), MaxText's names where MaxText has
one, so that a policy can save them by name (jax.checkpoint_policies.save_only_these_names;
`--remat names:a,b`). A name only marks a value: outside jax.checkpoint it is the identity
and compiles to nothing. In the order the forward makes them, a token's values:

    decoder_layer_input  x [B, S, E], the layer's input: jax.checkpoint's argument, kept always
    attention_norm       rms_norm(x) [B, S, E], q's, k's and v's input            (ours)
    query_proj           q [B, S, H, D], after RoPE
    key_proj, value_proj k, v [B, S, K, D], k after RoPE
    context              the heads' output [B, S, H, D], wo's input
    out_proj             wo's output [B, S, E]
    attention_residual   x + out_proj [B, S, E], the MLP norm's input             (ours)
    mlp_norm             its rms_norm [B, S, E], the MLP's input                  (ours)
    mlpwi                w_in's output [B, S, F], ReLU's input
    mlpwi_0, mlpwi_1     gated: w_gate's and w_in's outputs [B, S, F] (mlpwi_0 goes through SiLU)
    mlp_activation       relu(mlpwi), or silu(mlpwi_0) * mlpwi_1 [B, S, F], w_out's input (ours)
    mlpwo                w_out's output [B, S, E]

MaxText's names: query_proj, key_proj, value_proj, out_proj (src/maxtext/layers/attentions.py,
q and k named after RoPE), context (src/maxtext/layers/attention_op.py: the attention's
output), mlpwi, mlpwi_0, mlpwi_1, mlpwo (src/maxtext/layers/linears.py, MlpBlock) and
decoder_layer_input (src/maxtext/models/llama2.py); at MaxText e591f30. The names marked
ours are tensors MaxText leaves unnamed: the norms' outputs, the stream between the
attention and the MLP, and the MLP's activation, the values Korthikanti et al. 2022 keep.
Attention's [S, S] scores and probabilities have no name: no policy by name saves them.
"""

import jax

# The policies of the course, each a jax.checkpoint policy around the layer:
#   none   no jax.checkpoint: everything the backward reads (MaxText has no such policy;
#          its layers are always under nn.remat)
#   dots   the outputs of matmuls without batch dimensions: q, k, v (before RoPE), wo's,
#          w_in's, w_gate's; the same bytes as MaxText's minimal (RoPE's turn aside)
#   block  the layer's input alone (nothing_saveable): MaxText's full
COURSE = ("none", "dots", "block")
# MaxText's own, by the names they save (src/maxtext/layers/decoders.py at e591f30,
# Decoder.minimal_policy and Decoder.get_remat_policy):
#       elif cfg.remat_policy == "minimal":
#         # save all except context
#         policy = self.minimal_policy()  # save_only_these_names("query_proj",
#             # "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj", "mlpwi_0",
#             # "mlpwi_1", "mlpwi", "mlpwo")
#       elif cfg.remat_policy == "save_dot_except_mlp":
#         policy = jax.checkpoint_policies.save_only_these_names(
#             "query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj",
#         )
#       elif cfg.remat_policy == "save_qkv_proj":
#         policy = jax.checkpoint_policies.save_only_these_names(
#             "query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj",
#         )
#       else:
#         assert cfg.remat_policy == "full", "Remat policy needs to be on list of remat policies"
#         policy = None  # nn.remat(..., policy=None): nothing saved but the layer's input
# kv_proj and qkv_proj name fused projections our layer does not have: left out.
# selective is Korthikanti et al. 2022's selective recompute ("Reducing Activation
# Recomputation in Large Transformer Models", section 4.3): everything but attention's
# [S, S] values (scores, softmax, dropout), which the backward recomputes from q and k.
QKV = ("query_proj", "key_proj", "value_proj")
MLP_IN = ("mlpwi", "mlpwi_0", "mlpwi_1")  # w_in's output; gated, w_gate's and w_in's
SAVED_NAMES = {
    "minimal": (*QKV, "out_proj", *MLP_IN, "mlpwo"),
    "save_dot_except_mlp": (*QKV, "out_proj"),
    "save_qkv_proj": QKV,
    "full": (),
    "selective": (
        "attention_norm",
        *QKV,
        "context",
        "attention_residual",
        "mlp_norm",
        *MLP_IN,
        "mlp_activation",
    ),
}
REMAT_POLICIES = (*COURSE, *SAVED_NAMES)
NAMES_PREFIX = "names:"  # --remat names:query_proj,context saves those two (and the input)


def checkpoint_names(cfg):
    """The names the layer of cfg gives its tensors, in the order the forward makes them."""
    attention = ("attention_norm", "query_proj", "key_proj", "value_proj", "context")
    attention += ("out_proj", "attention_residual")
    mlp = ("mlpwi_0", "mlpwi_1") if cfg.gated else ("mlpwi",)
    return (
        ("decoder_layer_input",)
        + (attention if cfg.attention else ())
        + ("mlp_norm", *mlp, "mlp_activation", "mlpwo")
    )


def chosen_names(policy):
    """The names `names:a,b,...` lists, in its order."""
    return tuple(policy.removeprefix(NAMES_PREFIX).split(","))


def remat_error(cfg):
    """Why cfg.remat is no policy of this model, in one line, or None."""
    if cfg.remat in REMAT_POLICIES:
        return None
    known = checkpoint_names(cfg)
    names = ", ".join(known)
    if cfg.remat.startswith(NAMES_PREFIX):
        unknown = [name for name in chosen_names(cfg.remat) if name not in known]
        if not unknown:
            return None
        return f"--remat {cfg.remat}: no tensor is named {', '.join(unknown)} (names: {names})"
    return f"--remat {cfg.remat}: {', '.join(REMAT_POLICIES)}, or names:a,b of {names}"


# What a layer keeps for the backward under each remat lever; the rest is recomputed
# there. roofline/plan/saved_activations.py counts its bytes and FLOPs.
REMAT = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # q, k, v, wo, w_in
    "block": jax.checkpoint_policies.nothing_saveable,  # the layer's input alone
} | {policy: jax.checkpoint_policies.save_only_these_names(*names)
     for policy, names in SAVED_NAMES.items()}  # fmt: skip


def remat(layer_fn, policy):
    """layer_fn(layer, x) -> x under jax.checkpoint with REMAT[policy], or saving the names
    `names:a,b` lists (none: as it is)."""
    if policy == "none":
        return layer_fn
    by_name = jax.checkpoint_policies.save_only_these_names
    return jax.checkpoint(layer_fn, policy=REMAT.get(policy) or by_name(*chosen_names(policy)))

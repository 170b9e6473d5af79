"""The transformer: params are a plain nested dict of arrays, the forward pass
is pure functions over it.

    tokens [B, S] -> embed (+ positions) -> L x block -> norm -> logits [B, S, V]

    block(x) = x + attention(norm(x))     (skipped when cfg.attention is False)
             + mlp(norm(...))             (pre-norm residual, as in GPT-2)

By default it is the course's model, GPT-2's block: H heads of keys and values,
a learned table of positions, a ReLU MLP of two matrices, and the output
projection tied to the token embedding (logits = x @ embed^T): one [V, E]
matrix read in both directions. The lookup costs no FLOPs; the output
projection costs 2·B·S·E·V forward, like any matmul.

Four switches of ModelConfig turn it into LLaMA's block, each alone or together:

    kv_heads K   grouped-query attention: K heads of keys and values (wk, wv
                 [E, K, D]), each read by G = H/K query heads; K = 1 is
                 multi-query. The KV cache holds K heads, not H.
    rope         rotary positions (sessions/model/rotary.py): q and k turned by their
                 position after the projection; no learned table `pos`.
    gated        SwiGLU: silu(x·w_gate) * (x·w_in), then ·w_out; three matrices.
    tied False   the output projection is a matrix of its own, unembed [E, V].
"""

import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sessions.model.attention import attention
from sessions.model.config import ModelConfig
from sessions.model.positions import add_positions, init_positions
from sessions.model.quantize import lookup, tied_logits
from sessions.model.remat import remat
from sessions.model.rotary import rotate
from sessions.shard.sharding import constrain

__all__ = ["ModelConfig", "forward", "hidden", "init_params"]


def init_params(cfg: ModelConfig, key):
    """A dict of float32 arrays. Matmul weights are drawn with std 1/sqrt(fan_in)
    so activations keep unit scale; the projections back into the residual
    stream get an extra 1/sqrt(2L) (GPT-2), so L layers of residual adds do
    not grow it. Keys and values have K = cfg.n_kv_heads heads; w_gate (gated)
    is drawn like w_in, the untied unembed like the embedding."""
    E, F, H, D, V, L = cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.vocab, cfg.layers
    K = cfg.n_kv_heads
    residual_scale = (2 * L) ** -0.5

    def normal(key, shape, std):
        return std * jax.random.normal(key, shape, jnp.float32)

    def init_layer(key):
        k = jax.random.split(key, 6)
        layer = {}
        if cfg.attention:
            layer["attn_norm"] = jnp.ones((E,))
            layer["wq"] = normal(k[0], (E, H, D), E**-0.5)
            layer["wk"] = normal(k[1], (E, K, D), E**-0.5)
            layer["wv"] = normal(k[2], (E, K, D), E**-0.5)
            layer["wo"] = normal(k[3], (H, D, E), (H * D) ** -0.5 * residual_scale)
        layer["mlp_norm"] = jnp.ones((E,))
        layer["w_in"] = normal(k[4], (E, F), E**-0.5)
        layer["w_out"] = normal(k[5], (F, E), F**-0.5 * residual_scale)
        if cfg.gated:  # a stream of its own: the default model's six keep their values
            layer["w_gate"] = normal(jax.random.fold_in(key, 6), (E, F), E**-0.5)
        return layer

    # fold_in gives each layer its own stream, independent of how many layers there are.
    params = {
        # std 1/sqrt(E): the tied output then starts with logits of unit std,
        # a first loss of about ln(V) + 1/2, and gradients large enough for a
        # narrow model to learn bigrams in a few dozen steps (std 0.02, GPT-2's,
        # leaves an E=48 model stuck at the unigram loss for hundreds).
        "embed": normal(jax.random.fold_in(key, 0), (V, E), E**-0.5),
        "layers": [init_layer(jax.random.fold_in(key, 100 + i)) for i in range(L)],
        "final_norm": jnp.ones((E,)),
    }
    if cfg.learned_positions:
        params["pos"] = init_positions(jax.random.fold_in(key, 1), cfg.seq, E)
    if not cfg.tied:  # std 1/sqrt(E), as the tied one: logits of unit std at the start
        params["unembed"] = normal(jax.random.fold_in(key, 2), (E, V), E**-0.5)
    return params


def rotary_positions(cfg):
    """Whether q and k are rotated by their positions (sessions/model/rotary.py)."""
    return cfg.positions and cfg.rope


def rms_norm(x, scale, eps=1e-6):
    """x: [..., E] scaled to unit root-mean-square, computed in float32."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale).astype(x.dtype)


def dense(x, w, n_in=1):
    """x [B, S, *in] times w [*in, *out] -> [B, S, *out], contracting the last
    n_in dims of x with the first n_in of w: the einsums "BSE,EF->BSF",
    "BSE,EHD->BSHD" and "BSHD,HDE->BSE" of the model.

    Written as one 2-D matmul [B·S, in] @ [in, out] because XLA's CPU backend
    runs that, and above all its weight gradient (which contracts over B·S),
    far faster than the same einsum with B and S kept apart: 2.5x for the MLP
    of the cpu preset at E=256, F=1024 (scripts/bench.py). On GPU and TPU the two are the same
    program."""
    B, S = x.shape[:2]
    in_shape, out_shape = w.shape[:n_in], w.shape[n_in:]
    x2 = x.reshape(B * S, math.prod(in_shape))
    w2 = w.reshape(math.prod(in_shape), math.prod(out_shape))
    return (x2 @ w2).reshape(B, S, *out_shape)


def dense_apart(x, w, n_in=1):
    """dense with B and S kept apart (sequence parallelism's): each block's partial sums
    over tp are then reduce-scattered along S, which a flattened [B·S, E] cannot be."""
    return jnp.tensordot(x, w, axes=n_in)


def qkv(layer, x, cfg, start=0, dense=dense):
    """x: [B, S, E] at positions start..start+S-1 -> q [B, S, H, D] ("BSE,EHD->BSHD"),
    k, v [B, S, K, D] ("BSE,EKD->BSKD"); with rotary positions, q and k turned by
    their positions (start may be traced)."""
    q = constrain(dense(x, layer["wq"]), "BSHD")
    k, v = (constrain(dense(x, layer[w]), "BSKD") for w in ("wk", "wv"))
    if rotary_positions(cfg):
        q, k = rotate(q, start, cfg.rope_base), rotate(k, start, cfg.rope_base)
    # Named for remat (sessions/model/remat.py), as MaxText names them: q and k after RoPE.
    q, k = checkpoint_name(q, "query_proj"), checkpoint_name(k, "key_proj")
    return q, k, checkpoint_name(v, "value_proj")


def attention_block(layer, x, cfg, attend, dense=dense, start=0):
    """x: [B, S, E] -> ([B, S, E], what attend returned beside its output).

    attend(q, k, v) -> (out [B, S, H, D], extra) is the attention itself: in
    training, causal self-attention over the S positions (extra None); in
    decoding, attention over a KV cache, which it returns updated as extra."""
    out, extra = attend(*qkv(layer, x, cfg, start, dense))
    # Pinned by heads: its gradient comes from the stream, split by S under sequence
    # parallelism, and would otherwise be laid out by S inside attention (all-to-alls).
    out = checkpoint_name(constrain(out, "BSHD"), "context")
    out = constrain(dense(out, layer["wo"], n_in=2), "BSE", cfg.sequence_parallel)
    return checkpoint_name(out, "out_proj"), extra  # "BSHD,HDE->BSE"


def mlp_block(layer, x, cfg, dense=dense):
    """x: [B, S, E] -> [B, S, E]; acts on each position alone."""
    h = constrain(dense(x, layer["w_in"]), "BSF")  # "BSE,EF->BSF"
    if cfg.gated:
        # SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"; LLaMA's): a
        # second projection, through SiLU, gates the first, position by position.
        gate = checkpoint_name(constrain(dense(x, layer["w_gate"]), "BSF"), "mlpwi_0")
        h = jax.nn.silu(gate) * checkpoint_name(h, "mlpwi_1")
    else:
        # ReLU, as in the course. GELU (GPT-2's) learns about as well here and
        # costs 3-5% more per step on a CPU, where its tanh is not free.
        h = jax.nn.relu(checkpoint_name(h, "mlpwi"))
    h = checkpoint_name(h, "mlp_activation")
    out = constrain(dense(h, layer["w_out"]), "BSE", cfg.sequence_parallel)  # "BSF,FE->BSE"
    return checkpoint_name(out, "mlpwo")


def block(layer, x, cfg, attend, dense=dense, start=0):
    """One layer, pre-norm residual: x [B, S, E] at positions start..start+S-1
    -> ([B, S, E], attend's extra).

    dense is how a weight is applied: the decoder passes its own, for weights
    it stores transposed (sessions/inference/layout.py), and its position as start
    (rotary positions turn q and k by it)."""
    extra = None
    x = checkpoint_name(x, "decoder_layer_input")
    if cfg.attention:
        normed = checkpoint_name(rms_norm(x, layer["attn_norm"]), "attention_norm")
        a, extra = attention_block(layer, normed, cfg, attend, dense, start)
        x = checkpoint_name(x + a, "attention_residual")
    normed = checkpoint_name(rms_norm(x, layer["mlp_norm"]), "mlp_norm")
    return x + mlp_block(layer, normed, cfg, dense), extra


def cast(params, cfg: ModelConfig):
    """The params in the compute dtype (a no-op in float32)."""
    dtype = jnp.dtype(cfg.dtype)
    return jax.tree.map(lambda w: w.astype(dtype), params)


def float32_tables(params):
    """params with the embedding and position tables as float32 (no-ops if they are):
    a lookup's gradient is a sum (embed), which then runs in float32 even for weights
    stored in bfloat16 (--weights bfloat16), rounded to bf16 once at its end."""
    tables = {name: params[name].astype(jnp.float32) for name in ("embed", "pos") if name in params}
    return {**params, **tables}


def embed(p, tokens, cfg: ModelConfig, start=0):
    """tokens: int [B, S] at positions start..start+S-1 -> x [B, S, E] in the
    compute dtype, looked up in p["embed"] (training passes it as float32:
    float32_tables).

    The lookup is a gather, no FLOPs; its gradient is a scatter-add, each
    position's gradient added into its token's row: in a course step 32,768
    rows onto a [256, 512] table, about 9,400 of them onto the space byte's.
    Mixed precision computes in bf16 but keeps its long sums in float32: the
    matmuls accumulate in f32 inside the chip, the loss's softmax sums in f32
    (cross_entropy, below), the norms in f32 (rms_norm), and this sum reads the
    f32 master. Looked up in a bf16 table, an H100 summed it with bf16 atomics:
    4.6 ms at step 1, 58-146 ms a step after 600 steps (its cost follows the
    values), against 0.3 ms in f32 and 8.9 ms for the rest of the step; and a
    bf16 sum drops every update below half its last place. Gathered in f32 and
    cast after, the course run went from 0.12x PyTorch's tokens/s to 0.89x
    (3.60M), steady within 0.3% (docs/h100-run, measured 2026-11-24).

    A one-hot matmul, one_hot(tokens) [B·S, V] @ table, would sum in f32 too,
    at 2·B·S·V·E FLOPs forward and as many for its gradient, through a [B·S, V]
    one-hot: it adds 0.7% to the course step's FLOPs at V=256; at GPT-2's
    50,304 it adds 18% (5 ms at an H100's bf16 peak) and a 3.3 GB one-hot in
    bf16 (predicted, roofline/flops.py). The gather's sum moves B·S·E numbers
    whatever V is: it is the one that scales.

    Only learned positions are added here; rotary ones turn q and k (qkv)."""
    x = lookup(p["embed"], tokens).astype(cfg.dtype)  # an int8 table too (decode)
    if cfg.learned_positions:
        x = add_positions(x, p["pos"], start)
    return constrain(x, "BSE", cfg.sequence_parallel)


def unembed(p, x, dense=dense):
    """x: [B, S, E] -> logits [B, S, V] in the compute dtype, through the tied
    embedding, or through p["unembed"] where the params hold one (cfg.tied
    False; applied by `dense`, like every matmul weight the decoder stores
    transposed). At GPT-2's vocabulary they are the step's largest array (32 x
    1024 x 50,304: 6.6 GB in float32): in bfloat16 they cost half the bytes to
    write and read, and the loss takes its sums in float32 (cross_entropy, below)."""
    x = rms_norm(x, p["final_norm"])
    if "unembed" in p:
        return constrain(dense(x, p["unembed"]), "BSV")  # "BSE,EV->BSV"
    logits = tied_logits(x, p["embed"])  # "BSE,VE->BSV"; an int8 table too (decode)
    return constrain(logits, "BSV")


def hidden(params, tokens, cfg: ModelConfig, segment_ids=None):
    """tokens: int [B, S] -> x [B, S, E] in the compute dtype (cfg.dtype): the last
    layer's output, before the final norm and the output projection (unembed).

    segment_ids (optional, int [B, S]): packed documents; tokens attend only
    within their own segment."""
    # Mixed precision: the float32 master weights are cast once per step to
    # the compute dtype; gradients flow back through the cast in float32. The
    # lookups read float32 tables: their gradients are sums (embed).
    p = cast(params, cfg)

    def causal(q, k, v):
        return attention(q, k, v, segment_ids, impl=cfg.attention_impl), None

    x = embed(float32_tables(params), tokens, cfg)
    matmul = dense_apart if cfg.sequence_parallel else dense
    layer_fn = remat(lambda layer, x: block(layer, x, cfg, causal, matmul)[0], cfg.remat)
    if cfg.scan_layers:
        # The weights are kept a list of layers (checkpoints, decode and the sharding
        # rules read them so) and stacked here: a copy of them, in the compute dtype.
        stacked = jax.tree.map(lambda *w: jnp.stack(w), *p["layers"])  # [L, *shape]
        x, _ = jax.lax.scan(lambda x, layer: (layer_fn(layer, x), None), x, stacked)
    else:
        for layer in p["layers"]:
            x = layer_fn(layer, x)
    return x


def head_weights(params, cfg: ModelConfig):
    """The weights unembed reads, in the compute dtype: all a loss over chunks of the
    tokens carries into each chunk (sessions/train/chunked_loss.py)."""
    return cast({k: params[k] for k in ("final_norm", "embed", "unembed") if k in params}, cfg)


def forward(params, tokens, cfg: ModelConfig, segment_ids=None):
    """tokens: int [B, S] -> logits [B, S, V] in the compute dtype (cfg.dtype):
    hidden, then the output projection (unembed)."""
    return unembed(head_weights(params, cfg), hidden(params, tokens, cfg, segment_ids))


def cross_entropy(logits, targets):
    """Mean negative log-likelihood in nats. logits [B, S, V] (any float dtype:
    the sums run in float32), targets int [B, S].

    logsumexp minus the label's logit: the same number as log_softmax followed
    by a one-hot dot product. The label's logit is picked by comparing each
    vocabulary index with the label, not by indexing (take_along_axis): the
    gradient of an index is a scatter into a zeroed [B, S, V] array, one more
    pass over the largest array of the step, while the gradient of a compare
    fuses into the softmax's (4 of the 49 ms of GPT-2's step predicted for
    h100:1 by roofline/compiled/op_roofline.py, and 6.6 GB)."""
    logits = logits.astype(jnp.float32)  # fused into the reductions: no f32 copy
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B, S]
    vocab = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
    picked = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)  # [B, S]
    return jnp.mean(lse - picked)

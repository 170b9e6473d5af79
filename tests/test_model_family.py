"""Session 5's model family: grouped-query attention, rotary positions, the gated MLP and
untied embeddings, each against a reference written here in float64 NumPy, in training
and in the cached decode, counted by roofline/flops.py as XLA counts the compiled step."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from roofline.flops import activations_per_token, count_params, param_count, train_flops
from roofline.measured.compare import xla_cost
from sessions.errors import UsageError
from sessions.inference import kv_cache, layout
from sessions.model import forward, init_params
from sessions.model.attention import IMPLEMENTATIONS, attention_mask, einsum_attention
from sessions.model.config import PRESETS, ModelConfig, TrainConfig
from sessions.model.rotary import rotate
from sessions.run.checkpoint import Checkpoints
from sessions.run.cli import infer_flags, serving_config
from sessions.run.serving import inference_config, load_params
from sessions.shard import sharding
from sessions.train import data
from sessions.train.step import init_state, make_optimizer, make_train_step

model = jax.jit(forward, static_argnames="cfg")

# The LLaMA block: grouped-query attention, rotary positions, SwiGLU, untied embeddings.
LLAMA = {"rope": True, "gated": True, "tied": False}


def numpy_params(cfg, seed=0):
    """Params of init_params' shapes, drawn by NumPy: no random-number program for XLA to
    compile per shape (seconds each on a CPU). Matrices with std 1/sqrt(E), near the
    init's; norm scales near 1."""
    rng = np.random.default_rng(seed)

    def draw(x):
        values = (
            1 + 0.1 * rng.standard_normal(x.shape)
            if x.ndim == 1
            else rng.standard_normal(x.shape) / np.sqrt(cfg.embed)
        )
        return jnp.asarray(values, jnp.float32)

    return jax.tree.map(
        draw, jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    )


def random_tokens(cfg, batch=2, seed=2):
    """int32 [batch, cfg.seq], uniform over the vocabulary."""
    return jnp.asarray(
        np.random.default_rng(seed).integers(0, cfg.vocab, (batch, cfg.seq)), jnp.int32
    )


def numpy_rope(x, positions, base):
    """x float64 [B, S, N, D] at `positions` [S]: dims i and i + D/2 of each head turned
    by positions·base^(-2i/D), pair by pair (the halves pairing of sessions/model/rotary.py)."""
    D = x.shape[-1]
    out = np.empty_like(x)
    for i in range(D // 2):
        theta = positions * base ** (-2.0 * i / D)
        cos, sin = np.cos(theta)[None, :, None], np.sin(theta)[None, :, None]
        a, b = x[..., i], x[..., i + D // 2]
        out[..., i], out[..., i + D // 2] = a * cos - b * sin, a * sin + b * cos
    return out


def normal(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


def test_rope_equals_a_float64_rotation():
    B, S, N, D, base = 2, 7, 3, 10, 10_000.0
    x = normal(0, (B, S, N, D))
    x32 = jnp.asarray(x, jnp.float32)
    np.testing.assert_allclose(rotate(x32, 0, base), numpy_rope(x, np.arange(S), base), atol=1e-5)
    # A decoder's position is traced; far from 0 the float32 angle is still within 1e-4 rad.
    turned = jax.jit(rotate, static_argnums=2)(x32, 997, base)
    np.testing.assert_allclose(turned, numpy_rope(x, 997 + np.arange(S), base), atol=2e-4)
    # Lengths are kept: a rotation.
    np.testing.assert_allclose(np.linalg.norm(turned, axis=-1), np.linalg.norm(x, axis=-1), 1e-5)
    # bfloat16 in, bfloat16 out, turned in float32 (one bf16 rounding from the reference).
    bf16 = rotate(x32.astype(jnp.bfloat16), 5, 500_000.0)
    assert bf16.dtype == jnp.bfloat16
    reference = numpy_rope(np.asarray(x32.astype(jnp.bfloat16), np.float64), 5 + np.arange(S), 5e5)
    np.testing.assert_allclose(np.asarray(bf16, np.float64), reference, atol=2e-2, rtol=1e-2)


def test_rope_scores_depend_only_on_the_distance():
    """q at m and k at n, turned: q·k is a function of m - n. Shifting every position by
    the same constant leaves every score; shifting only the keys' does not."""
    B, S, H, D = 1, 9, 2, 16
    q, k = (jnp.asarray(normal(seed, (B, S, H, D)), jnp.float32) for seed in (1, 2))

    def scores(q_start, k_start):
        qr, kr = rotate(q, q_start, 100.0), rotate(k, k_start, 100.0)
        return np.asarray(jnp.einsum("BSHD,BTHD->BHST", qr, kr, precision="highest"))

    plain = np.asarray(jnp.einsum("BSHD,BTHD->BHST", q, k, precision="highest"))
    at_zero = scores(0, 0)
    assert not np.allclose(at_zero, plain, atol=1e-2)  # the rotation does something
    for shift in (1, 13, 400):
        np.testing.assert_allclose(scores(shift, shift), at_zero, atol=2e-4, err_msg=shift)
    assert not np.allclose(scores(0, 3), at_zero, atol=1e-2)  # the distance matters


def multi_query(q, k, v):
    """Hand-written multi-query attention, float64: q [B, S, H, D], one key and one value
    head k, v [B, T, D] shared by every query head, causal."""
    B, S, H, D = q.shape
    out = np.zeros((B, S, H, D))
    for b in range(B):
        for h in range(H):
            for s in range(S):
                scores = k[b, : s + 1] @ q[b, s, h] / np.sqrt(D)  # keys t <= s
                probs = np.exp(scores - scores.max())
                out[b, s, h] = (probs / probs.sum()) @ v[b, : s + 1]
    return out


def grouped_query(q, k, v):
    """Grouped-query attention from multi_query: query heads g·G .. g·G + G - 1 read KV
    head g (G = H/K), as one multi-query attention per group."""
    G = q.shape[2] // k.shape[2]
    groups = [
        multi_query(q[:, :, g * G : (g + 1) * G], k[:, :, g], v[:, :, g]) for g in range(k.shape[2])
    ]
    return np.concatenate(groups, axis=2)


def todays_attention(q, k, v, segment_ids=None):
    """sessions/model/attention.py's einsum attention as it was before grouping: H heads of keys."""
    D = q.shape[-1]
    scores = jnp.einsum("BSHD,BTHD->BHST", q, k, preferred_element_type=jnp.float32)
    scores = scores * D**-0.5
    mask = attention_mask(q.shape[1], k.shape[1], segment_ids)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("BHST,BTHD->BSHD", probs, v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_as_many_kv_heads_as_heads_is_today_s_attention_to_the_bit(dtype):
    B, S, H, D = 2, 6, 3, 8
    q, k, v = (jnp.asarray(normal(seed, (B, S, H, D)), dtype) for seed in (3, 4, 5))
    segments = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    for ids in (None, segments):
        np.testing.assert_array_equal(
            einsum_attention(q, k, v, ids), todays_attention(q, k, v, ids)
        )
    # The model with K = H given is the default model: the same programs, to the last op,
    # so the same params (the same draws) and the same logits.
    cfg = ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=16)
    explicit = dataclasses.replace(cfg, kv_heads=3)
    key, tokens = jax.random.key(0), random_tokens(cfg)
    params = jax.eval_shape(functools.partial(init_params, cfg), key)
    for c in (cfg, explicit):
        assert str(jax.make_jaxpr(init_params, static_argnums=0)(c, key)) == str(
            jax.make_jaxpr(init_params, static_argnums=0)(cfg, key)
        )
        assert str(jax.make_jaxpr(forward, static_argnums=2)(params, tokens, c)) == str(
            jax.make_jaxpr(forward, static_argnums=2)(params, tokens, cfg)
        )


# (S, D): splash's tiles are 128 keys wide, our kernel takes head dims 64 and 128.
KERNEL_SHAPES = {"einsum": (6, 8), "fused": (6, 8), "pallas": (40, 64), "splash": (128, 8)}


@pytest.mark.parametrize("impl", sorted(KERNEL_SHAPES))
def test_one_kv_head_is_hand_written_multi_query_attention(impl):
    (S, D), B, H = KERNEL_SHAPES[impl], 2, 4
    q = normal(6, (B, S, H, D))
    k, v = normal(7, (B, S, 1, D)), normal(8, (B, S, 1, D))
    run = jax.jit(IMPLEMENTATIONS[impl])
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    out = run(f32(q), f32(k), f32(v))
    np.testing.assert_allclose(out, multi_query(q, k[:, :, 0], v[:, :, 0]), atol=2e-5)
    # Two KV heads: which query heads read which (heads 0, 1 the first; 2, 3 the second).
    k2, v2 = normal(9, (B, S, 2, D)), normal(10, (B, S, 2, D))
    np.testing.assert_allclose(run(f32(q), f32(k2), f32(v2)), grouped_query(q, k2, v2), atol=2e-5)


def plain_llama(params, tokens, cfg):
    """The LLaMA block written out in float64 NumPy, per sessions/model/transformer.py's docstring:
    no positional table; per layer x + attention(norm(x)) with q and k turned by their
    positions and G query heads per KV head, then x + w_out(silu(x·w_gate) * x·w_in);
    the final norm; logits through unembed [E, V]."""
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    t = np.asarray(tokens)
    S = t.shape[1]
    x = p["embed"][t]

    def norm(x, scale):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    for layer in p["layers"]:
        h = norm(x, layer["attn_norm"])
        q = np.einsum("BSE,EHD->BSHD", h, layer["wq"])
        k, v = (np.einsum("BSE,EKD->BSKD", h, layer[w]) for w in ("wk", "wv"))
        q, k = (numpy_rope(a, np.arange(S), cfg.rope_base) for a in (q, k))
        x = x + np.einsum("BSHD,HDE->BSE", grouped_query(q, k, v), layer["wo"])
        h = norm(x, layer["mlp_norm"])
        gate = h @ layer["w_gate"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ layer["w_in"])) @ layer["w_out"]
    return norm(x, p["final_norm"]) @ p["unembed"]


def test_forward_equals_a_plain_llama_block():
    cfg = ModelConfig(embed=24, ff=40, heads=4, head_dim=8, layers=2, seq=16, kv_heads=2, **LLAMA)
    params = numpy_params(cfg)
    assert "pos" not in params and params["unembed"].shape == (24, 256)
    assert params["layers"][0]["wk"].shape == (24, 2, 8)
    tokens = random_tokens(cfg)
    expected = plain_llama(params, tokens, cfg)
    np.testing.assert_allclose(model(params, tokens, cfg), expected, atol=1e-4)


TINY = PRESETS["tiny"].model  # H = 4, D = 12, S = 64, float32
# Each option alone, and the LLaMA block with two KV heads (the mesh below splits them).
OPTIONS = {
    "mqa": {"kv_heads": 1},
    "rope": {"rope": True},
    "gated": {"gated": True},
    "untied": {"tied": False},
    "llama": {"kv_heads": 2, **LLAMA},
}
decode_step = jax.jit(kv_cache.decode_step, static_argnames="cfg")  # pos traced: one compile


def teacher_forced(params, cfg, positions, P=5, mesh=None):
    """A prompt of P tokens through prefill, then one token a step through the cache:
    the logits at positions P-1, P, ..., P+positions-1 beside forward's, and the cache.
    As tests/test_inference.py checks the default. Under `mesh`, rows over data x fsdp."""
    tokens = random_tokens(cfg)
    if mesh is not None:
        tokens = jax.device_put(tokens, sharding.batch_sharding(mesh))
    logits, cache = kv_cache.prefill(params, tokens[:, :P], cfg)
    steps, w = [logits], layout.decode_weights(params, cfg)
    for pos in range(P, P + positions):
        logits, cache = decode_step(w, cache, tokens[:, pos], pos, cfg=cfg)
        steps.append(logits)
    return np.stack(steps, axis=1), tokens, cache


# The LLaMA block's cached decode is checked on a mesh, below: the same property, sharded.
ALONE = {name: option for name, option in OPTIONS.items() if name != "llama"}


def check_cache_and_logits(logits, tokens, cache, params, cfg, P, n):
    """The cache holds K heads; its logits are forward's (on one device) at each position."""
    assert cache[0]["k"].shape == (2, cfg.n_kv_heads, cfg.head_dim, cfg.seq)
    assert cache[0]["v"].shape == (2, cfg.n_kv_heads, cfg.seq, cfg.head_dim)
    expected = model(params, np.asarray(tokens), cfg=cfg)[:, P - 1 : P + n]
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("option", ALONE.values(), ids=ALONE.keys())
def test_the_cached_decode_gives_the_model_s_logits(option):
    """Teacher-forced: the cache (K heads, keys turned at their positions) gives, step by
    step, forward's logits at each position."""
    cfg = dataclasses.replace(TINY, **option)
    params, P, n = numpy_params(cfg), 5, 8
    logits, tokens, cache = teacher_forced(params, cfg, n, P)
    check_cache_and_logits(logits, tokens, cache, params, cfg, P, n)


def test_the_llama_block_decodes_alike_on_a_mesh():
    """Every switch at once, K = 2, on fsdp=2 x tp=2: the KV heads split over tp like
    the queries (one per device), w_gate like w_in and the untied unembed like the
    embedding's transpose; the cached decode still gives, step by step, forward's
    logits, computed on one device."""
    cfg, P, n = dataclasses.replace(TINY, **OPTIONS["llama"]), 5, 8
    sizes = {"data": 1, "fsdp": 2, "tp": 2}
    sharding.check_divisible(cfg, 2, sizes)
    params = numpy_params(cfg)
    mesh = sharding.make_mesh(sizes)
    with jax.set_mesh(mesh):
        placed = jax.device_put(params, sharding.tree_shardings(params, mesh))
        logits, tokens, cache = teacher_forced(placed, cfg, n, P, mesh)
        k = cache[0]["k"]
        assert k.sharding.shard_shape(k.shape) == (1, 1, cfg.head_dim, cfg.seq)
        w = layout.decode_weights(placed, cfg)
        E, F, V = cfg.embed, cfg.ff, cfg.vocab
        gate, unembed = w["layers"][0]["w_gate"], w["unembed"]
        assert gate.sharding.shard_shape(gate.shape) == (F // 2, E // 2)
        assert unembed.sharding.shard_shape(unembed.shape) == (V // 2, E // 2)
    check_cache_and_logits(logits, tokens, cache, params, cfg, P, n)


def test_a_llama_checkpoint_is_served_with_its_own_switches(tmp_path):
    """A checkpoint of the LLaMA block, served with no switch given (s3_infer.py's
    flags): K, rope, gated and untied come from it, and its weights come back."""
    cfg, tc = dataclasses.replace(TINY, **OPTIONS["llama"]), TrainConfig(batch=2, steps=1)
    params = numpy_params(cfg)
    state = {"params": params, "opt": make_optimizer(tc, tc.steps).init(params)}
    directory = str(tmp_path / "checkpoints")
    with Checkpoints(directory, 1, cfg, tc) as checkpoints:
        checkpoints.maybe_save(1, state, force=True)
    serving = serving_config(infer_flags(["--checkpoint-dir", directory]), platform="cpu")
    served, meta = inference_config(serving)
    assert (served.n_kv_heads, served.rope, served.gated, served.tied) == (2, True, True, False)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=jax.devices()[:1])
    with jax.set_mesh(mesh):
        restored, _ = load_params(directory, 0, served, meta, mesh)
    jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_kv_heads_split_over_tp():
    cfg = dataclasses.replace(TINY, kv_heads=1)
    with pytest.raises(UsageError, match="kv_heads 1 does not divide over tp = 2"):
        sharding.check_divisible(cfg, 16, {"data": 1, "fsdp": 4, "tp": 2})
    with pytest.raises(UsageError, match=r"--kv-heads 3 must divide the 4 query heads \(try 1, 2"):
        dataclasses.replace(TINY, kv_heads=3)
    with pytest.raises(UsageError, match="even --head-dim"):
        dataclasses.replace(TINY, head_dim=7, rope=True)


@pytest.mark.parametrize("option", OPTIONS.values(), ids=OPTIONS.keys())
def test_the_roofline_counts_every_parameter(option):
    cfg = dataclasses.replace(TINY, **option)
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    assert param_count(cfg) == count_params(shapes)


def test_the_llama_counts_by_hand():
    """Tiny's shapes (V=256, E=48, F=96, H=4, D=12, L=2) with K=2, rope, gated, untied:
    the embedding and the unembedding 256·48 each; no positions; per layer two norms 48,
    wq and wo 48·4·12 each, wk and wv 48·2·12 each, three MLP matrices 48·96; the final
    norm 48."""
    cfg = dataclasses.replace(TINY, **OPTIONS["llama"])
    per_layer = 2 * 48 + 2 * 2304 + 2 * 1152 + 3 * 4608
    assert param_count(cfg) == 2 * 12_288 + 2 * per_layer + 48 == 66_288
    # Kept per token and layer: the normed input 48, q 48, k and v 24 each, the heads'
    # output 48; the MLP's normed input 48, SiLU's input, x·w_in and their product 96 each.
    assert activations_per_token(cfg) == 2 * (48 + 48 + 24 + 24 + 48 + 48 + 3 * 96) + 48


def test_xla_counts_the_llama_step_as_the_roofline_does():
    """The compiled training step's FLOPs (XLA's cost analysis) against train_flops,
    within 3% as tests/test_roofline.py holds the default (E=192: the elementwise work,
    SiLU, the rotation and AdamW, is a few % of the matmuls). By hand: 6 per matmul
    weight per token (wq, wo E·H·D; wk, wv E·K·D; three E·F; the unembed V·E), and
    attention's 2·2·B·S·S·H·D a layer, three times over (forward and backward): H
    heads, whatever K."""
    cfg = ModelConfig(
        embed=192, ff=512, heads=4, head_dim=48, layers=2, seq=64, kv_heads=2, **LLAMA
    )
    B, (V, E, F, H, K, D, L, S) = 8, (256, 192, 512, 4, 2, 48, 2, 64)
    by_hand = 6 * B * S * (L * (2 * E * H * D + 2 * E * K * D + 3 * E * F) + V * E)
    by_hand += 3 * L * 2 * 2 * B * S * S * H * D
    assert train_flops(cfg, B) == by_hand
    tc = TrainConfig(batch=B, steps=10, warmup=2)
    optimizer = make_optimizer(tc, tc.steps)
    state = jax.eval_shape(functools.partial(init_state, cfg=cfg, optimizer=optimizer), key_shape())
    tokens = jax.ShapeDtypeStruct((B, S), np.int32)
    step = make_train_step(cfg, optimizer).lower(state, {"inputs": tokens, "targets": tokens})
    flops, _ = xla_cost(step.compile())
    assert by_hand <= flops <= 1.03 * by_hand, flops / by_hand


def key_shape():
    return jax.eval_shape(lambda: jax.random.key(0))


def test_the_llama_block_learns():
    """Tiny's 60 steps with every switch on, as tests/test_train.py trains the default:
    from near ln(256) to well below the corpus's unigram entropy (its last ten steps:
    2.7-2.8 nats against 3.26, from NumPy's draws)."""
    cfg, tc = dataclasses.replace(TINY, **OPTIONS["llama"]), PRESETS["tiny"].train
    optimizer = make_optimizer(tc, tc.steps)
    params = numpy_params(cfg)  # init_params' draws would cost seconds of compiling
    state = {"params": params, "opt": optimizer.init(params)}  # as step.init_state builds it
    train, _ = data.split(data.default_corpus(), cfg.seq)
    batch = functools.partial(data.get_batch, train, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
    step = make_train_step(cfg, optimizer)
    losses = []
    for i in range(tc.steps):
        state, metrics = step(state, batch(i))
        losses.append(float(metrics["loss"]))
    untrained = losses[0]  # a step's loss is of the params it was given: the first, untrained
    unigram = data.unigram_entropy(train)
    assert untrained > unigram + 1, (untrained, unigram)
    assert np.mean(losses[-10:]) < unigram - 0.3, (losses[-10:], unigram)

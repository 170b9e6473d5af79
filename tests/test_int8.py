"""int8 weights and the int8 KV cache (sessions/model/quantize.py) against float64
references and hand-derived bounds; decode through them against the full step
on the dequantized weights and cache; their bytes counted by hand.
The compiled programs for a chip are checked in tests/test_int8_targets.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sessions.inference import kv_cache, layout, quality
from sessions.inference.layout import INPUT_DIMS, decode_weights, dense_out_in, out_in_order
from sessions.model import forward, init_params, quantize
from sessions.model.transformer import cross_entropy

B, P = 2, 5
EPS32 = 2.0**-24  # float32's unit roundoff
model = jax.jit(forward, static_argnames="cfg")  # one compile, not the model op by op


@pytest.fixture(scope="module")
def params(cfg, key):
    """Weights scaled up, as in tests/test_inference.py: logits that move a lot."""
    return jax.tree.map(lambda w: 3 * w, init_params(cfg, key))


def prompts(cfg, length=P, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, length), 0, cfg.vocab)


@pytest.mark.parametrize("shape, n_in", [((5, 3, 7), 1), ((5, 3, 7), 2), ((9, 24), 1)])
def test_the_round_trip_is_within_half_a_step(shape, n_in):
    """|w - values · scale| <= scale / 2 for every number: round() moves w / scale
    by at most 1/2, and w / scale is computed in float32, off by at most
    127 · 2^-24 of a step. scale = max |w| over the inputs / 127 by hand; a row of
    zeros keeps scale 1 and values 0; each row's largest |w| is ±127 exactly."""
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    w[1] = 0.0  # a whole output channel of zeros
    w[2] *= 1000.0  # an outlier channel: its scale must not leak into the others
    q = quantize.quantize_weight(jnp.asarray(w), n_in)
    out = shape[: len(shape) - n_in]
    assert q.values.dtype == jnp.int8 and q.values.shape == shape
    assert q.scale.dtype == jnp.float32 and q.scale.shape == out
    inputs = tuple(range(len(shape) - n_in, len(shape)))
    absmax = np.abs(w.astype(np.float64)).max(axis=inputs)
    expected = np.where(absmax > 0, absmax / 127, 1.0)
    np.testing.assert_allclose(q.scale, expected, rtol=2 * EPS32)
    values, scale = np.asarray(q.values, np.float64), np.asarray(q.scale, np.float64)
    scale_in = scale.reshape(out + (1,) * n_in)
    assert np.abs(values).max() <= 127
    assert np.all(np.abs(w - values * scale_in) <= scale_in * (0.5 + 127 * EPS32))
    assert np.all(values[1] == 0) and scale[1].max() == 1.0
    assert np.all(np.abs(values).max(axis=inputs)[absmax > 0] == 127)
    np.testing.assert_allclose(quantize.dequantize(q), values * scale_in, rtol=EPS32)


def test_every_matmul_weight_and_the_embedding_become_int8(cfg, params):
    """Each weight decode multiplies, and the embedding (per row: the tied output
    projection's channels), as Int8 with one scale per output channel; the norm
    scales and the positional table as they were."""
    w = decode_weights(params, cfg)
    w8 = layout.quantize_decode_weights(w)
    assert isinstance(w8["embed"], quantize.Int8)
    assert w8["embed"].scale.shape == (cfg.vocab,)
    for layer, layer8 in zip(w["layers"], w8["layers"], strict=True):
        assert set(layer) == set(layer8)
        for name, weight in layer.items():
            if name in INPUT_DIMS:
                n_out = weight.ndim - INPUT_DIMS[name]
                assert isinstance(layer8[name], quantize.Int8), name
                assert layer8[name].scale.shape == weight.shape[:n_out], name
            else:
                assert layer8[name] is not None and np.array_equal(layer8[name], weight), name
    np.testing.assert_array_equal(w8["pos"], w["pos"])
    np.testing.assert_array_equal(w8["final_norm"], w["final_norm"])


@pytest.mark.parametrize("n_in", [1, 2])
def test_the_int8_product_is_within_its_bound(n_in):
    """dense_out_in on an Int8 weight against float64. Per output o,
    y_o - y'_o = Σ_i x_i (w_oi - values_oi · s_o), so |error_o| <= s_o / 2 · Σ_i |x_i|
    (the round trip's bound); float32's own rounding adds at most n · 2^-24 of
    Σ_i |x_i| · 127 · s_o. And it is the product with the dequantized weight,
    to float32 rounding: the scale only moved from the weight to the result."""
    rng = np.random.default_rng(1)
    shape = (5, 3, 8) if n_in == 2 else (7, 24)  # [*out, *in]
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal((2, 3, *shape[len(shape) - n_in :])).astype(np.float32)
    q = quantize.quantize_weight(jnp.asarray(w), n_in)
    y = np.asarray(dense_out_in(jnp.asarray(x), q, n_in), np.float64)  # [B, S, *out]
    n_out = len(shape) - n_in
    axes = (tuple(range(2, 2 + n_in)), tuple(range(n_out, n_out + n_in)))
    exact = np.tensordot(x.astype(np.float64), w.astype(np.float64), axes=axes)
    x_abs = np.abs(x.astype(np.float64)).sum(axis=tuple(range(2, 2 + n_in)))  # [B, S]
    bound = x_abs.reshape(2, 3, *(1,) * n_out) * np.asarray(q.scale, np.float64)  # s_o Σ|x_i|
    n = np.prod(shape[n_out:])
    assert np.all(np.abs(y - exact) <= bound * (0.5 + n * 127 * EPS32))
    deq = np.asarray(quantize.dequantize(q), np.float64)
    via_dequantized = np.tensordot(x.astype(np.float64), deq, axes=axes)
    np.testing.assert_allclose(
        y, via_dequantized, rtol=0, atol=float(n * 1e3 * EPS32 * bound.max())
    )


def attention_reference(q, k, v, k8, k_scale, v8, v_scale, pos):
    """float64 NumPy: the new tokens' grouped attention over the dequantized cache
    and themselves. q [B, S, H, D]; k, v [B, S, K, D]; k8 [B, K, D, T], v8
    [B, K, T, D], their scales [B, K, T]. Query head h reads KV
    head h // G, G = H / K, as grouped-query attention's groups are laid out."""
    _, S, H, D = q.shape
    K, T = k8.shape[1], k8.shape[-1]
    keys = np.concatenate([(k8 * k_scale[:, :, None]).transpose(0, 3, 1, 2), k], axis=1)
    values = np.concatenate([(v8 * v_scale[..., None]).transpose(0, 2, 1, 3), v], axis=1)
    out = np.zeros(q.shape)
    for h in range(H):
        kv = h // (H // K)
        scores = np.einsum("BSD,BTD->BST", q[:, :, h], keys[:, :, kv]) / np.sqrt(D)
        seen = np.concatenate(
            [np.broadcast_to(np.arange(T) < pos, (S, T)), np.tril(np.ones((S, S), bool))], axis=1
        )
        scores = np.where(seen, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out[:, :, h] = np.einsum("BST,BTD->BSD", probs, values[:, :, kv])
    return out


@pytest.mark.parametrize("K", [2, 6, 1])
def test_int8_cache_attention_equals_attention_over_the_dequantized_cache(K):
    """H = 6 query heads over K KV heads (grouped, multi-head, multi-query), three
    new tokens at pos 4 of T = 10: the scales applied to the scores and to the
    probabilities give what dequantizing the cache first gives, to float32 rounding."""
    rng = np.random.default_rng(2)
    Bq, S, H, D, T, pos = 2, 3, 6, 8, 10, 4
    q = rng.standard_normal((Bq, S, H, D))
    k, v = rng.standard_normal((2, Bq, S, K, D))
    k8 = rng.integers(-127, 128, (Bq, K, D, T))
    v8 = rng.integers(-127, 128, (Bq, K, T, D))
    k_scale, v_scale = rng.uniform(0.001, 0.03, (2, Bq, K, T))
    cache = {
        "k": jnp.asarray(k8, jnp.int8),
        "v": jnp.asarray(v8, jnp.int8),
        "k_scale": jnp.asarray(k_scale, jnp.float32),
        "v_scale": jnp.asarray(v_scale, jnp.float32),
    }
    f32 = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
    got = jax.jit(kv_cache.cached_attention)(*f32, cache, pos)  # as decode runs it: compiled
    want = attention_reference(
        q, k, v, k8, np.float32(k_scale), v8, np.float32(v_scale), pos
    )  # the scales as the cache holds them
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_the_int8_write_quantizes_each_token_and_head_in_its_slots(cfg):
    """Two tokens written at 3 and 4: each (token, head)'s key and value within
    half a step of their scale, max |x| / 127 by hand; every other slot as it
    was; and a write that is not live changes nothing."""
    c = dataclasses.replace(cfg, seq=8)
    cache = kv_cache.init_cache(c, B, int8=True)[0]
    rng = np.random.default_rng(3)
    k, v = rng.standard_normal((2, B, 2, c.heads, c.head_dim)).astype(np.float32)
    write = jax.jit(kv_cache.write)  # as decode runs it: compiled
    written = write(cache, jnp.asarray(k), jnp.asarray(v), 3)
    k_scale = np.abs(k).max(-1) / 127  # [B, S, H]
    v_scale = np.abs(v).max(-1) / 127
    np.testing.assert_allclose(written["k_scale"][..., 3:5], k_scale.transpose(0, 2, 1), 1e-6)
    np.testing.assert_allclose(written["v_scale"][..., 3:5], v_scale.transpose(0, 2, 1), 1e-6)
    k_back = np.asarray(written["k"], np.float64) * np.asarray(written["k_scale"])[:, :, None]
    v_back = np.asarray(written["v"], np.float64) * np.asarray(written["v_scale"])[..., None]
    half = 0.5 + 127 * EPS32
    assert np.all(
        np.abs(k_back[..., 3:5] - k.transpose(0, 2, 3, 1))
        <= k_scale.transpose(0, 2, 1)[:, :, None] * half
    )
    assert np.all(
        np.abs(v_back[:, :, 3:5] - v.transpose(0, 2, 1, 3))
        <= v_scale.transpose(0, 2, 1)[..., None] * half
    )
    for name, axis in (("k", 3), ("v", 2), ("k_scale", 2), ("v_scale", 2)):  # the T axis
        np.testing.assert_array_equal(
            np.delete(np.asarray(written[name]), [3, 4], axis=axis),
            np.delete(np.asarray(cache[name]), [3, 4], axis=axis),
        )
    dead = write(written, jnp.asarray(k) + 1, jnp.asarray(v) + 1, 3, live=jnp.bool_(False))
    for name in written:
        np.testing.assert_array_equal(dead[name], written[name])


def dequantized(w8):
    """The weights with every Int8 replaced by values · scale, in float32."""
    is_int8 = lambda n: isinstance(n, quantize.Int8)  # noqa: E731
    return jax.tree.map(lambda n: quantize.dequantize(n) if is_int8(n) else n, w8, is_leaf=is_int8)


def dense_copy(cache8):
    """An int8 cache as the full-precision cache it stands for: values · scales."""
    return [
        {
            "k": layer["k"] * layer["k_scale"][:, :, None],
            "v": layer["v"] * layer["v_scale"][..., None],
        }
        for layer in cache8
    ]


def within_half_a_step(approx, exact):
    """|approx - exact| <= scale / 2 for vectors over the last axis, scale = max |exact| / 127."""
    scale = np.abs(np.asarray(exact, np.float64)).max(axis=-1, keepdims=True) / 127
    return np.all(np.abs(np.asarray(approx) - np.asarray(exact)) <= scale * (0.5 + 127 * EPS32))


def test_int8_decode_equals_the_full_step_on_the_dequantized_weights_and_cache(cfg, params):
    """Teacher-forced from a prompt, each step with int8 weights and an int8 cache
    gives the logits of the full-precision step on what they stand for, the
    dequantized weights and cache. The two differ only in where each scale
    multiplies (after a dot instead of before it): float32 rounding, a few 2^-24
    of each dot's sum of |terms|: 5e-5 at most for these logits of up to 34. Each
    slot written (by prefill, then by each step) holds its key and value within
    half a step of the full-precision ones."""
    w8 = layout.quantize_decode_weights(decode_weights(params, cfg))
    reference = dequantized(w8)
    tokens = prompts(cfg, length=cfg.seq, seed=2)
    logits8, cache8 = kv_cache.prefill(params, tokens[:, :P], cfg, int8_cache=True)
    logits, cache = kv_cache.prefill(params, tokens[:, :P], cfg)
    np.testing.assert_array_equal(logits8, logits)  # prefill computes in full precision
    for layer8, layer in zip(dense_copy(cache8), cache, strict=True):
        assert within_half_a_step(jnp.swapaxes(layer8["k"], 2, 3), jnp.swapaxes(layer["k"], 2, 3))
        assert within_half_a_step(layer8["v"], layer["v"])
    step = jax.jit(kv_cache.decode_step, static_argnames="cfg")
    for pos in range(P, cfg.seq):
        want, written = step(reference, dense_copy(cache8), tokens[:, pos], pos, cfg=cfg)
        got, cache8 = step(w8, cache8, tokens[:, pos], pos, cfg=cfg)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=pos)
        for layer8, layer in zip(dense_copy(cache8), written, strict=True):
            assert within_half_a_step(layer8["k"][..., pos], layer["k"][..., pos]), pos
            assert within_half_a_step(layer8["v"][:, :, pos], layer["v"][:, :, pos]), pos


def test_generate_passes_int8_through_with_one_compile_per_kind(cfg, params):
    """generate with int8 weights and cache: the greedy tokens of prefill into an
    int8 cache and int8 decode steps, taken by hand; then other prompt lengths
    and counts compile nothing more."""
    n = 6
    out = kv_cache.generate(params, cfg, prompts(cfg), n, int8_weights=True, int8_cache=True)
    w8 = layout.quantize_decode_weights(decode_weights(params, cfg))
    logits, cache = kv_cache.prefill(params, prompts(cfg), cfg, int8_cache=True)
    step = jax.jit(kv_cache.decode_step, static_argnames="cfg")
    expected = [prompts(cfg)]
    for pos in range(P, P + n):
        expected.append(jnp.argmax(logits, axis=-1)[:, None])
        logits, cache = step(w8, cache, expected[-1][:, 0].astype(jnp.int32), pos, cfg=cfg)
    np.testing.assert_array_equal(out, jnp.concatenate(expected, axis=1))
    before = kv_cache.decode_steps._cache_size()
    for length, n in ((P + 2, 3), (1, 9)):
        kinds = {"int8_weights": True, "int8_cache": True}
        kv_cache.generate(params, cfg, prompts(cfg, length=length), n, **kinds)
    assert kv_cache.decode_steps._cache_size() == before


def test_int8_bytes_by_hand(cfg, params):
    """The cache: per layer, row, position and head, D keys and D values of 1 byte
    and a float32 scale for each. The weights: 1 byte a matmul weight and 4 a
    scale, per layer q, k, v [H, D] scales, o [E], the MLP's [F] and [E]; the
    embedding [V, E] and its V row scales; norms and positions in float32."""
    L, E, F, H, D, V, T = cfg.layers, cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.vocab, cfg.seq
    cache = kv_cache.init_cache(cfg, B, int8=True)
    assert kv_cache.cache_bytes(cache) == 2 * L * B * T * H * (D + 4)
    w8 = layout.quantize_decode_weights(decode_weights(params, cfg))
    layer = 4 * E * H * D + 2 * E * F + 4 * (3 * H * D + E + F + E) + 2 * E * 4
    assert quantize.stored_bytes(w8) == L * layer + V * E + 4 * V + T * E * 4 + E * 4


def test_the_full_decode_path_s_validation_loss_is_the_model_s(cfg, params):
    """quality.val_loss teacher-forces decode_step over every position: in
    full precision, the loss of the model's forward pass, by NumPy's log-softmax;
    with int8 weights and cache, another number (the path it claims to measure)."""
    tokens = prompts(cfg, length=cfg.seq + 1, seed=4)
    batches = [{"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}]
    logits = np.asarray(model(params, tokens[:, :-1], cfg=cfg), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, np.asarray(tokens[:, 1:])[..., None], -1).mean()
    assert quality.val_loss(params, cfg, batches) == pytest.approx(expected, rel=1e-5)
    # int8 weights: the loss of the model whose weights are their round trip, put
    # back in training's layout (float32: the rounding order moves it by ~1e-6).
    w = dequantized(layout.quantize_decode_weights(decode_weights(params, cfg)))

    def back(path, x):
        order = out_in_order(path, x.ndim)
        return x if order is None else jnp.transpose(x, np.argsort(order))

    round_trip = jax.tree_util.tree_map_with_path(back, w)
    expected8 = cross_entropy(model(round_trip, tokens[:, :-1], cfg=cfg), tokens[:, 1:])
    int8 = quality.val_loss(params, cfg, batches, int8_weights=True)
    assert int8 == pytest.approx(float(expected8), rel=1e-5) and int8 != pytest.approx(expected)


def test_greedy_agreement_counts_the_positions_that_match(cfg, params):
    full = kv_cache.generate(params, cfg, prompts(cfg), 8)
    int8 = kv_cache.generate(params, cfg, prompts(cfg), 8, int8_weights=True)
    same = np.asarray(full[:, P:] == int8[:, P:])
    assert quality.greedy_agreement(params, cfg, prompts(cfg), 8) == 1.0
    agreement = quality.greedy_agreement(params, cfg, prompts(cfg), 8, int8_weights=True)
    assert agreement == same.sum() / same.size

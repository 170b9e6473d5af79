"""The model's concepts, as properties: causality, order (in)variance,
session 1's one-token dependence, and attention against the library's."""

import dataclasses
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sessions.model import forward, init_params
from sessions.model.attention import attention, einsum_attention, fused_attention
from sessions.model.transformer import cross_entropy

B, S = 2, 6


def tokens(seed=1, batch=B, seq=S):
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, 256)


def test_api_shapes_and_plain_dict(cfg, key):
    params = init_params(cfg, key)
    assert isinstance(params, dict) and isinstance(params["layers"], list)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
    assert params["layers"][0]["wq"].shape == (cfg.embed, cfg.heads, cfg.head_dim)
    logits = forward(params, tokens(), cfg)
    assert logits.shape == (B, S, cfg.vocab) and logits.dtype == jnp.float32


def test_first_loss_matches_the_init_scale(cfg, key):
    """Logits of unit std at init: the expected loss is ln(V) + 1/2 (the log of
    a sum of V lognormals), so a wrongly scaled init shows up here."""
    params = init_params(cfg, key)
    inputs, targets = tokens(seed=1, batch=8, seq=cfg.seq), tokens(seed=2, batch=8, seq=cfg.seq)
    loss = cross_entropy(forward(params, inputs, cfg), targets)
    assert abs(float(loss) - (math.log(256) + 0.5)) < 0.2


def test_cross_entropy_matches_one_hot_definition():
    logits = jax.random.normal(jax.random.key(3), (B, S, 256))
    targets = tokens(seed=4)
    one_hot = jax.nn.one_hot(targets, 256)
    expected = -jnp.mean(jnp.sum(one_hot * jax.nn.log_softmax(logits), axis=-1))
    np.testing.assert_allclose(cross_entropy(logits, targets), expected, rtol=1e-6)


def test_causal_no_output_depends_on_a_later_token(cfg, key):
    params = init_params(cfg, key)
    t = tokens()
    base = forward(params, t, cfg)
    for s in range(S - 1):
        changed = t.at[:, s + 1 :].set((t[:, s + 1 :] + 7) % 256)
        out = forward(params, changed, cfg)
        np.testing.assert_allclose(out[:, : s + 1], base[:, : s + 1], atol=1e-5)
        assert not np.allclose(out[:, s + 1 :], base[:, s + 1 :], atol=1e-5)


def _one_layer(cfg, positions):
    return dataclasses.replace(cfg, layers=1, positions=positions)


def test_without_positions_earlier_tokens_are_a_set(cfg, key):
    """Causal attention alone: the last output sees tokens 0..S-2 as a set."""
    c = _one_layer(cfg, positions=False)
    params = init_params(c, key)
    t = tokens()
    permuted = t.at[:, : S - 1].set(t[:, : S - 1][:, ::-1])
    assert not np.array_equal(t, permuted)
    last = forward(params, t, c)[:, -1]
    np.testing.assert_allclose(forward(params, permuted, c)[:, -1], last, atol=1e-5)


def _norm(x, scale):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def reference_forward(params, t, cfg):
    """The model written out plainly in numpy (float64), after the module
    docstring: token embedding plus pos[s] at position s; per layer
    x + attention(norm(x)), then x + MLP(norm(x)) with ReLU; the final norm;
    logits through the tied embedding."""
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    t = np.asarray(t)
    S, D = t.shape[1], cfg.head_dim
    x = p["embed"][t] + (p["pos"][:S] if cfg.positions else 0)
    causal = np.tril(np.ones((S, S), bool))
    for layer in p["layers"]:
        if cfg.attention:
            h = _norm(x, layer["attn_norm"])
            q, k, v = (np.einsum("BSE,EHD->BSHD", h, layer[w]) for w in ("wq", "wk", "wv"))
            scores = np.where(causal, np.einsum("BSHD,BTHD->BHST", q, k) / np.sqrt(D), -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out = np.einsum("BHST,BTHD->BSHD", probs, v)
            x = x + np.einsum("BSHD,HDE->BSE", out, layer["wo"])
        h = _norm(x, layer["mlp_norm"])
        x = x + np.maximum(h @ layer["w_in"], 0) @ layer["w_out"]
    return _norm(x, p["final_norm"]) @ p["embed"].T


def _louder_positions(params):
    """The learned table starts at std 0.01; scaled up, a position mix-up is
    far outside the tolerance."""
    return {**params, "pos": params["pos"] * 30}


@pytest.mark.parametrize("attention", [True, False])
def test_forward_equals_the_plain_reference(cfg, key, attention):
    c = dataclasses.replace(cfg, attention=attention)
    params = _louder_positions(init_params(c, key))
    t = tokens()
    np.testing.assert_allclose(forward(params, t, c), reference_forward(params, t, c), atol=1e-4)


def test_zero_blocks_are_the_identity_and_position_s_gets_pos_s(cfg, key):
    """With the projections back into the residual stream (wo, w_out) zero,
    every block adds nothing, so the logits at position s are those of token
    s's embedding plus pos[s] alone, through the final norm and the tied
    output: for S=6 < cfg.seq, rows 0..5 of the table, in order."""
    params = _louder_positions(init_params(cfg, key))
    params["layers"] = [
        {**layer, "wo": layer["wo"] * 0, "w_out": layer["w_out"] * 0} for layer in params["layers"]
    ]
    t = tokens()
    logits = forward(params, t, cfg)
    E, pos = np.asarray(params["embed"], np.float64), np.asarray(params["pos"], np.float64)
    for s in range(S):
        x = _norm(E[np.asarray(t[:, s])] + pos[s], np.asarray(params["final_norm"]))
        np.testing.assert_allclose(logits[:, s], x @ E.T, atol=1e-4, err_msg=f"position {s}")


def test_session_one_block_sees_only_its_own_token(cfg, key):
    """attention=False: output s is a function of token s alone."""
    c = dataclasses.replace(cfg, attention=False, positions=False)
    params = init_params(c, key)
    assert "wq" not in params["layers"][0] and "pos" not in params
    t = tokens()
    out = forward(params, t, c)
    for s in range(S):
        alone = forward(params, t[:, s : s + 1], c)[:, 0]
        np.testing.assert_allclose(out[:, s], alone, atol=1e-5)
    # Change every other token: position 2's output must not move.
    others = jnp.where(jnp.arange(S) == 2, t, (t + 11) % 256)
    np.testing.assert_allclose(forward(params, others, c)[:, 2], out[:, 2], atol=1e-5)


def qkv(seed=0, heads=3, dim=8):
    k = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(ki, (B, S, heads, dim)) for ki in k]


def test_einsum_attention_matches_the_library():
    q, k, v = qkv()
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(einsum_attention(q, k, v), expected, atol=1e-5)
    np.testing.assert_allclose(fused_attention(q, k, v), expected, atol=1e-5)


def test_one_query_by_hand():
    """Query s: dot with keys 0..s, softmax, weighted sum of values."""
    q, k, v = (np.asarray(x) for x in qkv(seed=5))
    out = np.asarray(attention(*(jnp.asarray(x) for x in (q, k, v))))
    b, s, h = 1, 3, 2
    scores = np.array([q[b, s, h] @ k[b, t, h] for t in range(s + 1)]) / np.sqrt(8)
    weights = np.exp(scores - scores.max())
    weights /= weights.sum()
    np.testing.assert_allclose(out[b, s, h], weights @ v[b, : s + 1, h], rtol=1e-5)


def test_segments_never_attend_to_each_other():
    """Two documents packed in one row equal each one run alone."""
    q, k, v = qkv(seed=2)
    segment_ids = jnp.array([[0, 0, 0, 1, 1, 1]] * B)
    packed = attention(q, k, v, segment_ids)
    first = attention(q[:, :3], k[:, :3], v[:, :3])
    second = attention(q[:, 3:], k[:, 3:], v[:, 3:])
    np.testing.assert_allclose(packed, jnp.concatenate([first, second], axis=1), atol=1e-5)
    np.testing.assert_allclose(fused_attention(q, k, v, segment_ids), packed, atol=1e-5)


def test_bfloat16_forward_is_close_to_float32(cfg, key):
    params = init_params(cfg, key)
    t = tokens()
    full = forward(params, t, cfg)
    half = forward(params, t, dataclasses.replace(cfg, dtype="bfloat16"))
    assert half.dtype == jnp.bfloat16  # logits in the compute dtype: the loss sums in f32
    np.testing.assert_allclose(half.astype(jnp.float32), full, atol=0.05)
    targets = jnp.roll(t, -1, axis=1)
    assert float(cross_entropy(half, targets)) == pytest.approx(
        float(cross_entropy(full, targets)), abs=0.01
    )


ALPHABET = set("BSTEFHDVLKG")  # K key/value heads, G query heads per K (GQA)
EINSUM = re.compile(r"einsum\(\s*\"([^\"]+)\"")


@pytest.mark.parametrize("folder", ["sessions", "roofline"])
def test_einsums_use_the_dimension_alphabet(folder):
    """Every einsum string in the code uses only the course's letters."""
    root = pathlib.Path(__file__).parent.parent / folder
    found = 0
    for path in root.rglob("*.py"):
        for spec in EINSUM.findall(path.read_text()):
            found += 1
            letters = set(spec.replace(",", "").replace("->", "").replace(" ", ""))
            assert letters <= ALPHABET, f"{path.name}: '{spec}' uses {letters - ALPHABET}"
    assert found or folder != "sessions"

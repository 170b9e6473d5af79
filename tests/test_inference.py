"""The cached decoder against the model it caches: the same tokens, the same
logits, the napkin's bytes, a reproducible sample, the same output on a mesh;
and the session script's bad inputs and summary."""

import dataclasses
import functools
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, s3_in_process

from roofline.decode_cost import kv_cache_bytes
from scripts.harness.naive_step import uncached_generate
from sessions.errors import UsageError
from sessions.inference import kv_cache, layout
from sessions.inference.sample import sample_text as generate_text
from sessions.model import forward, init_params
from sessions.shard import sharding

B, P = 2, 5
model = jax.jit(forward, static_argnames="cfg")  # one compile, not the model op by op


def prompts(cfg, batch=B, length=P, seed=1):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, cfg.vocab)


@pytest.fixture(scope="module")
def params(cfg, key):
    """Weights scaled up, so the greedy continuation wanders over many bytes
    instead of repeating one: an off-by-one then changes the tokens."""
    return jax.tree.map(lambda w: 3 * w, init_params(cfg, key))


def test_greedy_equals_the_uncached_argmax_at_every_position(cfg, params):
    out = kv_cache.generate(params, cfg, prompts(cfg), cfg.seq - P)
    assert out.shape == (B, cfg.seq) and out.dtype == jnp.int32
    np.testing.assert_array_equal(out[:, :P], prompts(cfg))
    assert len(np.unique(np.asarray(out[:, P:]))) > 3, "a degenerate continuation tests little"
    # The model without a cache, over the growing sequence. It is causal, so the
    # sequence can sit at the start of a fixed [B, S] window: one compile.
    seq = jnp.zeros((B, cfg.seq), jnp.int32).at[:, :P].set(prompts(cfg))
    for n in range(P, cfg.seq):
        nxt = jnp.argmax(model(params, seq, cfg=cfg)[:, n - 1], axis=-1)
        seq = seq.at[:, n].set(nxt)
    np.testing.assert_array_equal(out, seq)


def test_each_decode_step_gives_the_model_s_logits(cfg, params):
    """Teacher-forced: fed the same tokens, the cache's logits equal forward's at every position."""
    tokens = prompts(cfg, length=cfg.seq, seed=2)
    expected = model(params, tokens, cfg=cfg)  # [B, S, V]
    logits, cache = kv_cache.prefill(params, tokens[:, :P], cfg)
    np.testing.assert_allclose(logits, expected[:, P - 1], atol=1e-3, rtol=1e-3)
    step = jax.jit(kv_cache.decode_step, static_argnames="cfg")  # pos traced: one compile
    w = layout.decode_weights(params, cfg)
    for pos in range(P, cfg.seq):
        logits, cache = step(w, cache, tokens[:, pos], pos, cfg=cfg)
        np.testing.assert_allclose(logits, expected[:, pos], atol=1e-3, rtol=1e-3, err_msg=pos)


def test_a_timed_decode_call_repeats_the_same_slots(cfg, params):
    """s3_infer.py times repeatable_decode's call again and again: each call samples
    the n tokens after the prompt (the first as generate does, with the same key)
    and writes only those slots, however often it runs."""
    key, n = jax.random.key(3), cfg.seq - P - 2
    logits, cache = kv_cache.prefill(params, prompts(cfg), cfg)
    tokens = jnp.pad(prompts(cfg), ((0, 0), (0, cfg.seq - P)))
    w = layout.decode_weights(params, cfg)
    call = kv_cache.repeatable_decode(w, cache, tokens, logits, P, n, key, cfg)
    expected = kv_cache.generate(params, cfg, prompts(cfg), n, key=key, temperature=1.0)
    np.testing.assert_array_equal(call()[0][:, : P + n], expected)
    for _ in range(2):  # the cache and tokens were donated: each call takes the last's
        out = np.asarray(call()[0])
        np.testing.assert_array_equal(out[:, :P], prompts(cfg))
        assert (out[:, P + n :] == 0).all() and (out[:, P : P + n] != 0).any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_bytes_equal_the_napkin(cfg, params, dtype):
    c = dataclasses.replace(cfg, dtype=dtype)
    _, cache = kv_cache.prefill(params, prompts(c), c)
    assert {x.dtype for x in jax.tree.leaves(cache)} == {jnp.dtype(dtype)}
    per_value = 4 if dtype == "float32" else 2
    napkin = 2 * c.layers * B * c.seq * c.heads * c.head_dim * per_value
    assert kv_cache.cache_bytes(cache) == napkin == kv_cache_bytes(c, B)


def test_sampling_is_reproducible_from_its_key(cfg, params):
    def sample(seed):
        key = jax.random.key(seed)
        return kv_cache.generate(params, cfg, prompts(cfg), 8, key=key, temperature=1.0)

    first = sample(0)
    np.testing.assert_array_equal(first, sample(0))
    assert not np.array_equal(first, sample(1))
    greedy = kv_cache.generate(params, cfg, prompts(cfg), 8)
    assert not np.array_equal(first, greedy)
    # Near-uniform: a fresh draw per step gives many bytes; one key reused for every step, one.
    hot = kv_cache.generate(params, cfg, prompts(cfg), 8, key=jax.random.key(0), temperature=1e6)
    assert len(np.unique(np.asarray(hot[0, P:]))) > 4


def test_one_compile_per_shape(cfg, params):
    """Prompt lengths and step counts are arguments of the decode loop, not shapes."""
    kv_cache.generate(params, cfg, prompts(cfg), 3)
    before = kv_cache.decode_steps._cache_size()
    for length, n in ((P, 4), (P + 2, 1), (1, cfg.seq - 1)):
        kv_cache.generate(params, cfg, prompts(cfg, length=length), n)
    assert kv_cache.decode_steps._cache_size() == before


@pytest.mark.parametrize("n", [3, 11])
def test_a_call_s_steps_past_n_change_nothing(cfg, params, n):
    """decode_steps always runs kv_cache.STEPS steps (its loop's count is a
    constant); those from n on must leave every token, cache slot and the
    logits as they were. Against n steps taken by hand, from a cache and tokens
    marked past the prompt: n=3 stops mid-context; n=11 fills the context
    (P + 11 = T), so the steps past it would write at clamped positions, over
    the last real slot."""
    assert n < kv_cache.STEPS and P + n <= cfg.seq
    w = layout.decode_weights(params, cfg)
    logits, cache = kv_cache.prefill(params, prompts(cfg), cfg)
    mark = [{"k": c["k"].at[..., P:].set(7.0), "v": c["v"].at[:, :, P:].set(7.0)} for c in cache]
    tokens = jnp.full((B, cfg.seq), -1, jnp.int32).at[:, :P].set(prompts(cfg))
    step = jax.jit(kv_cache.decode_step, static_argnames="cfg")
    want_tokens, want_cache, want_logits = tokens, mark, logits
    for pos in range(P, P + n):
        token = jnp.argmax(want_logits, axis=-1).astype(jnp.int32)
        want_tokens = want_tokens.at[:, pos].set(token)
        want_logits, want_cache = step(w, want_cache, token, pos, cfg=cfg)
    copy = functools.partial(jax.tree.map, jnp.copy)  # decode_steps donates cache and tokens
    got_tokens, got_cache, got_logits = kv_cache.decode_steps(
        w, copy(mark), copy(tokens), logits, P, n, jax.random.key(0), 0.0, cfg=cfg, greedy=True
    )
    np.testing.assert_array_equal(got_tokens, want_tokens)  # -1 from P + n on
    np.testing.assert_allclose(got_logits, want_logits, atol=1e-5, rtol=1e-5)
    for got, want in zip(got_cache, want_cache, strict=True):
        np.testing.assert_allclose(got["k"], want["k"], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got["v"], want["v"], atol=1e-5, rtol=1e-5)
        assert np.all(np.asarray(got["k"][..., P + n :]) == 7.0)  # untouched, exactly
        assert np.all(np.asarray(got["v"][:, :, P + n :]) == 7.0)


def test_the_decode_loop_copies_no_weight_and_no_cache(cfg, params):
    """Each step must only read the weights and the cache: a copy of either,
    every step, would double decode's memory traffic. Every copy or transpose
    in the compiled loop is of one token's activations: smaller than any
    weight and than one layer's cache."""
    batch = 2
    weights = layout.decode_weights(params, cfg)
    tokens = jnp.zeros((batch, cfg.seq), jnp.int32)
    logits = jnp.zeros((batch, cfg.vocab), jnp.float32)
    compiled = kv_cache.decode_steps.lower(
        weights,
        kv_cache.init_cache(cfg, batch),
        tokens,
        logits,
        P,
        4,
        jax.random.key(0),
        1.0,
        cfg=cfg,
        greedy=True,
    ).compile()
    smallest_weight = min(w.size for w in jax.tree.leaves(params["layers"]) if w.ndim >= 2)
    layer_cache = batch * cfg.heads * cfg.head_dim * cfg.seq
    copied = [
        math.prod(int(d) for d in dims.split(",") if d)
        for dims in re.findall(
            r"= \w+\[([\d,]*)\]\{[\d,]*\} (?:copy|transpose)\(", compiled.as_text()
        )
    ]
    assert copied, "the parser found no copy at all: check the pattern against the HLO"
    assert max(copied) < min(smallest_weight, layer_cache), sorted(copied)[-3:]


def test_sharded_equals_one_device(cfg, key):
    """On a data x fsdp x tp mesh of 8 devices the cache is split like the
    activations, and a sample (its key folded per position) is the one of one device."""
    c = dataclasses.replace(cfg, heads=2)  # tp=2 must divide H, F and V
    batch, sizes = 4, {"data": 2, "fsdp": 2, "tp": 2}
    sharding.check_divisible(c, batch, sizes)

    def init(k):
        return jax.tree.map(lambda w: 3 * w, init_params(c, k))

    def sample(params, tokens):
        n = c.seq - P
        return kv_cache.generate(params, c, tokens, n, key=jax.random.key(5), temperature=0.5)

    one_device = init(key)
    expected = sample(one_device, prompts(c, batch=batch))
    mesh = sharding.make_mesh(sizes)
    with jax.set_mesh(mesh):
        # The same weights placed by the partition rules (tests/test_multichip.py holds
        # that init_sharded builds these very shards; compiling it here would add nothing).
        params = jax.device_put(one_device, sharding.tree_shardings(one_device, mesh))
        tokens = jax.device_put(prompts(c, batch=batch), sharding.batch_sharding(mesh))
        _, cache = kv_cache.prefill(params, tokens, c)
        for layer in cache:  # rows over data x fsdp = 4, heads over tp = 2
            k, v = layer["k"], layer["v"]
            assert k.sharding.shard_shape(k.shape) == (1, 1, c.head_dim, c.seq)
            assert v.sharding.shard_shape(v.shape) == (1, 1, c.seq, c.head_dim)
        # Decode's transposed weights keep their splits: heads and F over tp, E over fsdp.
        layer = layout.decode_weights(params, c)["layers"][0]
        E, F, H, D = c.embed, c.ff, c.heads, c.head_dim
        assert layer["wq"].sharding.shard_shape(layer["wq"].shape) == (H // 2, D, E // 2)
        assert layer["wo"].sharding.shard_shape(layer["wo"].shape) == (E // 2, H // 2, D)
        assert layer["w_in"].sharding.shard_shape(layer["w_in"].shape) == (F // 2, E // 2)
        assert layer["w_out"].sharding.shard_shape(layer["w_out"].shape) == (E // 2, F // 2)
        out = sample(params, tokens)
    np.testing.assert_array_equal(out, expected)


def test_the_text_helper_slides_past_the_context(cfg, params):
    """s2_train's closing sample: more bytes than the context holds, and its
    first window is the cached decoder's own continuation."""
    text = generate_text(params, cfg, "abc", 2 * cfg.seq, jax.random.key(0), temperature=0.0)
    first = kv_cache.generate(params, cfg, jnp.array([list(b"abc")]), cfg.seq - 3)
    window = bytes(np.asarray(first[0]).astype(np.uint8).tolist()).decode("utf-8", "replace")
    assert text.startswith(window[:-1])  # a byte sequence cut at the end decodes differently
    assert len(text.encode("utf-8")) >= 3 + 2 * cfg.seq  # "\ufffd" for a bad byte is 3 bytes


def test_the_benchmark_s_baseline_does_the_same_work(cfg, params):
    """scripts/bench_decode.py's ratio compares equal work: the old uncached
    generator's greedy tokens are the cached decoder's."""
    prompt, n = np.asarray(prompts(cfg)[0]), cfg.seq - P
    cached = kv_cache.generate(params, cfg, prompt[None], n)[0].tolist()
    assert uncached_generate(params, cfg, prompt.tolist(), n) == cached


@pytest.mark.parametrize(
    "shape, n_new, why",
    [((B, 0), 4, "empty"), ((B, 17), 0, "longer than the context"), ((B, P), 12, "do not fit")],
)
def test_bad_lengths_are_usage_errors(cfg, params, shape, n_new, why):
    with pytest.raises(UsageError, match=why):
        kv_cache.generate(params, cfg, jnp.zeros(shape, jnp.int32), n_new)


TINY = ["--random-params", "--preset", "tiny"]


@pytest.mark.parametrize(
    "argv, why",
    [
        ([*TINY, "--prompt", "x" * 65], "longer than the context"),
        ([*TINY, "--prompt", "abc", "--new-tokens", "62"], "do not fit the context"),
        ([*TINY, "--new-tokens", "44"], "ask for at most 43 new tokens"),  # asked: not cut
        ([*TINY, "--prompt", "x" * 64], "ask for at most 0 new tokens"),  # no room by default
        ([*TINY, "--run-dir", os.path.join(REPO, "pyproject.toml")], "a file, not a folder"),
        ([*TINY, "--prompt", ""], "empty"),
        ([*TINY, "--mesh", "data=8", "--batches", "1,8"], "1 does not divide"),
        ([*TINY, "--batches", "1,x"], "--batches"),
        ([*TINY, "--batch", "4"], "training flag"),
        (["--checkpoint-dir", "/nonexistent/checkpoints"], "--checkpoint-every"),
        (["--embed", "32"], "the checkpoint has embed=48, not embed=32"),
        ([*TINY, "--kv-heads", "3"], "--kv-heads 3 must divide the 4 query heads"),
        # A checkpoint trained with other positions or K than the flags ask for.
        (["--kv-heads", "2"], "the checkpoint has kv_heads=4, not kv_heads=2"),
        # Held to the checkpoint's 4 heads, not the cpu preset's 2 it never serves.
        (["--kv-heads", "3"], "the checkpoint has kv_heads=4, not kv_heads=3"),
        (
            ["--rope", "--gated"],
            "the checkpoint has rope=False, gated=False, not rope=True, gated=True",
        ),
        (["--untied"], "the checkpoint has tied=True, not tied=False"),
    ],
)
def test_s3_bad_input_is_one_line_and_exit_2(argv, why, capsys, checkpoint_dir):
    if argv[0] != "--checkpoint-dir" and "--random-params" not in argv:
        argv = ["--checkpoint-dir", checkpoint_dir, *argv]
    code, _, err = s3_in_process(argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and why in err, err


def test_s3_from_a_checkpoint_on_the_preset_s_defaults_and_its_summary(
    tmp_path, capsys, checkpoint_dir
):
    """The tiny preset's context of 64 holds the 21-byte prompt and 43 new tokens:
    by default s3 decodes what fits, up to 64. One run, from session 2's checkpoint,
    at two batches: what it prints, its summary and its plot."""
    summary = tmp_path / "s3.json"
    argv = ["--checkpoint-dir", checkpoint_dir, "--batches", "1,2"]
    code, out, err = s3_in_process(
        [*argv, "--summary-out", str(summary), "--run-dir", str(tmp_path)], capsys
    )
    assert code == 0, err
    assert "checkpoint at step 1" in out and "prompt 21 bytes, 43 decode steps" in out
    assert "sample:\nThe import statement " in out
    s = json.loads(summary.read_text())
    assert s["prefill_seconds"] > 0
    assert [r["batch"] for r in s["batches"]] == [1, 2]
    for r in s["batches"]:
        assert {"batch", "decode_tokens_per_sec", "step_seconds", "mbu", "mfu"} <= set(r)
        assert r["decode_tokens_per_sec"] == pytest.approx(r["batch"] / r["step_seconds"])
        assert r["mbu"] == pytest.approx(r["bytes_per_step"] / r["step_seconds"] / s["bandwidth"])
        # A CPU launches no kernels: its floor is the bytes' or the FLOPs' time, and nothing
        # is fitted for it, so no estimate (roofline/plan/decode_estimate.py).
        floor = max(r["memory_bound_seconds"], r["compute_bound_seconds"])
        assert r["floor_step_seconds"] == floor and r["estimate_step_seconds"] is None
        assert r["floor_bound"] == ("bytes" if floor == r["memory_bound_seconds"] else "FLOPs")
    assert (tmp_path / "decode_roofline.png").stat().st_size > 0

"""Session 6 (s6_memory), what fills a chip's memory in training: bytes a parameter
under the three published conventions; one layer's saved values a token under a remat
policy, against what JAX itself saves; the fewest chips that hold a published model's
state; gradient accumulation's equivalence to one batch; and a find-the-bug, remat
that saves everything.

Every expected number is worked out by hand in a comment, or read from JAX itself
(jax.ad_checkpoint.print_saved_residuals through tests/helpers.py), never from the
code under test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise
from helpers import residual_values

from sessions.model import init_params
from sessions.model.attention import attention
from sessions.model.config import ModelConfig
from sessions.model.remat import SAVED_NAMES
from sessions.model.transformer import block

from .expect import expect

bytes_per_parameter = exercise("training_memory.bytes_per_parameter")
saved_values = exercise("training_memory.saved_values")
fewest_chips = exercise("training_memory.fewest_chips")
bf16_gap = exercise("training_memory.bf16_gap")
saved_by_name = exercise("training_memory.saved_by_name")
korthikanti_bytes = exercise("training_memory.korthikanti_bytes")
chunked_cross_entropy = exercise("training_memory.chunked_cross_entropy")
accumulate = exercise("step.accumulate")
remat_layer = exercise("bug_remat.remat_layer")
residuals_counted = exercise("bug_remat.saved_values")

# Sizes that differ pairwise: E=24, F=40, H=4, K=2, D=6 (grouped-query); and K = H (no
# weight may lead with 32 or 2 x 16, the batch of tokens tests/helpers.py counts).
GQA = ModelConfig(embed=24, ff=40, heads=4, kv_heads=2, head_dim=6, layers=1, seq=16)
MHA = ModelConfig(embed=20, ff=36, heads=2, head_dim=10, layers=1, seq=16)


@pytest.mark.exercise("training_memory.bytes_per_parameter")
@pytest.mark.parametrize(
    "recipe, want, what",
    [
        (("bfloat16", False, None, "adamw", "float32"), 10, "the scaling book: 2 + 4 + 4"),
        (("bfloat16", True, "bfloat16", "adamw", "float32"), 16, "ZeRO: 2 + 4 + 2 + 4 + 4"),
        (("bfloat16", True, "float32", "adamw", "float32"), 18, "Megatron: 2 + 4 + 4 + 4 + 4"),
        (("float32", False, "float32", "adamw", "float32"), 16, "the course's: 4 + 4 + 4 + 4"),
        (("bfloat16", False, "bfloat16", "sgd", "bfloat16"), 6, "SGD in bf16: 2 + 2 + 2"),
    ],
)
def test_bytes_a_parameter_under_each_convention(recipe, want, what):
    expect(bytes_per_parameter(*recipe), want, "bytes", what)


def layer_residuals(cfg, policy):
    """What JAX saves of one layer of ours under the policy, values a token."""
    layer = init_params(cfg, jax.random.key(0))["layers"][0]

    def causal(q, k, v):
        return attention(q, k, v), None

    fn = jax.checkpoint(lambda w, x: block(w, x, cfg, causal)[0], policy=policy)
    return residual_values(lambda w, x: fn(w, x).sum(), layer, jnp.ones((2, 16, cfg.embed)))


@pytest.mark.exercise("training_memory.saved_values")
@pytest.mark.parametrize("cfg", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize(
    "policy, jax_policy",
    [
        ("block", jax.checkpoint_policies.nothing_saveable),
        ("dots", jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    ],
)
def test_one_layer_s_saved_values_are_what_jax_saves(cfg, policy, jax_policy):
    dims = (cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim)
    want = layer_residuals(cfg, jax_policy)
    expect(saved_values(*dims, policy), want, "values a token", f"{policy}, E, F, H, K, D = {dims}")


@pytest.mark.exercise("training_memory.saved_by_name")
@pytest.mark.parametrize("cfg", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("policy", ["save_qkv_proj", "save_dot_except_mlp"])
def test_a_policy_by_name_saves_what_jax_saves(cfg, policy):
    """Against JAX: the layer under save_only_these_names of the policy's names, as the
    step applies it (sessions/model/remat.py SAVED_NAMES)."""
    dims = (cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim)
    want = layer_residuals(cfg, jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES[policy]))
    expect(
        saved_by_name(*dims, policy), want, "values a token", f"{policy}, E, F, H, K, D = {dims}"
    )


@pytest.mark.exercise("training_memory.fewest_chips")
def test_the_fewest_chips_that_hold_a_published_model_s_state():
    # LLaMA-3-70B: 70,553,706,496 parameters at 12 bytes = 846.6 GB; a TPU v5p holds
    # 95 GiB (102,005,473,280 bytes): 8.30 chips' worth, so 9.
    expect(fewest_chips(70_553_706_496, 12, 95 * 2**30), 9, "chips", "LLaMA-3-70B, v5p")
    # LLaMA-3-8B: 8,030,261,248 parameters at 16 bytes = 128.5 GB; an H100's 80 GiB: 2.
    expect(fewest_chips(8_030_261_248, 16, 80 * 2**30), 2, "chips", "LLaMA-3-8B, H100")
    expect(fewest_chips(40, 1, 10), 4, "chips", "exactly four chips' worth")


@pytest.mark.exercise("training_memory.bf16_gap")
@pytest.mark.parametrize("weight", [1.0, 1.5, 0.02, 0.015625, 3.0, 1000.0])
def test_the_gap_above_a_bf16_weight_is_bf16_s_own(weight):
    """Against bfloat16 itself: jnp.nextafter in bf16, towards +inf. 0.015625 = 2^-6 sits
    on a power of two, where the gap above is twice the gap below."""
    w = jnp.asarray(weight, jnp.bfloat16)
    above = jnp.nextafter(w, jnp.asarray(jnp.inf, jnp.bfloat16))
    want = float(above.astype(jnp.float32) - w.astype(jnp.float32))
    expect(bf16_gap(float(w)), want, "", f"the gap above {float(w)} in bf16")


# GPT-3 175B as Korthikanti et al. train it: s 2,048, b 1, h 12,288, a 96, t 8. By hand,
# s·b·h = 25,165,824 and 5·a·s/h = 5 x 96 x 2,048 / 12,288 = 80:
#   no parallelism, t = 1        34 + 80                 = 114   -> 2,868,903,936 bytes
#   tensor parallel              10 + 24/8 + 80/8        = 23    ->   578,813,952
#   tensor + sequence parallel   34/8 + 80/8             = 14.25 ->   358,612,992
#   tensor parallel, selective   10 + 24/8               = 13    ->   327,155,712
#   tensor + sequence, selective 34/8                    = 4.25  ->   106,954,752
#   full recompute               2                               ->    50,331,648
@pytest.mark.exercise("training_memory.korthikanti_bytes")
@pytest.mark.parametrize(
    "t, sequence_parallel, recompute, want",
    [
        (1, False, "none", 2_868_903_936),
        (8, False, "none", 578_813_952),
        (8, True, "none", 358_612_992),
        (8, False, "selective", 327_155_712),
        (8, True, "selective", 106_954_752),
        (8, True, "full", 50_331_648),
    ],
)
def test_a_layer_s_activations_by_korthikanti_s_table(t, sequence_parallel, recompute, want):
    got = korthikanti_bytes(2048, 1, 12288, 96, t, sequence_parallel, recompute)
    what = f"GPT-3 175B a layer, t={t}, sequence parallel {sequence_parallel}, {recompute}"
    expect(got, pytest.approx(want), "bytes", what)


def naive_cross_entropy(x, unembed, targets):
    logits = x @ unembed
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(len(targets)), targets])


@pytest.mark.exercise("training_memory.chunked_cross_entropy")
@pytest.mark.parametrize("chunks", [1, 4, 8])
def test_the_chunked_loss_is_the_loss_and_its_gradient(chunks):
    kx, kw, kt = jax.random.split(jax.random.key(0), 3)
    x, unembed = jax.random.normal(kx, (64, 16)), jax.random.normal(kw, (16, 300)) / 4
    targets = jax.random.randint(kt, (64,), 0, 300)
    want, want_grads = jax.value_and_grad(naive_cross_entropy, (0, 1))(x, unembed, targets)
    got, grads = jax.value_and_grad(chunked_cross_entropy, (0, 1))(x, unembed, targets, chunks)
    expect(float(got), pytest.approx(float(want), rel=1e-5), "nats", f"{chunks} chunk(s)")
    for name, g, w in zip(("x", "unembed"), grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=f"d loss / d {name}")


@pytest.mark.exercise("training_memory.chunked_cross_entropy")
def test_the_chunked_loss_never_holds_the_whole_logits():
    """XLA's plan of the loss's gradient: 512 tokens of a 16,384 vocabulary are 33.6 MB
    of float32 logits (512 x 16,384 x 4), as much again for their gradient. In 16 chunks,
    one chunk's are 2.1 MB: the plan's temporaries stay below one whole [N, V] array."""
    x, unembed = jnp.zeros((512, 32)), jnp.zeros((32, 16_384))
    targets = jnp.zeros((512,), jnp.int32)
    grad = jax.jit(jax.grad(lambda x, w: chunked_cross_entropy(x, w, targets, 16), (0, 1)))
    temp = grad.lower(x, unembed).compile().memory_analysis().temp_size_in_bytes
    logits = 512 * 16_384 * 4
    expect(temp, below=logits, unit="bytes", what="the plan's temporaries, 16 chunks")


def squared_error(params, rows):
    """Mean over rows of |x·w + b - y|², rows [N, 5]: x the first 3 columns, y the last 2."""
    x, y = rows[:, :3], rows[:, 3:]
    return jnp.mean(jnp.sum((x @ params["w"] + params["b"] - y) ** 2, axis=1))


@pytest.mark.exercise("step.accumulate")
@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_microbatches_give_one_batch_s_loss_and_gradient(n):
    params = {"w": jnp.arange(6.0).reshape(3, 2) / 7, "b": jnp.array([0.5, -1.0])}
    batch = jax.random.normal(jax.random.key(0), (8, 5))
    loss, grads = jax.value_and_grad(squared_error)(params, batch)
    got_loss, got_grads = accumulate(squared_error, params, batch, n)
    expect(float(got_loss), pytest.approx(float(loss), rel=1e-6), "", f"the loss, {n} microbatches")
    for name in ("w", "b"):
        np.testing.assert_allclose(got_grads[name], grads[name], rtol=1e-5, err_msg=name)


def course_layer():
    """One layer of ours (GQA above) as f(weights, x), its weights, and x of 2 x 16."""
    layer = init_params(GQA, jax.random.key(0))["layers"][0]

    def fn(w, x):
        return block(w, x, GQA, lambda q, k, v: (attention(q, k, v), None))[0]

    return fn, layer, jnp.ones((2, 16, GQA.embed))


@pytest.mark.exercise("bug_remat.remat_layer")
def test_the_fixed_remat_keeps_the_layer_s_input_alone():
    fn, layer, x = course_layer()
    fixed = remat_layer(fn)
    np.testing.assert_allclose(fixed(layer, x), fn(layer, x), rtol=1e-6)
    kept = residual_values(lambda w, x: fixed(w, x).sum(), layer, x)
    expect(kept, GQA.embed, "values a token", "saved by the fixed remat (E, the input)")


@pytest.mark.exercise("bug_remat.saved_values")
def test_counting_what_the_backward_reads():
    # sin's backward reads cos(x): 3 values. A matmul's reads both operands: 4·5 + 2·4.
    expect(residuals_counted(lambda x: jnp.sin(x).sum(), jnp.ones(3)), 3, "values", "sin")
    matmul = residuals_counted(lambda w, x: (x @ w).sum(), jnp.ones((4, 5)), jnp.ones((2, 4)))
    expect(matmul, 28, "values", "x @ w")
    from solutions.bug_remat import broken_remat_layer

    fn, layer, x = course_layer()
    # Under nothing_saveable, the arguments alone: the layer's 3,696 weights (norms
    # 2·24, wq and wo 576 each, wk and wv 288 each, w_in and w_out 960 each) and x's
    # 2·16·24 = 768.
    fixed = jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)
    expect(residuals_counted(lambda w, x: fixed(w, x).sum(), layer, x), 4_464, "values", "block")
    broken = residuals_counted(lambda w, x: broken_remat_layer(fn)(w, x).sum(), layer, x)
    expect(broken, above=4 * 4_464, unit="values", what="the broken remat saves far more")

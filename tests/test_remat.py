"""Selective remat by name (sessions/model/remat.py, roofline/plan/saved_activations.py):
the layer names its tensors with checkpoint_name, MaxText's names where MaxText has one,
and naming changes no program; under every policy the napkin keeps what JAX saves, byte
for byte, and rebuilds what XLA's compiled step runs again, matmul FLOP for FLOP; --remat N
recomputes less as it keeps more; Korthikanti et al.'s selective recompute saves their
34·s·b·h; and a bad name is one line and exit status 2."""

import dataclasses
import itertools
import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import roofline_command

import sessions.model.transformer as transformer
from roofline.compiled.op_work import program_work
from roofline.plan.saved_activations import (
    ALL_NAMES,
    POLICIES,
    SAVED_BY_NAME,
    named_tensors,
    recompute_flops,
    remat_problem,
    saved_bytes,
    saved_per_layer_per_token,
)
from sessions.errors import UsageError
from sessions.model import init_params
from sessions.model.attention import attention
from sessions.model.config import PRESETS, PUBLISHED, ModelConfig
from sessions.model.remat import SAVED_NAMES, checkpoint_names, remat
from sessions.model.transformer import block
from sessions.train import step

# D = 64, as the flash kernels take; E, F, H·D, K·D all differ from B = 2 and B·S = 32.
CFG = ModelConfig(embed=48, ff=40, heads=2, kv_heads=1, head_dim=64, layers=1, seq=16)
NAMED = ("names:context,mlpwo", "names:out_proj", "names:attention_norm,mlp_activation")


def names_in(cfg):
    """The names in the jaxpr of cfg's layer: what checkpoint_name marks, in order."""
    layer = init_params(cfg, jax.random.key(0))["layers"][0]
    x = jnp.ones((2, cfg.seq, cfg.embed))
    jaxpr = jax.make_jaxpr(
        lambda w, x: block(w, x, cfg, lambda q, k, v: (attention(q, k, v), None))
    )
    return tuple(e.params["name"] for e in jaxpr(layer, x).jaxpr.eqns if e.primitive.name == "name")


@pytest.mark.parametrize("switches", [{}, {"gated": True}, {"attention": False}])
def test_the_layer_names_its_tensors_as_the_napkin_does(switches):
    cfg = dataclasses.replace(CFG, **switches)
    assert names_in(cfg) == checkpoint_names(cfg) == tuple(named_tensors(cfg))
    assert set(names_in(cfg)) <= set(ALL_NAMES)
    # The step's policies and the napkin's save the same names.
    assert {p: set(n) for p, n in SAVED_NAMES.items()} == {
        p: set(SAVED_BY_NAME[p]) for p in SAVED_NAMES
    }


def test_naming_changes_neither_the_program_nor_the_loss(monkeypatch):
    """Without remat, the step with its names and the step with checkpoint_name made the
    identity lower to the same StableHLO: a name is no op."""
    cfg = PRESETS["tiny"].model
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.seq + 1), 0, cfg.vocab)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    def lowered():
        return jax.jit(jax.value_and_grad(step.loss_fn), static_argnums=2).lower(params, batch, cfg)

    def jaxpr():
        return str(jax.make_jaxpr(lambda p, b: step.loss_fn(p, b, cfg))(params, batch))  # anew

    named, loss = lowered().as_text(), step.loss_fn(params, batch, cfg)
    assert "name[name=query_proj]" in jaxpr()
    monkeypatch.setattr(transformer, "checkpoint_name", lambda x, name: x)
    assert "name[name=" not in jaxpr()
    assert lowered().as_text() == named
    assert step.loss_fn(params, batch, cfg) == loss


def test_a_policy_by_name_gives_the_loss_and_gradients_of_none():
    """The tiny preset's step under MaxText's and Korthikanti's policies and a names:
    policy: what the backward rebuilds is what the forward computed."""
    cfg = PRESETS["tiny"].model
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.seq + 1), 0, cfg.vocab)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    grad = jax.jit(jax.value_and_grad(step.loss_fn), static_argnums=2)
    loss, grads = grad(params, batch, cfg)
    for policy in ("save_dot_except_mlp", "selective", NAMED[0]):
        other_loss, other_grads = grad(params, batch, dataclasses.replace(cfg, remat=policy))
        assert float(other_loss) == pytest.approx(float(loss), rel=1e-6), policy
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=policy)


def kept_bytes(fn, w, x):
    """Bytes a token of what JAX's vjp of fn(w, x) keeps for the backward, each buffer once:
    the residuals jax._src.ad_checkpoint.saved_residuals lists (it reads this same jaxpr),
    a reshape traced back to the value it reshapes (XLA's bitcast: the same bytes), the
    weights and a broadcast constant (XLA folds it into its reader) left out."""
    jaxpr = jax.make_jaxpr(lambda w, x: jax.vjp(fn, w, x))(w, x).jaxpr
    residuals = len(jax.tree.leaves(jax.eval_shape(lambda w, x: jax.vjp(fn, w, x)[1], w, x)))
    made_by = {v: e for e in jaxpr.eqns for v in e.outvars}
    roots = set()
    for v in jaxpr.outvars[len(jaxpr.outvars) - residuals :]:
        if isinstance(v, jax.extend.core.Literal):  # a constant, not a buffer a token
            continue
        while v in made_by and made_by[v].primitive.name in ("reshape", "reduce_precision"):
            v = made_by[v].invars[0]
        roots.add(v)
    B, S = x.shape[:2]
    total = 0
    for v in roots:
        if v in jaxpr.invars[:-1]:  # the weights
            continue
        e = made_by.get(v)
        if e and e.primitive.name == "broadcast_in_dim" and not e.invars[0].aval.shape:
            continue
        if v.aval.shape[:1] in ((B,), (B * S,)):  # per token: batch-led
            total += math.prod(v.aval.shape) * v.aval.dtype.itemsize
    return total / (B * S)


def jax_keeps(cfg, policy):
    dtype = jnp.dtype(cfg.dtype)
    layer = init_params(cfg, jax.random.key(0))["layers"][0]
    layer = jax.tree.map(lambda w: w.astype(dtype), layer)

    def attend(q, k, v):
        return attention(q, k, v, impl=cfg.attention_impl), None

    layer_fn = remat(lambda w, x: block(w, x, cfg, attend)[0], policy)
    x = jnp.ones((2, cfg.seq, cfg.embed), dtype)
    return kept_bytes(lambda w, x: layer_fn(w, x).astype(jnp.float32).sum(), layer, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gated", [False, True], ids=["relu", "gated"])
def test_the_napkin_keeps_what_jax_saves_under_every_policy(dtype, gated):
    cfg = dataclasses.replace(CFG, dtype=dtype, gated=gated)
    for policy in (*POLICIES, *NAMED):
        napkin = saved_bytes(saved_per_layer_per_token(cfg, policy), jnp.dtype(dtype).itemsize)
        assert napkin == jax_keeps(cfg, policy), policy


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl, seq", [("pallas", 16), ("splash", 128)])
def test_with_a_flash_kernel_too(impl, seq, dtype):
    """Our Pallas kernel and JAX's splash (traced here, not run: S = 128, its smallest
    block), which keep their log-sum-exp and heads-first copies instead of the [S, S]."""
    cfg = dataclasses.replace(CFG, dtype=dtype, attention_impl=impl, seq=seq)
    for policy in ("none", "dots", "selective"):
        napkin = saved_bytes(saved_per_layer_per_token(cfg, policy), jnp.dtype(dtype).itemsize)
        assert napkin == jax_keeps(cfg, policy), policy


# Scanned, where every compiler keeps remat's rebuilding in the backward (XLA's CPU
# backend merges some of it back into the forward when the layers are unrolled).
SCANNED = ModelConfig(embed=64, ff=256, heads=4, kv_heads=2, head_dim=16, layers=2, seq=16,
                      vocab=64, scan_layers=True)  # fmt: skip


def matmul_flops(cfg):
    """The matmul FLOPs of the gradient of cfg's layers, scanned, over 4 sequences:
    compiled, read from the HLO by the course's counter (roofline/compiled/op_work.py),
    each loop's body counted once a trip."""
    layers = init_params(cfg, jax.random.key(0))["layers"]
    stacked = jax.tree.map(lambda *w: jnp.stack(w), *layers)
    layer_fn = remat(lambda w, x: block(w, x, cfg, lambda q, k, v: (attention(q, k, v), None))[0],
                     cfg.remat)  # fmt: skip

    def loss(stacked, x):
        return jax.lax.scan(lambda x, w: (layer_fn(w, x), None), x, stacked)[0].sum()

    x = jnp.ones((4, cfg.seq, cfg.embed))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(stacked, x).compile()
    return sum(w.unpadded_matmul_flops * w.count for w in program_work(compiled.as_text()))


@pytest.mark.parametrize("gated", [False, True], ids=["relu", "gated"])
def test_the_recompute_is_the_matmuls_xla_runs_again(gated):
    """The compiled gradient's matmul FLOPs under each policy, less those without remat:
    the napkin's recompute, exactly. XLA's own cost_analysis() adds the elementwise
    FLOPs (norms, softmax) the napkin leaves out, and counts a loop's body once."""
    cfg = dataclasses.replace(SCANNED, gated=gated)
    plain = matmul_flops(cfg)
    # minimal rebuilds as dots does, full as block: each compile costs seconds.
    policies = ("block", "dots", "save_qkv_proj", "save_dot_except_mlp", "selective")
    policies = (NAMED[1],) if gated else policies
    for policy in policies:
        rebuilt = matmul_flops(dataclasses.replace(cfg, remat=policy)) - plain
        assert rebuilt == recompute_flops(cfg, 4, policy), policy


def test_recompute_by_hand():
    """SCANNED a layer a token: q 2·E·H·D = 8,192, k and v 4,096 each, wo 8,192, w_in
    32,768 (w_out's never rebuilt: no backward reads its output); q·k and p·v 2·S·H·D
    = 2,048 each. 2 layers of 64 tokens."""
    tokens = 2 * 64
    by_hand = {
        "block": 8192 + 2 * 4096 + 2 * 2048 + 8192 + 32768,
        "dots": 2 * 2048,
        "save_qkv_proj": 2 * 2048 + 8192 + 32768,
        "save_dot_except_mlp": 2 * 2048 + 32768,
        "selective": 2048,
    }
    assert {p: recompute_flops(SCANNED, 4, p) / tokens for p in by_hand} == by_hand
    flash = dataclasses.replace(SCANNED, attention_impl="cudnn")
    assert recompute_flops(flash, 4, "selective") / tokens == 2 * 2048  # its whole forward


def test_remat_n_recomputes_less_as_it_keeps_more():
    """The scaling book's points: 1 tensor a layer rebuilds what block does, 7 (the big
    matmuls' outputs) what dots does, 20 nothing; linear between them."""
    cfg = PRESETS["cpu"].model
    block, dots = (recompute_flops(cfg, 8, p) for p in ("block", "dots"))
    by_n = [recompute_flops(cfg, 8, n) for n in range(1, 22)]
    assert by_n[0] == block and by_n[6] == dots and by_n[19] == by_n[20] == 0
    assert by_n[3] == (block + dots) / 2 and by_n[12] == dots * 7 / 13
    assert all(a > b for a, b in itertools.pairwise(by_n[:20]))


def test_korthikanti_s_selective_recompute_keeps_34_sbh():
    """Korthikanti et al. 2022, Table 2: GPT-3 175B (h 12,288, a 96, s 2,048, fp16, no
    tensor parallelism) keeps 34·s·b·h bytes a layer under selective recompute; ours,
    in bf16, b = 1, keeps 32·s·h:
        theirs              ours
        LN inputs 2 x 2sbh  the layer's input, attention_residual
        QKV input 2sbh      attention_norm
        q, k 4sbh; v 2sbh   query_proj, key_proj, value_proj
        out-proj in 2sbh    context
        MLP input 2sbh      mlp_norm
        GeLU in, out 16sbh  mlpwi (ReLU's input), mlp_activation
        dropout masks 2sbh  none: our model has no dropout
    Without remat, with a flash kernel (cuDNN's, which keeps attention's log-sum-exp,
    a float32 a head), ours keeps 40·s·h and 16 + 4·a bytes a token more: each norm
    keeps its input's float32 copy (4sh, not 2sh) and x·rsqrt in float32 (4sh) and two
    statistics (8 bytes a token); ReLU keeps a bool mask (4sh), where GeLU keeps its
    input (8sh); no dropout masks (-2sh)."""
    h, a = 12_288, 96
    gpt3 = ModelConfig(embed=h, ff=4 * h, heads=a, head_dim=h // a, layers=96, seq=2048,
                       dtype="bfloat16", attention_impl="cudnn")  # fmt: skip
    selective = saved_bytes(saved_per_layer_per_token(gpt3, "selective"), 2)
    assert selective == 32 * h and abs(selective / (34 * h) - 1) < 0.1
    none = saved_bytes(saved_per_layer_per_token(gpt3, "none"), 2)
    assert none == 34 * h + 2 * (2 + 4) * h - 4 * h - 2 * h + 2 * 8 + 4 * a


MEMORY = ["memory", "--preset", "gpt2", "--chip", "h100", "--batch-tokens", "32768"]


def test_a_policy_by_name_plans_and_a_bad_name_is_one_line(capsys):
    assert roofline_command([*MEMORY, "--remat", "names:query_proj,context"]) == 0
    assert roofline_command([*MEMORY, "--remat", "names:query,context"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no tensor is named query (" in err
    # GPT-2's own names, and not the gated MLP's, which it lacks.
    gpt2 = PUBLISHED["gpt2"].model
    assert all(name in err for name in checkpoint_names(gpt2)) and "mlpwi_0" not in err
    assert remat_problem("names:mlpwi_0", CFG) and not remat_problem("names:mlpwi_0")
    with pytest.raises(UsageError, match=r"no tensor is named mlpwi_0 \(names: decoder_layer_in"):
        ModelConfig(remat="names:query_proj,mlpwi_0")
    assert ModelConfig(remat="names:query_proj,mlpwi").remat == "names:query_proj,mlpwi"

"""The decode step in kernels (sessions/inference/kernel_step.py) against XLA's
(kv_cache.decode_step, sessions/inference/kv_cache.py), and `--decode-impl`, on a CPU.

On a CPU the kernels (sessions/kernels/decode_attention.py, sessions/kernels/decode_mlp.py) run
in Mosaic GPU's interpreter, which runs the MLP kernel from JAX 0.12 on: on JAX
0.10 the tests that run the step skip (the 3.13 leg runs them) and the flag is
refused in one line. Shapes are the smallest the kernels take (E, F, D and T in
tiles of 64): the interpreter is slow. The whole decode compiled for h100:1 is
counted in kernels a token (roofline/compiled/launches.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BIG, need, run_script, s3_in_process

from sessions.errors import UsageError
from sessions.inference import kernel_step, kv_cache
from sessions.inference.layout import decode_weights
from sessions.kernels import mosaic
from sessions.model import init_params
from sessions.model.config import PRESETS, ModelConfig

# The smallest shapes both kernels take: E, F, D and T in tiles of 64.
TINY = ModelConfig(
    vocab=256, embed=64, ff=128, heads=2, head_dim=64, layers=2, seq=64, dtype="bfloat16"
)
ONE = dataclasses.replace(TINY, layers=1)  # one layer: quicker to compile twice
FAMILY = dataclasses.replace(ONE, embed=128, kv_heads=1, rope=True, gated=True)  # GQA: G = 2
P = 5  # prompt tokens
SHAPE = ["--embed", "64", "--ff", "128", "--heads", "2", "--head-dim", "64", "--layers", "1"]
OLD = "--decode-impl pallas on a CPU runs in Mosaic GPU's interpreter, which needs JAX 0.11"
# Runs the kernels in the interpreter: JAX 0.10's lacks the MLP kernel's primitives
# (tests/test_decode_mlp.py), so there the step is refused (tested below).
interpreted = pytest.mark.skipif(
    mosaic.OLD_INTERPRETER, reason="Mosaic GPU's interpreter runs this kernel from JAX 0.12 on"
)


def build(cfg, batch, seed=0):
    """(decode weights, params, logits of the prompt, the prefilled cache, prompts)."""
    params = init_params(cfg, jax.random.key(seed))
    prompts = np.random.default_rng(seed + 1).integers(0, cfg.vocab, (batch, P), np.int32)
    logits, cache = kv_cache.prefill(params, jnp.asarray(prompts), cfg)
    return decode_weights(params, cfg), params, logits, cache, prompts


# Built once per (cfg, batch) for the tests that share them; nothing donates them.
setup = functools.cache(build)


@functools.partial(jax.jit, static_argnames="cfg")
def xla_step(w, cache, token, live, cfg):
    return kv_cache.decode_step(w, cache, token, jnp.int32(P), cfg, live)


@functools.partial(jax.jit, static_argnames="cfg")
def kernels_step(w, cache, token, live, cfg, held):
    """Compiled once per cfg and shapes, whether the step is live or not (live is traced);
    held: the logits a step that is not live keeps (the head kernel's, decode_head.py)."""
    pos = jnp.int32(P)
    return kernel_step.kernel_decode_step(w, cache, token, pos, cfg, live, held, interpret=True)


def first_token(logits):
    return jnp.asarray(np.argmax(np.asarray(logits), axis=-1).astype(np.int32))


def both_steps(cfg, batch, live):
    """(XLA's (logits, cache), the kernels' (logits, cache), the cache before), one
    step at position P from the same prefilled cache."""
    w, _, logits, cache, _ = setup(cfg, batch)
    token, live = first_token(logits), jnp.bool_(live)
    ours = kernels_step(w, cache, token, live, cfg, logits)
    return xla_step(w, cache, token, live, cfg), ours, cache


@interpreted
@pytest.mark.parametrize(
    "cfg, batch",
    [(ONE, 1), (TINY, 3), (FAMILY, 2), (dataclasses.replace(ONE, attention=False), 2)],
    ids=["mha-b1", "mha-two-layers-b3", "gqa-rope-gated-b2", "mlp-only-b2"],
)
def test_the_kernel_step_equals_xla_s(cfg, batch):
    """Logits and the slot written within bf16's reach; the rest of the cache bit for bit.

    XLA itself does not promise where a step rounds to bf16: its default allows
    excess precision, so a fusion may keep a norm's or a block's output in float32
    (two XLA programs of the same step differ here, in the slot written even in
    layer 0), and the kernels sum their float32 partials before one rounding. So
    each of the 2L blocks, and each norm, may round once differently: half an ulp
    of bf16 (2^-8 relative, 8 significant bits) each, which a normalised dot
    carries on at most in proportion; and two inputs that differ may round their
    output to neighbouring bf16 values, one ulp (2^-7) apart. Layer i's written
    slot is held to 2^-7 + (2i + 1)·2^-8 of the cache's largest value, the logits
    to 2^-7 + (2L + 1)·2^-8 of theirs.
    The kernels' own cache write is held bit for bit where its input is the same
    (the kernel's tests)."""
    (want, want_cache), (got, got_cache), _ = both_steps(cfg, batch, live=True)
    assert got.shape == want.shape == (batch, cfg.vocab) and got.dtype == jnp.float32
    tol = (2 * cfg.layers + 3) * 2.0**-8 * float(jnp.abs(want).max())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=tol)
    assert len(got_cache) == len(want_cache) == (cfg.layers if cfg.attention else 0)
    for i, (ours, theirs) in enumerate(zip(got_cache, want_cache, strict=True)):
        for name in ("k", "v"):
            assert ours[name].dtype == theirs[name].dtype
            a, b = np.asarray(ours[name], np.float32), np.asarray(theirs[name], np.float32)
            tol = (2 * i + 3) * 2.0**-8 * np.abs(b).max()
            np.testing.assert_allclose(a, b, rtol=0, atol=tol, err_msg=f"layer {i} {name}")
            t = -1 if name == "k" else -2  # T's axis: k [B, K, D, T], v [B, K, T, D]
            np.testing.assert_array_equal(np.delete(a, P, axis=t), np.delete(b, P, axis=t))


@interpreted
def test_a_step_that_is_not_live_writes_nothing():
    """decode_steps runs steps past n that must leave the cache as it was. The kernels'
    step of the mha-b1 case above, its program and its inputs, with live false: nor
    the logits, which stay the ones it was given (the head kernel writes none)."""
    w, _, logits, before, _ = setup(ONE, 1)
    got, got_cache = kernels_step(w, before, first_token(logits), jnp.bool_(False), ONE, logits)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(logits))
    for ours, old in zip(got_cache, before, strict=True):
        for name in ("k", "v"):
            np.testing.assert_array_equal(
                np.asarray(ours[name], np.float32), np.asarray(old[name], np.float32)
            )


@interpreted
def test_generated_tokens_equal_xla_s():
    """Greedy, a few tokens: --decode-impl pallas gives XLA's tokens (on a CPU its
    kernels run in the interpreter). One layer: the loop runs kv_cache.STEPS steps of the
    kernels whatever the count, and the layers' hand-over is the two-layer case's above."""
    _, params, _, _, prompts = setup(ONE, 2)
    want = kv_cache.generate(params, ONE, prompts, 3)
    got = kv_cache.generate(params, ONE, prompts, 3, decode_impl="pallas")
    assert got.shape == (2, P + 3)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "change, batch, kinds, why",
    [
        ({"dtype": "float32"}, 1, {}, "runs bfloat16: add --dtype bfloat16"),
        ({}, 1, {"int8_weights": True}, "not int8"),
        ({}, 1, {"int8_cache": True}, "not int8"),
        ({}, 9, {}, "at most 8, not 9"),
        ({}, 1, {"devices": 2}, "one device, not a mesh of 2"),
        ({"embed": 48}, 1, {}, "multiples of 64, not --embed 48"),
        ({"ff": 96}, 1, {}, "multiples of 64, not --ff 96"),
        ({"heads": 3, "head_dim": 20}, 1, {}, "not heads x --head-dim 60"),
        # What the kernels themselves refuse (decode_attention.attention_refusal, decode_mlp.mlp_refusal):
        ({"heads": 4, "head_dim": 32}, 1, {}, "multiples of 64, not 64, 32, 64"),
        ({"seq": 96}, 1, {}, "multiples of 64, not 64, 64, 96"),
        ({"embed": 4096, "heads": 64, "attention": False}, 1, {}, "embed up to 2048, not 4096"),
        ({"embed": 4096, "heads": 64}, 1, {}, "embed up to 2048, not 4096"),  # the MLP's
        # 8 query heads of 128 a KV head: q and its output, 128 KB, beside the rings.
        (
            {"embed": 2048, "heads": 16, "head_dim": 128, "kv_heads": 2},
            1,
            {},
            "more than a CTA's shared memory",
        ),
    ],
)
def test_what_the_kernels_do_not_run_is_refused_in_one_line(change, batch, kinds, why):
    """A head_dim of 32 is refused here, not by an AssertionError inside Mosaic GPU."""
    cfg = dataclasses.replace(TINY, **change)
    with pytest.raises(UsageError) as refused:
        kernel_step.check_supported(cfg, batch, **kinds)
    message = str(refused.value)
    assert why in message and message.startswith("--decode-impl pallas ")
    assert "\n" not in message


def test_the_interpreter_of_jax_0_10_is_refused_in_one_line(monkeypatch):
    """On a CPU the kernels run interpreted, which JAX 0.10's interpreter cannot; a
    compile for a GPU (interpret false) is not refused."""
    monkeypatch.setattr(mosaic, "OLD_INTERPRETER", True)
    with pytest.raises(UsageError) as refused:
        kernel_step.check_supported(TINY, 1, interpret=True)
    assert str(refused.value).startswith(OLD) and "\n" not in str(refused.value)
    assert kernel_step.check_supported(TINY, 1, interpret=False) is None
    monkeypatch.setattr(mosaic, "OLD_INTERPRETER", False)
    assert kernel_step.check_supported(TINY, 1, interpret=True) is None


@pytest.mark.skipif(not mosaic.OLD_INTERPRETER, reason="JAX 0.12 interprets the kernels")
def test_s3_refuses_pallas_on_a_cpu_with_jax_0_10(capsys):
    argv = ["--random-params", "--seq", "64", "--dtype", "bfloat16", "--decode-impl", "pallas"]
    code, _, err = s3_in_process([*argv, *SHAPE], capsys)
    assert code == 2 and OLD in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("preset", ["cpu", "course", "gpt2-bytes"])
def test_the_course_s_presets_qualify_in_bfloat16(preset):
    cfg = dataclasses.replace(PRESETS[preset].model, dtype="bfloat16")
    for batch in (1, 8):
        assert kernel_step.check_supported(cfg, batch) is None


def test_the_step_refuses_as_it_is_traced():
    """Any program that traces the kernels' step (s3's --target, the benchmark)
    stops on what they do not run, not inside a kernel."""
    cfg = dataclasses.replace(TINY, dtype="float32")
    w, cache = jax.eval_shape(lambda: build(cfg, 1)[::3])  # shapes: nothing compiled
    token = jnp.zeros((1,), jnp.int32)
    with pytest.raises(UsageError, match="runs bfloat16"):
        jax.eval_shape(
            lambda w, cache: kernel_step.kernel_decode_step(
                w, cache, token, 0, cfg, interpret=True
            ),
            w,
            cache,
        )


def test_the_step_refuses_a_mesh_as_it_is_traced():
    w, _, _, cache, _ = setup(ONE, 2)
    token = jnp.zeros((2,), jnp.int32)
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    with jax.set_mesh(mesh), pytest.raises(UsageError, match="not a mesh of 2"):
        jax.eval_shape(
            lambda: kernel_step.kernel_decode_step(w, cache, token, 0, ONE, interpret=True)
        )


def test_the_flag_picks_the_step_by_platform():
    assert kernel_step.impl_for("xla", "gpu") is None
    assert kernel_step.impl_for("pallas", "gpu") == "pallas"
    assert kernel_step.impl_for("pallas", "cpu") == "pallas-interpret"

    def xla(w, cache, token, pos, cfg, live):  # XLA's step, whose logits are 1s
        return jnp.ones(2), cache

    held = jnp.zeros(2)  # the logits a step that is not live keeps (the loop's select)
    for live in (True, False):
        logits, _ = kernel_step.step_function(None, xla)(None, {}, 0, 0, None, live, held)
        assert logits.tolist() == ([1.0, 1.0] if live else [0.0, 0.0])
    interpreted = kernel_step.step_function("pallas-interpret", xla)
    compiled = kernel_step.step_function("pallas", xla)
    assert interpreted.keywords == {"interpret": True}
    assert compiled.keywords == {"interpret": False}
    with pytest.raises(ValueError):
        kernel_step.step_function("xla", xla)


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--decode-impl", "cuda"], "invalid choice: 'cuda'"),
        (["--decode-impl", "pallas", "--dtype", "float32"], "runs bfloat16"),
        (["--decode-impl", "pallas", "--dtype", "bfloat16", "--batches", "16"], "at most 8"),
    ],
)
def test_s3_refuses_on_one_line(argv, why, capsys):
    code, _, err = s3_in_process(["--random-params", "--seq", "64", *SHAPE, *argv], capsys)
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err


def test_s5_refuses_pallas_on_one_line(capsys):
    code, _, err = run_script("sessions/s5_serve.py", ["--decode-impl", "pallas"], capsys)
    assert code == 2 and "int8 levers" in err and len(err.strip().splitlines()) == 1, err


def spy_on_the_step(monkeypatch):
    """A list that gets each trace's `interpret` as kernel_step.kernel_decode_step is
    traced (the step itself still runs)."""
    seen = []
    real = kernel_step.kernel_decode_step

    def spy(*args, interpret, **kwargs):
        seen.append(interpret)
        return real(*args, interpret=interpret, **kwargs)

    monkeypatch.setattr(kernel_step, "kernel_decode_step", spy)
    return seen


def test_target_compiles_the_kernels_for_the_chip(monkeypatch):
    """s3 --target h100:1 --decode-impl pallas traces the kernels' step with
    interpret=False (this machine has no GPU, but the program is for one)."""
    need("gpu")
    from sessions.plan import programs
    from sessions.plan.infer_on_target import plan_inference
    from sessions.run.cli import infer_flags, serving_config

    seen = spy_on_the_step(monkeypatch)
    flags = ["--target", "h100:1", "--seq", "64", "--batches", "1", "--decode-impl", "pallas"]
    args = infer_flags([*flags, *SHAPE])
    target, devices = programs.devices_for("h100:1")
    serving = serving_config(args, platform=target.chip.platform)
    planned = plan_inference(serving, None, args.batches, target, devices, lambda *a: None)
    assert planned.plans and seen and not any(seen)
    # Its estimate streams each kernel's bytes at what its grid keeps in flight, not at XLA's
    # fitted rate (roofline/plan/decode_estimate.py).
    from roofline.plan.decode_estimate import decode_times

    p, streams = planned.plans[0], kernel_step.byte_streams(serving.model, 1)
    ours = decode_times(p.step, p.launches.per_token, target.chip, streams=streams)
    xla = decode_times(p.step, p.launches.per_token, target.chip)
    assert p.times.bytes_s == pytest.approx(ours.bytes_s) != pytest.approx(xla.bytes_s)


def test_target_says_our_compile_time_beside_xla_s(monkeypatch, capsys):
    """s3 --target h100:1 --decode-impl pallas: each batch's whole decode with ours (the
    planner's compile, a stand-in: 12 s at batch 1) beside XLA's decode (3 s), 4.0x, and
    each kernel alone (2 s, 1.5 s), labelled measured; none of it with XLA's step."""
    from types import SimpleNamespace

    from sessions.plan import infer_on_target, kernels_on_target, programs
    from sessions.plan.infer_on_target import DecodePlanned
    from sessions.plan.kernels_on_target import Attempt

    target = SimpleNamespace(name="h100-sxm:1", chip=SimpleNamespace(platform="gpu"))
    monkeypatch.setattr(programs, "devices_for", lambda text: (target, ["h100"]))
    plan = SimpleNamespace(batch=1, compile_s=12.0)
    planned = DecodePlanned([plan], {}, None)
    monkeypatch.setattr(infer_on_target, "plan_inference", lambda *a: planned)
    asked = []

    def compile_kernels(cfg, batch, target, devices, seconds=None, whole=True):
        asked.append((batch, whole))
        return [
            Attempt("attention", "a.py", "compiled", "", 2.0),
            Attempt("MLP", "m.py", "compiled", "", 1.5),
            Attempt("XLA's", "XLA's decode", "compiled", "", 3.0),
        ]

    monkeypatch.setattr(kernels_on_target, "compile_kernels", compile_kernels)
    flags = ["--target", "h100:1", "--seq", "64", "--batches", "1", *SHAPE]
    code, out, err = s3_in_process([*flags, "--decode-impl", "pallas"], capsys)
    assert code == 0, err
    assert asked == [(1, False)]  # the planner's compile of ours is not done again
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0].startswith(
        "batch 1: compiled for h100-sxm:1 in 3.0 s (XLA's decode) and 12.0 s (ours, 4.0x); "
        "measured on "
    )
    assert lines[0].endswith(f"JAX {jax.__version__}")
    assert lines[1] == "  ours, each kernel alone: attention 2.0 s, MLP 1.5 s"
    code, out, err = s3_in_process([*flags, "--decode-impl", "xla"], capsys)
    assert code == 0 and "compiled for" not in out and asked == [(1, False)], out + err


@interpreted
def test_s3_decodes_with_the_kernels_interpreted_on_a_cpu(tmp_path, capsys):
    """s3 --decode-impl pallas on a CPU decodes once with the kernels, interpreted, and
    once with XLA's step, untimed: greedy, the same tokens (tests/test_s3_kernel_check.py
    checks the rest of what it prints)."""
    flags = ["--random-params", "--seq", "64", "--dtype", "bfloat16", "--batches", "1"]
    more = ["--new-tokens", "2", "--temperature", "0", "--decode-impl", "pallas"]
    code, out, err = s3_in_process([*flags, *SHAPE, *more, "--run-dir", str(tmp_path)], capsys)
    assert code == 0, err
    assert "decode pallas-interpret" in out and "MBU" not in out
    assert "the same 2 new tokens a row as XLA's: yes (greedy)" in out, out


def test_bench_refuses_on_one_line(capsys):
    code, _, err = run_script("scripts/bench_decode.py", ["--decode-impl", "xla,cuda"], capsys)
    assert code == 2 and "--decode-impl cuda" in err and len(err.strip().splitlines()) == 1
    argv = ["--decode-impl", "xla,pallas", "--dtype", "float32"]
    code, _, err = run_script("scripts/bench_decode.py", argv, capsys)
    assert code == 2 and "runs bfloat16" in err and len(err.strip().splitlines()) == 1, err
    # A shape flag changes --mbu-preset's model, which the kernels are asked about too.
    argv = ["--decode-impl", "xla,pallas", "--dtype", "bfloat16", "--embed", "96"]
    code, _, err = run_script("scripts/bench_decode.py", argv, capsys)
    assert code == 2 and "not --embed 96" in err and len(err.strip().splitlines()) == 1, err


# A decode program by hand: a fusion before the loop, and in its body two fusions
# and a custom call (a kernel of ours): 3 kernels a step.
HLO = """HloModule m

%fused_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %f1 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused_a
  %c = f32[4]{0} custom-call(%f2), custom_call_target="mosaic_gpu"
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %c)
}

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %k = s32[] constant(16)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %f0 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %z = s32[] constant(0)
  %t = (s32[], f32[4]{0}) tuple(%z, %f0)
  %w = (s32[], f32[4]{0}) while(%t), condition=%cond, body=%body
  ROOT %o = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def bench_module():
    import runpy

    return runpy.run_path("scripts/bench_decode.py", run_name="bench_decode")


def test_the_bench_counts_a_step_s_kernels():
    # The loop's body launches 3 (two fusions and the kernel), its condition 1 (the
    # compare, unfused); the fusion before the loop runs once, not each token.
    from sessions.inference import step_times

    assert step_times.kernels_per_token(HLO)[0] == 3 + 1


def test_the_bench_says_whether_ours_is_no_slower():
    no_slower = bench_module()["no_slower"]

    class Got:
        def __init__(self, tokens_per_s):
            self.tokens_per_s = tokens_per_s

    table = {"xla": {1: (Got(100), 9, None), 16: (Got(900), 9, None)}}
    table["pallas"] = {1: (Got(150), 3, None)}
    assert no_slower([table]) is True  # batch 16: ours did not run, so not compared
    table["pallas"][1] = (Got(99), 3, None)
    assert no_slower([table]) is False
    assert no_slower([{"xla": table["xla"]}]) is None


@pytest.mark.parametrize(
    "impl, calls", [(None, 0), pytest.param("pallas-interpret", 1, marks=interpreted)]
)
def test_the_decode_program_runs_the_step_it_is_asked_for(impl, calls, monkeypatch):
    """kv_cache.decode_steps traces the kernels' step once (its loop's body) for
    impl "pallas-interpret" and never for XLA's."""
    seen = spy_on_the_step(monkeypatch)
    jax.clear_caches()  # a trace of the same shapes, cached, would never call the spy
    w = decode_weights(init_params(ONE, jax.random.key(0)), ONE)
    tokens, logits = jnp.zeros((1, ONE.seq), jnp.int32), jnp.zeros((1, ONE.vocab), jnp.float32)
    cache = kv_cache.init_cache(ONE, 1)
    args = (w, cache, tokens, logits, P, 1, jax.random.key(0), 1.0, ONE, True, impl)
    jax.eval_shape(kv_cache.decode_steps, *args)
    assert seen == [True] * calls


# Kernels a token that are no layer's, in the whole decode program (kv_cache.decode_steps)
# compiled for h100:1 with our step, counted by hand from its optimized HLO (JAX 0.10.2):
#   the loop's own (XLA's step has them too): pick the token from the last logits (a
#   reduce), write it into the tokens (a dynamic-update-slice), step the counter (an add): 3
#   (the loop's condition, a compare, is compiled but never runs: XLA knows the 16 trips)
#   the embedding: token row + position row, one fusion: 1
#   the head: one kernel (sessions/kernels/decode_head.py), the last layer's partials
#   settled, the final norm, the unembedding, and the loop's select, which keeps the last
#   logits where the step is not live (in XLA's step a select of its own): 1
# Not one to fill zeros: the first kernel gets P = 0 pending partials, an empty array; nor
# one to put pos and live together: the kernels read the loop's counter (kernel_step.clock).
REST = 3 + 1 + 1


def test_the_planner_counts_our_step_s_kernels_as_compiled():
    from roofline.launch_bound import OUR_KERNELS_OUTSIDE, estimated_kernels

    assert OUR_KERNELS_OUTSIDE == REST and estimated_kernels(12, 2) == 2 * 12 + REST == 29


def compiled_decode(cfg, layers):
    """The whole decode (kv_cache.decode_steps, impl "pallas") at batch 1 and `layers`
    layers of cfg, compiled for h100:1: (kernels a token, {kind: count})."""
    need("gpu")
    from roofline.compiled.launches import kernels_per_token
    from sessions.plan import programs
    from sessions.plan.infer_on_target import plan_decode_batch

    cfg = dataclasses.replace(cfg, layers=layers)
    target, devices = programs.devices_for("h100:1")
    _, mesh = programs.target_mesh(None, target, devices)
    plan, compiled = plan_decode_batch(cfg, 1, mesh, target, lambda *a: None, impl="pallas")
    assert plan is not None, compiled
    return kernels_per_token(compiled)


def test_the_1_2b_shape_is_taken_and_compiles_for_the_chip():
    """Refused before (x_now [64, E] filled a CTA's SMEM at E 2048). One layer compiled (about a
    minute on 2 cores): a layer adds the same 2 kernels, so 24 launch 2·24 + REST = 53 a
    token. (XLA's head left the final norm's scaling a kernel of its own at E 2048; the
    head kernel runs it at any E.)"""
    for batch in (1, 8):
        assert kernel_step.check_supported(BIG, batch) is None
    per_token, kinds = compiled_decode(BIG, 1)
    assert kinds.get("pallas") == 2 + 1 and per_token == 2 + REST, kinds  # a layer, the head
    assert "convert" not in kinds, kinds


def test_the_whole_decode_compiled_for_the_chip_launches_two_kernels_a_layer():
    """GPT-2's shapes (bf16, batch 1) at 2 layers, the whole decode program
    (kv_cache.decode_steps, impl "pallas") compiled for h100:1: 2 kernels a layer
    (attention half, MLP half: the contract) plus REST that are no layer's, counted by
    roofline/compiled/launches.py in the loop's body. GPT-2's 12 layers then launch
    2·12 + 5 = 29 a token (XLA's step: 163, docs/h100-run)."""
    L = 2  # GPT-2 has 12: a layer adds the same 2 kernels, so 2 compile in less time
    cfg = dataclasses.replace(PRESETS["gpt2-bytes"].model, dtype="bfloat16")
    per_token, kinds = compiled_decode(cfg, L)
    assert kinds.get("pallas") == 2 * L + 1, kinds  # our kernels, the head's: a custom call each
    assert per_token == 2 * L + REST, kinds
    assert "reduce" in kinds and "matvec" not in kinds, kinds  # the pick; no XLA head

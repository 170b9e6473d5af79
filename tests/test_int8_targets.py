"""The int8 decode loop as the NVIDIA and TPU compilers build it, deviceless,
and as this CPU's XLA builds it: the bytes each step reads against the
roofline's int8 count, worked out here by hand, and no float copy of an int8
weight or cache (roofline/compiled/widened.py).

The shape is session 3's 1.2B one on the H100 (docs/h100-run/s3_1.2B_bf16_random.log:
E=2048, F=8192, 16 heads of 128, T=1024, V=256) with 2 of its 24 layers: the
bytes are per layer, and two layers compile in seconds. Each program is
compiled once per module. Tests that need a chip's compiler skip without it
(HPLLM_REQUIRE_AOT=1 turns the skips into failures, as in tests/test_decode_targets.py).

A step's bytes are read off the compiled program op by op (roofline/compiled/op_work.py:
each op's operands and result, a slice as the slice), each op times the times it
runs in one call of kv_cache.STEPS steps, over STEPS. That is what the compiled
program moves; XLA's own cost analysis is no help here: the NVIDIA compiler gives
none deviceless, and the TPU's counts each slice of an array it streams to its
on-chip memory as a read of the whole array (4.6x the bytes, docs/results.md).
"""

import jax
import numpy as np
import pytest
from helpers import need

from roofline.compiled.op_work import program_work
from roofline.compiled.program import matmul_dtypes
from roofline.compiled.widened import widened_copies
from sessions.inference import kv_cache, layout, shapes
from sessions.inference.layout import decode_weights
from sessions.model import init_params
from sessions.model.config import PRESETS, ModelConfig
from sessions.plan import programs
from sessions.shard import sharding

SHAPE = ModelConfig(
    embed=2048, ff=8192, heads=16, head_dim=128, layers=2, seq=1024, dtype="bfloat16"
)


def compile_decode(target_text, cfg, batch, int8_weights, int8_cache):
    """The decode loop (kv_cache.decode_steps) compiled for one device of the target."""
    target, devices = programs.devices_for(target_text)
    mesh = sharding.make_mesh(sharding.parse_mesh(None, 1), devices=np.array(devices[:1]))
    args, static = shapes.abstract_decode_inputs(cfg, batch, mesh, int8_weights, int8_cache)
    with jax.set_mesh(mesh):
        lowered = kv_cache.decode_steps.lower(*args, **static)
        return programs.compile_for(lowered, target.chip, lambda *a: None).as_text()


def bytes_per_step(hlo_text):
    """HBM bytes of one decode step: every op's, times its runs in one call, over STEPS."""
    return sum(w.hbm_bytes * w.count for w in program_work(hlo_text)) / kv_cache.STEPS


def read_once_per_call(hlo_text):
    """HBM bytes of each op once: what a call reads at least once, whatever it keeps on chip."""
    return sum(w.hbm_bytes for w in program_work(hlo_text))


def roofline_bytes(cfg, batch, int8_weights, int8_cache):
    """A decode step's bytes by hand. Weights: per layer q, k, v, o (E·H·D each) and
    the MLP's two (E·F each), and the tied embedding (V·E) once, as the output
    projection: 2 bytes each in bf16; in int8 1 byte each and 4 per output channel
    (q, k, v: H·D channels; o, w_out: E; w_in: F; the embedding: V). The norm
    scales ((2L + 1)·E) and one row of the positional table (E) in bf16. The cache:
    a key and a value of D numbers per layer, row, position and head, 2 bytes each;
    in int8 1 byte each and a float32 scale per key and per value."""
    E, F, H, D, L, V, T = cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.vocab, cfg.seq
    values = L * (4 * E * H * D + 2 * E * F) + V * E
    channels = L * (3 * H * D + E + F + E) + V
    weights = (values + 4 * channels if int8_weights else 2 * values) + 2 * (2 * L + 2) * E
    per_position = 2 * L * batch * T * H
    cache = per_position * (D + 4) if int8_cache else per_position * D * 2
    return weights + cache


def smallest_int8_array(cfg, batch):
    """Elements of the smallest int8 weight (E·H·D) or cache array (B·H·T·D)."""
    return min(cfg.embed * cfg.heads * cfg.head_dim, batch * cfg.heads * cfg.seq * cfg.head_dim)


@pytest.fixture(scope="module")
def h100():
    """{(int8 weights, int8 cache): the compiled loop's HLO} at batch 1, where the
    H100 run measured the 1.2B shape at 48% of its memory roof."""
    need("gpu")
    kinds = ((False, False), (True, False), (True, True))
    return {kind: compile_decode("h100:1", SHAPE, 1, *kind) for kind in kinds}


@pytest.fixture(scope="module")
def tpu():
    """int8 weights and cache, batch 8: with fewer rows the TPU compiler turns the
    matmuls into multiplies and sums, and no dot shows what it reads."""
    need("tpu")
    return compile_decode("tpu-v5e:2x2", SHAPE, 8, True, True)


def test_the_h100_decode_reads_the_roofline_s_int8_bytes(h100):
    """Each kind of decode reads within 15% of its roofline count (measured: +0.5%,
    +1.1%, +1.3%); int8 weights read at most 0.6x the bytes of bf16 (0.54x)."""
    for (w8, c8), text in h100.items():
        expected = roofline_bytes(SHAPE, 1, w8, c8)
        assert bytes_per_step(text) == pytest.approx(expected, rel=0.15), (w8, c8)
    int8, bf16 = bytes_per_step(h100[True, False]), bytes_per_step(h100[False, False])
    assert int8 <= 0.6 * bf16, int8 / bf16


def test_the_h100_decode_makes_no_float_copy_of_an_int8_array(h100):
    for kind in ((True, False), (True, True)):
        assert widened_copies(h100[kind], smallest_int8_array(SHAPE, 1)) == [], kind


def test_the_tpu_decode_multiplies_int8_and_makes_no_float_copy_of_it(tpu):
    """Each layer's six matmul weights and the output projection enter their dots
    as int8 (s8), and nothing converts a weight or the cache to a float copy."""
    found = matmul_dtypes(tpu)
    reads_int8 = sum(n for (lhs, rhs, _), n in found.items() if "s8" in (lhs, rhs))
    assert reads_int8 == 6 * SHAPE.layers + 1, found
    assert widened_copies(tpu, smallest_int8_array(SHAPE, 8)) == []


def test_the_tpu_decode_reads_the_roofline_s_int8_bytes_once_a_call(tpu):
    """The TPU compiler keeps some weights in its on-chip memory for the whole loop
    (128 MiB on a v5e) and moves the cache's layout in and out once a call, so a
    step of two layers reads less than the roofline, which counts every weight
    every step (-22% here; +4% at all 24 layers and batch 1, docs/results.md). Bounded both
    ways: every byte the roofline counts is read at least once a call, and a step
    reads at most the roofline's bytes and 15%."""
    expected = roofline_bytes(SHAPE, 8, True, True)
    assert read_once_per_call(tpu) >= 0.85 * expected
    assert bytes_per_step(tpu) <= 1.15 * expected


def test_the_cpu_backend_converts_every_int8_array_to_float32():
    """What XLA's CPU backend does with the same program, at the cpu preset: each
    int8 weight converted to float32 once a call (the convert does not change in
    the loop, so XLA hoists it out), each int8 cache array every step; the steps
    then read float32. The criterion finds exactly these copies."""
    cfg, batch = PRESETS["cpu"].model, 4

    def inputs():  # as shapes: the program is compiled, never run
        params = init_params(cfg, jax.random.key(0))
        w8 = layout.quantize_decode_weights(decode_weights(params, cfg))
        tokens = jax.numpy.zeros((batch, cfg.seq), jax.numpy.int32)
        logits = jax.numpy.zeros((batch, cfg.vocab), jax.numpy.float32)
        return w8, kv_cache.init_cache(cfg, batch, int8=True), tokens, logits

    w8, cache, tokens, logits = jax.eval_shape(inputs)
    text = (
        kv_cache.decode_steps.lower(
            w8, cache, tokens, logits, 0, 1, jax.random.key(0), 1.0, cfg=cfg, greedy=True
        )
        .compile()
        .as_text()
    )
    copies = widened_copies(text, smallest_int8_array(cfg, batch))
    weights = 6 * cfg.layers + 1  # six matmul weights a layer and the embedding
    assert sorted(c.runs for c in copies) == [1] * weights + [kv_cache.STEPS] * 2 * cfg.layers
    assert all(c.written.startswith("f32[") for c in copies)


def test_the_criterion_ignores_what_only_passes_an_int8_array_on():
    """A loop's state and a bitcast pass arrays on, writing no buffer; a convert
    inside a fusion's body writes none either; the fusion that calls it does."""
    text = """
%widen (p: s8[64,32]) -> f32[64,32] {
  %p = s8[64,32]{1,0} parameter(0)
  ROOT %c = f32[64,32]{1,0} convert(%p)
}
ENTRY %main (w: s8[64,32], x: f32[64,32]) -> f32[64,32] {
  %w = s8[64,32]{1,0} parameter(0)
  %x = f32[64,32]{1,0} parameter(1)
  %t = (s8[64,32]{1,0}, f32[64,32]{1,0}) tuple(%w, %x)
  %b = s8[32,64]{1,0} bitcast(%w)
  ROOT %f = f32[64,32]{1,0} fusion(%w), kind=kLoop, calls=%widen
}
"""
    (copy,) = widened_copies(text, 64 * 32)
    assert copy.name == "f" and copy.read.startswith("s8[64,32]") and copy.runs == 1
    assert widened_copies(text, 64 * 32 + 1) == []

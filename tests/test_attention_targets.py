"""Attention alone, compiled for an H100 this machine lacks: the einsums write
the whole score matrix, a flash kernel does not (sessions/plan/attention_on_target.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import need

from sessions.plan import programs
from sessions.plan.attention_on_target import (
    HEADS,
    attention_on_target,
    attention_program,
    attention_table_lines,
)
from sessions.shard import sharding


@pytest.fixture(scope="module")
def h100():
    need("gpu")
    return programs.devices_for("h100:1")


def test_einsum_attention_holds_the_scores_and_cudnn_does_not(h100):
    """At S = 1,024 (32 sequences), the [B, H, S, S] float32 scores alone are
    32·12·1024²·4 = 1.6 GB: XLA's plan for the einsums holds at least that, and
    cuDNN's flash kernel less than the bf16 probabilities would take (0.8 GB)."""
    target, devices = h100
    scores = 32 * HEADS * 1024**2
    einsum = attention_on_target("einsum", 1024, target, devices)
    cudnn = attention_on_target("cudnn", 1024, target, devices)
    assert einsum.batch == cudnn.batch == 32
    assert einsum.bytes >= 4 * scores
    assert cudnn.bytes < 2 * scores
    assert 0 < cudnn.seconds < einsum.seconds
    lines = attention_table_lines([einsum, cudnn], target)
    assert lines[0].startswith("attention alone on h100-sxm:1 (80 GiB per device)")
    assert len(lines) == 4 and " GB " in lines[-1]


def test_the_roofline_counts_our_kernels_forward(h100):
    """Our Pallas kernel is an opaque __gpu$xla.gpu.triton call: the roofline
    finds it by name and counts its forward, Q·Kᵀ and P·V over the causal half,
    2·2·B·H·S²·D/2 FLOPs; its backward's loops of unknown length count short
    of the 7 matmuls by hand, and the table says so."""
    target, devices = h100
    row = attention_on_target("pallas", 1024, target, devices)
    forward = 2 * 32 * HEADS * 1024**2 * 64
    assert forward <= row.counted_flops < row.flash_flops
    assert row.bytes < 2 * 32 * HEADS * 1024**2  # no [B, H, S, S] scores held


def test_cudnn_takes_grouped_query_attention_itself(h100):
    """H = 8 query heads over K = 2 key/value heads, forward and backward, compiled for an
    H100: cuDNN's flash kernel takes the K heads as they are (jax.nn.dot_product_attention
    groups them), so the step is its custom calls with no copy of k or v to H heads."""
    target, devices = h100
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=np.array(devices[:1]))
    q = jax.ShapeDtypeStruct((4, 1024, 8, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((4, 1024, 2, 64), jnp.bfloat16)
    program = attention_program("cudnn")
    compiled, oom, _ = programs.compile_or_oom(program, (q, kv, kv), {}, mesh, target.chip, print)
    assert oom is None
    calls = [line for line in compiled.as_text().splitlines() if "__cudnn$fmhaSoftmax" in line]
    forward = [line for line in calls if 'custom_call_target="__cudnn$fmhaSoftmax"' in line]
    assert len(forward) == 1 and any("fmhaSoftmaxBackward" in line for line in calls)
    # Its operands: q of 8 heads, k and v of 2.
    operands = r"bf16\[4,1024,8,64\]\S*, bf16\[4,1024,2,64\]\S*, bf16\[4,1024,2,64\]"
    assert re.search(operands, forward[0]), forward[0][:300]

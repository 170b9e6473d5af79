"""The collective matmul (sessions/shard/collective_matmul.py): the same product as
gathering the weight first, on 8 and on 4 simulated CPU devices, gradients
included; and, compiled for a TPU slice this machine lacks (tpu-v5e:2x4), a
program whose permutes run while the matmuls do, as the reader of a compiled
schedule (roofline/compiled/schedule.py) finds it."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import need
from jax.sharding import NamedSharding

from roofline.compiled.hlo import parse
from roofline.compiled.kinds import classify_hlo
from roofline.compiled.program import collectives
from roofline.compiled.schedule import schedule_line, schedule_summary
from sessions.plan.collective_matmul_on_target import programs_on
from sessions.shard import sharding
from sessions.shard.collective_matmul import GPT2_MLP, allgather_matmul, collective_matmul

B, S, E, F = 8, 6, 24, 40  # B and E split 8 ways; pairwise different, so a swap fails
MESHES = ["fsdp=8", "fsdp=4", "data=2,fsdp=4", "fsdp=4,tp=2"]


def mesh_for(text):
    """A mesh over as many of the 8 CPU devices as the text's sizes multiply to."""
    n = math.prod(int(size) for size in re.findall(r"=(\d+)", text))
    return sharding.make_mesh(sharding.parse_mesh(text, n), devices=jax.devices()[:n])


def operands():
    kx, kw = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, (B, S, E)), jax.random.normal(kw, (E, F))


@pytest.mark.parametrize("mesh_text", MESHES)
def test_the_ring_computes_what_the_gathered_weight_does(mesh_text):
    mesh = mesh_for(mesh_text)
    x, w = operands()
    expected = np.einsum("BSE,EF->BSF", np.float64(x), np.float64(w))  # one device, no mesh
    with jax.set_mesh(mesh):
        gathered = jax.jit(lambda x, w: allgather_matmul(x, w, mesh))(x, w)
        ring = jax.jit(lambda x, w: collective_matmul(x, w, mesh))(x, w)
    np.testing.assert_allclose(gathered, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ring, expected, rtol=1e-5, atol=1e-5)
    rows = NamedSharding(mesh, sharding.ACTIVATION_SPECS["BSF"])
    assert ring.sharding.is_equivalent_to(rows, ring.ndim)  # each device keeps its own rows


@pytest.mark.parametrize("mesh_text", ["fsdp=8", "fsdp=4"])
def test_gradients_through_the_ring_equal_the_gathered_ones(mesh_text):
    mesh = mesh_for(mesh_text)
    x, w = operands()

    def loss(matmul):
        return jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(matmul(x, w, mesh))), (0, 1)))

    with jax.set_mesh(mesh):
        dx, dw = loss(collective_matmul)(x, w)
        dx_gathered, dw_gathered = loss(allgather_matmul)(x, w)
    # By hand: d sum(sin(x @ w)) = cos(x @ w), then back through the matmul.
    dout = np.cos(np.einsum("BSE,EF->BSF", np.float64(x), np.float64(w)))
    np.testing.assert_allclose(dx, np.einsum("BSF,EF->BSE", dout, w), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, np.einsum("BSF,BSE->EF", dout, x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, dx_gathered, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, dw_gathered, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [8, 4])
def test_each_device_receives_the_shards_it_lacks_one_hop_each(n):
    """A device holds 1 of the n shards of w; the other n - 1 arrive, one permute each."""
    mesh = mesh_for(f"fsdp={n}")
    x, w = operands()
    jaxpr = str(jax.make_jaxpr(lambda x, w: collective_matmul(x, w, mesh))(x, w))
    assert jaxpr.count("ppermute[") == n - 1
    assert jaxpr.count("all_gather[") == 0


# The reader of a compiled schedule, on a program written out by hand: one
# permute, and one dot that either runs while it is in flight or after it.
SNIPPET = """\
HloModule overlap, is_scheduled=true

ENTRY %main (p0: f32[4,8], p1: f32[8,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %send = (f32[8,8]{1,0}, f32[8,8]{1,0}, u32[], u32[]) collective-permute-start(%p1), \
channel_id=1, source_target_pairs={{0,1},{1,0}}
  FIRST
  SECOND
  %mine.1 = f32[4,8]{1,0} dot(%p0, %arrived), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %sum = f32[4,8]{1,0} add(%mine, %mine.1)
}
"""
DOT = "%mine = f32[4,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
DONE = "%arrived = f32[8,8]{1,0} collective-permute-done(%send)"


@pytest.mark.parametrize(
    "first, second, hidden", [(DOT, DONE, 1), (DONE, DOT, 0)], ids=["dot-first", "done-first"]
)
def test_a_permute_is_hidden_only_if_a_matmul_runs_while_it_flies(first, second, hidden):
    s = schedule_summary(SNIPPET.replace("FIRST", first).replace("SECOND", second))
    assert (s.permutes, s.matmuls, s.all_gathers, s.in_flight, s.loops) == (1, 2, 0, 1, 0)
    assert s.hidden == hidden
    assert s.alternate  # one permute sent, then matmuls: never two sends in a row


CHAIN = """\
ENTRY %main (p0: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %hop = (f32[8,8]{1,0}, f32[8,8]{1,0}) collective-permute-start(%p0), channel_id=1, \
source_target_pairs={{0,1},{1,0}}
  %in = f32[8,8]{1,0} collective-permute-done(%hop)
  %hop.1 = (f32[8,8]{1,0}, f32[8,8]{1,0}) collective-permute-start(%in), channel_id=1, \
source_target_pairs={{0,1},{1,0}}
  ROOT %in.1 = f32[8,8]{1,0} collective-permute-done(%hop.1)
}
"""


def test_a_chain_of_permutes_on_one_channel_is_every_hop():
    """XLA gives our unrolled ring's permutes one channel_id; each still runs, and
    the --target report (roofline/compiled/program.py) counts each, 8*8 float32 a hop."""
    assert collectives(CHAIN, 2) == {"collective-permute": (2, 2 * 256, 2 * 256)}
    assert schedule_summary(CHAIN).permutes == 2


# Compiled for a v5e-8 (tpu-v5e:2x4), the MLP's first matmul at the gpt2-bytes preset's
# widths and length (E=768, F=3072, S=1024), a row a device: compile-only, seconds.
# Shorter rows make each shard's matmul too small to be worth hiding a permute
# behind: at S=256 the scheduler runs the first three permutes back to back, and
# the partitioner (auto_matmul) gathers the weight whole instead of looping.
@pytest.fixture(scope="module")
def on_tpu():
    need("tpu")
    return programs_on("tpu-v5e:2x4", GPT2_MLP)


def order_of(hlo_text):
    """The entry computation's permutes and matmuls in the compiled order, one letter
    each: S a permute's start, D its done, M a matmul (a fusion holding a dot or a
    convolution: on a TPU every matmul is a convolution in a fusion)."""
    kinds = classify_hlo(hlo_text)
    letters = {"collective-permute-start": "S", "collective-permute-done": "D"}
    return "".join(
        letters.get(op.opcode, "M" if kinds[op.name] == "matmul" else "")
        for op in parse(hlo_text).entry.instructions
    )


def test_on_a_tpu_each_permute_flies_while_a_shard_is_multiplied(on_tpu):
    text = on_tpu["collective_matmul"]
    # 8 devices: 7 shards to receive, one permute each, and 8 shards to multiply.
    # Each permute starts, a matmul runs, the permute is done; the last shard's
    # matmul has nothing left to send beside it.
    assert order_of(text) == "SMD" * 7 + "M"
    s = schedule_summary(text)
    assert (s.permutes, s.matmuls, s.hidden, s.in_flight, s.all_gathers) == (7, 8, 7, 1, 0)
    assert s.alternate
    hop = 768 // 8 * 3072 * 2  # a shard of w_in in bf16
    assert collectives(text, 8)["collective-permute"][:2] == (7, 7 * hop)  # as --target says
    assert schedule_line("by hand", s) == (
        "by hand: 7 permutes, 8 matmuls; 7 of them hidden behind a matmul, 1 at most in flight"
    )


def test_on_a_tpu_the_plain_gather_leaves_nothing_to_hide_it(on_tpu):
    s = schedule_summary(on_tpu["allgather_matmul"])
    assert (s.all_gathers, s.permutes, s.matmuls, s.hidden) == (1, 0, 1, 0)
    assert schedule_line("gathered", s) == "gathered: 1 all-gather, 1 matmul"


def test_on_a_tpu_xla_builds_its_own_collective_matmul(on_tpu):
    """Left to the partitioner, XLA writes the loop itself: a windowed einsum that
    sends shards both ways around the ring, two in flight, and multiplies the two
    that arrived in one matmul: N / 2 matmuls of two shards."""
    s = schedule_summary(on_tpu["auto_matmul"])
    assert s.loops == 1 and s.all_gathers == 0
    assert s.in_flight == 2 and not s.alternate
    assert s.matmuls == 8 // 2
    assert s.hidden >= s.permutes - 1  # all but the first, sent before any shard is in hand
    assert "4 matmuls in 1 windowed-einsum loop;" in schedule_line("auto", s)
    small = schedule_summary(programs_on("tpu-v5e:2x4", (8, 256, 768, 3072))["auto_matmul"])
    assert (small.loops, small.all_gathers, small.permutes) == (0, 1, 0)  # too small to loop

"""Reading compiled programs: collectives, their group sizes and link bytes,
matmul dtypes and windowed-einsum loops, from hand-written HLO, as the parser
must read it whatever the compiler version prints; the scatters also from the
first H100 run's compiled step."""

import gzip
import os

from roofline.compiled.program import (
    collectives,
    group_size,
    link_bytes,
    matmul_dtypes,
    windowed_loops,
)
from roofline.compiled.scatters import scatters


def test_group_sizes_in_each_spelling():
    assert group_size("replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}", 8) == 4
    assert group_size("replica_groups=[2,4]<=[8], dimensions={0}", 8) == 4
    assert group_size("replica_groups=[4,2]<=[2,4]T(1,0)", 8) == 2
    assert group_size("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, x", 8) == 4
    assert group_size("replica_groups=mesh['a'=2,'b'=4] {'a','b'}, x", 8) == 8
    assert group_size("replica_groups={}, to_apply=%add", 8) == 8


def test_link_bytes_follow_the_ring():
    # n devices on a ring: an all-gather of an output of O bytes receives the
    # n-1 shards of O/n it lacks; a reduce-scatter to O bytes sends n-1 partial
    # sums of O; an all-reduce is both of an O-byte array.
    assert link_bytes("all-gather", 800, 8) == 700
    assert link_bytes("reduce-scatter", 100, 8) == 700
    assert link_bytes("all-reduce", 800, 8) == 1400
    assert link_bytes("all-gather", 800, 1) == 0


HLO = """
HloModule step, num_partitions=4
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%fused_dot (p0: bf16[16,8], p1: bf16[8,32]) -> f32[16,32] {
  %p0 = bf16[16,8]{1,0} parameter(0)
  %p1 = bf16[8,32]{1,0} parameter(1)
  ROOT %d = f32[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY %main (x: bf16[16,8], w: bf16[2,32]) -> f32[16,32] {
  %x = bf16[16,8]{1,0} parameter(0)
  %w = bf16[2,32]{1,0} parameter(1)
  %ag-start = (bf16[2,32]{1,0}, bf16[8,32]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %ag-done = bf16[8,32]{1,0} all-gather-done(%ag-start)
  %f = f32[16,32]{1,0} fusion(%x, %ag-done), kind=kOutput, calls=%fused_dot, frontend_attributes={kernel_metadata={
}}
  %ar = f32[16,32]{1,0} all-reduce(%f), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add
  %rs = f32[4,32]{1,0} reduce-scatter(%ar), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  ROOT %g = f32[16,32]{1,0} all-gather(%rs), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
}
"""


def test_collectives_read_from_hlo_text():
    found = collectives(HLO, devices=4)
    # all-gathers: the async one's result is the -done's type, 8*32 bf16 = 512 B over 4
    # devices, plus the sync one, 16*32 f32 = 2048 B: link bytes 3/4 of each.
    assert found["all-gather"].count == 2
    assert found["all-gather"].output_bytes == 512 + 2048
    assert found["all-gather"].bytes == 512 * 3 // 4 + 2048 * 3 // 4
    # all-reduce over groups of 2: 2048 B, sent 2 * 1/2 of it.
    assert found["all-reduce"] == (1, 2048, 2048)
    # reduce-scatter to 4*32 f32 = 512 B over 4: 3 partial sums of 512 B sent.
    assert found["reduce-scatter"] == (1, 512, 1536)


SHARD_MAP_HLO = """
ENTRY %main (a: f32[2,32], b: f32[3,32]) -> (f32[8,32], f32[12,32]) {
  %a = f32[2,32]{1,0} parameter(0)
  %b = f32[3,32]{1,0} parameter(1)
  %ga = f32[8,32]{1,0} all-gather(%a), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %gb = f32[12,32]{1,0} all-gather(%b), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %r = f32[32]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  ROOT %t = (f32[8,32]{1,0}, f32[12,32]{1,0}) tuple(%ga, %gb)
}
"""


def test_collectives_that_share_a_channel_outside_fusions_each_count():
    # jax.shard_map gives every collective it writes channel_id=1: two all-gathers of
    # two weights are two, not one piece of a TPU's async collective fusion.
    found = collectives(SHARD_MAP_HLO, devices=4)
    assert found["all-gather"].count == 2
    assert found["all-gather"].output_bytes == (8 + 12) * 32 * 4
    by_group = collectives(SHARD_MAP_HLO, devices=4, by_group=True)
    assert set(by_group) == {("all-gather", 4), ("all-reduce", 2)}


def test_matmul_dtypes_look_up_named_operands():
    assert matmul_dtypes(HLO) == {("bf16", "bf16", "f32"): 1}


LOOP_HLO = """
%cond (p: (bf16[8,32], u32[])) -> pred[] {
  %p = (bf16[8,32]{1,0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%body (p: (bf16[8,32], u32[])) -> (bf16[8,32], u32[]) {
  %p = (bf16[8,32]{1,0}, u32[]) parameter(0)
  %x = bf16[8,32]{1,0} get-tuple-element(%p), index=0
  %cp-start = (bf16[8,32]{1,0}, bf16[8,32]{1,0}, u32[], u32[]) collective-permute-start(%x), source_target_pairs={{0,1},{1,0}}
  %cp-done = bf16[8,32]{1,0} collective-permute-done(%cp-start)
  ROOT %t = (bf16[8,32]{1,0}, u32[]) tuple(%cp-done, %i)
}
ENTRY %main (x: bf16[8,32]) -> bf16[8,32] {
  %x = bf16[8,32]{1,0} parameter(0)
  %w = (bf16[8,32]{1,0}, u32[]) while(%t0), condition=%cond, body=%body
  ROOT %g = bf16[8,32]{1,0} get-tuple-element(%w), index=0
}
"""


def test_a_collective_in_a_loop_counts_once_per_trip():
    # The loop runs while i < 4: four permutes of 8*32 bf16 = 512 B each.
    assert collectives(LOOP_HLO, devices=2)["collective-permute"] == (4, 4 * 512, 4 * 512)


def test_windowed_einsum_loops_are_found():
    hlo = (
        "  %while.1 = (bf16[8,4]{1,0}, u32[]) while(%t), condition=%wide.windowed_dot_"
        "general_cond_ag.1, body=%wide.windowed_dot_general_body_ag.1, metadata={}\n"
        "  %while.2 = (f32[4]{0}, s32[]) while(%u), condition=%cond, body=%scan_body\n"
    )
    assert windowed_loops(hlo) == 1


# Hand-written (the exercise bug_bf16_scatter is graded on it too): an f32
# scatter-add two fusions deep, and a bf16 one as XLA's CPU compiler in JAX 0.10
# writes it, an f32 result whose combiner rounds each sum to bf16.
SCATTER_HLO = os.path.join(os.path.dirname(__file__), "fixtures", "scatters.hlo.txt")


def test_each_scatter_with_its_kernel_and_the_dtype_its_sums_are_held_in():
    with open(SCATTER_HLO) as f:
        found = scatters(f.read())
    assert [tuple(s) for s in found] == [
        ("wrapped_scatter", "scatter-add.4", "f32", (256, 48)),  # two fusions deep
        ("scatter-add.5", "scatter-add.5", "bf16", (256, 48)),  # f32 typed, bf16 held
    ]


def test_the_h100_step_summed_its_embedding_gradient_in_bf16():
    """The course step the first H100 run compiled, before the fix (tests/fixtures/
    h100): the lookup's gradient, bf16[256, 512], in the kernel its trace names
    input_scatter_fusion, 4.6-146 ms a step; the target's logit picked by
    take_along_axis, an f32 scatter into [B, S, V]. Read from the file by hand."""
    path = os.path.join(os.path.dirname(__file__), "fixtures", "h100", "profile-early")
    with gzip.open(os.path.join(path, "step.hlo.txt.gz"), "rt") as f:
        found = scatters(f.read())
    assert [(s.kernel, s.dtype, s.shape) for s in found] == [
        ("input_scatter_fusion", "bf16", (256, 512)),
        ("input_scatter_fusion.1", "f32", (256, 128, 256)),
    ]

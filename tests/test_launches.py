"""The kernels a decode token launches (roofline/compiled/launches.py), read off
a hand-written program whose launches are counted here by hand: a decode loop
whose body runs a command buffer, a library call and fusions beside views and
markers that launch nothing, and a condition that launches one kernel."""

from roofline.compiled.launches import kernel_launches, kernels_per_token, launch_text

# Per token, by hand: in the body, the command buffer's two fusions (a convert and
# a multiply-and-reduce of two arrays), a cuBLAS gemm, a Triton fusion, the cache
# write (a dynamic-update-slice fusion), an all-reduce (its -start; the -done launches
# nothing) and the elementwise fusion an async-start runs: 7; the condition's compare
# fusion: 1. The bitcast, the get-tuple-elements, the tuple, the parameter and the
# Sharding marker launch nothing. Outside the loop: one copy, once per call.
DECODE_HLO = """
HloModule decode, is_scheduled=true

%fused_convert (p0: f32[8]) -> bf16[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %c = bf16[8]{0} convert(%p0)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_matvec (p0: f32[8,8], p1: f32[8]) -> f32[8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %bc = f32[8,8]{1,0} broadcast(%p1), dimensions={1}
  %m = f32[8,8]{1,0} multiply(%p0, %bc)
  %z = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(%m, %z), dimensions={1}, to_apply=%add
}

%fused_softmax (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %e = f32[8]{0} exponential(%p0)
}

%fused_write (p0: f32[8,8], p1: f32[1,8], p2: s32[]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[1,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[8,8]{1,0} dynamic-update-slice(%p0, %p1, %p2, %z)
}

%fused_compare (p0: s32[]) -> pred[] {
  %p0 = s32[] parameter(0)
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%p0, %n), direction=LT
}

%async_body (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %side = f32[8]{0} fusion(%p0), kind=kLoop, calls=%fused_softmax
}

%command_buffer (p0: f32[8], p1: f32[8,8]) -> (bf16[8], f32[8]) {
  %p0 = f32[8]{0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %convert_fusion = bf16[8]{0} fusion(%p0), kind=kLoop, calls=%fused_convert
  %matvec_fusion = f32[8]{0} fusion(%p1, %p0), kind=kInput, calls=%fused_matvec
  ROOT %t = (bf16[8]{0}, f32[8]{0}) tuple(%convert_fusion, %matvec_fusion)
}

%body (arg: (s32[], f32[8], f32[8,8])) -> (s32[], f32[8], f32[8,8]) {
  %arg = (s32[], f32[8]{0}, f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[8]{0} get-tuple-element(%arg), index=1
  %w = f32[8,8]{1,0} get-tuple-element(%arg), index=2
  %call = (bf16[8]{0}, f32[8]{0}) call(%x, %w), to_apply=%command_buffer
  %y = f32[8]{0} get-tuple-element(%call), index=1
  %marked = f32[8]{0} custom-call(%y), custom_call_target="Sharding"
  %row = f32[1,8]{1,0} bitcast(%marked)
  %gemm = f32[8,8]{1,0} custom-call(%w, %w), custom_call_target="__cublas$gemm"
  %soft = f32[8]{0} fusion(%y), kind=kCustom, calls=%fused_softmax, backend_config={"fusion_backend_config":{"kind":"__triton"}}
  %cache = f32[8,8]{1,0} fusion(%gemm, %row, %i), kind=kLoop, calls=%fused_write
  %ar = f32[8]{0} all-reduce-start(%y), replica_groups={}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ar)
  %as = ((f32[8]{0}), f32[8]{0}, s32[]) async-start(%ard), calls=%async_body
  %ad = f32[8]{0} async-done(%as)
  ROOT %out = (s32[], f32[8]{0}, f32[8,8]{1,0}) tuple(%i, %soft, %cache)
}

%cond (arg: (s32[], f32[8], f32[8,8])) -> pred[] {
  %arg = (s32[], f32[8]{0}, f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  ROOT %lt_fusion = pred[] fusion(%i), kind=kLoop, calls=%fused_compare
}

ENTRY %main (x: f32[8], w: f32[8,8]) -> (s32[], f32[8], f32[8,8]) {
  %x = f32[8]{0} parameter(0)
  %w = f32[8,8]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %xc = f32[8]{0} copy(%x)
  %init = (s32[], f32[8]{0}, f32[8,8]{1,0}) tuple(%zero, %xc, %w)
  ROOT %loop = (s32[], f32[8]{0}, f32[8,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"16"}}
}
"""


def test_a_token_counts_the_body_the_condition_and_the_command_buffer_inside():
    found = kernel_launches(DECODE_HLO)
    assert found.loop
    assert found.per_token == 8
    assert found.command_buffers == 1
    assert found.outside == 1  # the copy before the loop, once a call
    assert found.kinds == {
        "convert": 1,
        "matvec": 1,
        "cublas": 1,
        "triton": 1,
        "dus": 1,
        "collective": 1,
        "loop": 2,  # the async fusion and the condition's compare
    }
    assert kernels_per_token(DECODE_HLO) == (8, found.kinds)


def test_a_program_without_a_loop_is_one_token():
    # The body alone as ENTRY: its seven kernels, the command buffer's two among them.
    one_step = DECODE_HLO.replace("%body (arg", "ENTRY %body (arg").replace("ENTRY %main", "%main")
    found = kernel_launches(one_step)
    assert not found.loop and found.per_token == 7 and found.command_buffers == 1


def test_the_line_names_each_kind_most_frequent_first():
    text = launch_text(kernel_launches(DECODE_HLO))
    assert text.startswith("a token 8 (2 loop fusions")
    for words in ("cuBLAS gemm", "Triton fusion", "multiply-and-reduce", "in 1 command buffer"):
        assert words in text, text

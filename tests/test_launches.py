"""The kernels a decode token launches (roofline/compiled/launches.py), read off
a hand-written program whose launches are counted here by hand: a decode loop
whose body runs a command buffer, a library call and fusions beside views and
markers that launch nothing, and a condition that launches one kernel only where
the loop's trip count is unknown; and programs compiled for h100:1, held to the
kernels XLA's own thunk sequence lists."""

import re

import jax
import jax.numpy as jnp
from helpers import need

from roofline.compiled.launches import kernel_launches, kernels_per_token, launch_text

# Per token, by hand: in the body, the command buffer's two fusions (a convert and
# a multiply-and-reduce of two arrays), a cuBLAS gemm, a Triton fusion, the cache
# write (a dynamic-update-slice fusion), an all-reduce (its -start; the -done launches
# nothing) and the elementwise fusion an async-start runs: 7. The condition's compare
# fusion runs only where the trip count is unknown: 1 more. The bitcast, the get-tuple-elements, the tuple, the parameter and the
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


UNKNOWN_TRIPS_HLO = DECODE_HLO.replace(', backend_config={"known_trip_count":{"n":"16"}}', "")


def test_a_token_counts_the_body_and_the_command_buffer_inside():
    found = kernel_launches(DECODE_HLO)
    assert found.loop
    assert found.per_token == 7
    assert found.command_buffers == 1
    assert found.outside == 1  # the copy before the loop, once a call
    assert found.kinds == {
        "convert": 1,
        "matvec": 1,
        "cublas": 1,
        "triton": 1,
        "dus": 1,
        "collective": 1,
        "loop": 1,  # the async fusion
    }
    assert kernels_per_token(DECODE_HLO) == (7, found.kinds)


def test_a_loop_of_unknown_trips_runs_its_condition_each_trip():
    assert UNKNOWN_TRIPS_HLO != DECODE_HLO
    found = kernel_launches(UNKNOWN_TRIPS_HLO)
    assert found.per_token == 8 and found.kinds["loop"] == 2  # and the compare


def test_a_program_without_a_loop_is_one_token():
    # The body alone as ENTRY: its seven kernels, the command buffer's two among them.
    one_step = DECODE_HLO.replace("%body (arg", "ENTRY %body (arg").replace("ENTRY %main", "%main")
    found = kernel_launches(one_step)
    assert not found.loop and found.per_token == 7 and found.command_buffers == 1


def test_the_line_names_each_kind_most_frequent_first():
    text = launch_text(kernel_launches(UNKNOWN_TRIPS_HLO))
    assert text.startswith("a token 8 (2 loop fusions")
    for words in ("cuBLAS gemm", "Triton fusion", "multiply-and-reduce", "in 1 command buffer"):
        assert words in text, text


def thunks(dump):
    """The kernels XLA's GPU thunk sequence (its own list of what the program runs,
    dumped as it compiled) puts in the loop's body and in its condition."""
    (listing,) = dump.glob("*thunk_sequence.txt")
    body = condition = 0
    part = None
    for line in listing.read_text().splitlines():
        if line.strip() in ("condition:", "body:"):
            part = line.strip()
        elif re.search(r": k(Custom)?Kernel ", line):
            body += part == "body:"
            condition += part == "condition:"
    return body, condition


def test_the_count_is_xla_s_own_list_of_kernels(tmp_path):
    """Two loops compiled for h100:1: a fori_loop (its 16 trips known: XLA's WhileThunk
    runs the body 16 times and never the condition) and a while_loop that stops on a
    value (its condition runs every trip). Each token's count is the kernels XLA's thunk
    sequence lists in the body, and in the condition only for the second."""
    need("gpu")
    from sessions.plan import programs

    _, devices = programs.devices_for("h100:1")
    on_chip = jax.sharding.SingleDeviceSharding(devices[0])
    x = jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=on_chip)

    def fixed(x):
        return jax.lax.fori_loop(0, 16, lambda i, x: jnp.sin(x) * 2 + i, x)

    def until(x):
        grow = lambda c: (c[0] + 1, jnp.sin(c[1]) * 2)  # noqa: E731
        return jax.lax.while_loop(lambda c: c[1].sum() < 1e6, grow, (0, x))

    for program, runs_condition in ((fixed, False), (until, True)):
        dump = tmp_path / program.__name__
        compiled = jax.jit(program).lower(x).compile({"xla_dump_to": str(dump)})
        body, condition = thunks(dump)
        assert body >= 1 and condition >= 1, (body, condition)
        expected = body + (condition if runs_condition else 0)
        assert kernels_per_token(compiled)[0] == expected, program.__name__

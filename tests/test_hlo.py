"""roofline/compiled/hlo.py: the one reader of HLO text, on snippets written as XLA prints
them and on a program compiled on this CPU."""

import jax
import jax.numpy as jnp

from roofline.compiled.arrays import Array, array_bytes, arrays
from roofline.compiled.hlo import parse, parse_instruction

# A partitioned step as a TPU compiler prints it: an async all-gather, a fusion
# whose attribute spans two lines (the second starts with a brace, as a
# computation's end does), layouts with tiles, a tuple type with an index comment.
STEP = """HloModule jit_step, num_partitions=4, entry_computation_layout={(bf16[16,8]{1,0})->f32[16,32]{1,0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_dot (p0: bf16[16,8], p1: bf16[8,32]) -> f32[16,32] {
  %p0 = bf16[16,8]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[8,32]{1,0} parameter(1)
  ROOT %d = f32[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
}

ENTRY %main.7 (x: bf16[16,8], w: bf16[2,32]) -> f32[16,32] {
  %x = bf16[16,8]{1,0} parameter(0)
  %w = bf16[2,32]{1,0} parameter(1)
  %ag-start = (bf16[2,32]{1,0}, /*index=1*/bf16[8,32]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %ag-done = bf16[8,32]{1,0} all-gather-done(%ag-start)
  %f = f32[16,32]{1,0} fusion(%x, %ag-done), kind=kOutput, calls=%fused_dot, frontend_attributes={kernel_metadata={
}}
  %cc = f32[16,32]{1,0} custom-call(f32[16,32]{1,0} %f), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/dot(a, b)" source_file="x.py"}
  ROOT %ar = f32[16,32]{1,0} all-reduce(%cc), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add
}
"""

# A loop of four trips (counter < 4) whose body calls a fusion, inside an outer
# loop of three: the inner body runs 12 times a step. A loop to a traced count
# (a fori_loop to a traced n) counts once.
LOOPS = """
%inner_cond (p: (f32[8], u32[])) -> pred[] {
  %p = (f32[8]{0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%fused_tanh (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  ROOT %t = f32[8]{0} tanh(%a)
}
%inner_body (p: (f32[8], u32[])) -> (f32[8], u32[]) {
  %p = (f32[8]{0}, u32[]) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=0
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_tanh
  ROOT %t = (f32[8]{0}, u32[]) tuple(%f, %i)
}
%outer_cond (p: (f32[8], u32[])) -> pred[] {
  %p = (f32[8]{0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%outer_body (p: (f32[8], u32[])) -> (f32[8], u32[]) {
  %p = (f32[8]{0}, u32[]) parameter(0)
  ROOT %w = (f32[8]{0}, u32[]) while(%p), condition=%inner_cond, body=%inner_body
}
%traced_cond (p: (f32[8], s32[], s32[])) -> pred[] {
  %p = (f32[8]{0}, s32[], s32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=1
  %n = s32[] get-tuple-element(%p), index=2
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%traced_body (p: (f32[8], s32[], s32[])) -> (f32[8], s32[], s32[]) {
  ROOT %p = (f32[8]{0}, s32[], s32[]) parameter(0)
}
ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %w = (f32[8]{0}, u32[]) while(%x), condition=%outer_cond, body=%outer_body
  %v = (f32[8]{0}, s32[], s32[]) while(%x), condition=%traced_cond, body=%traced_body
  ROOT %g = f32[8]{0} get-tuple-element(%w), index=0
}
"""


def test_computations_are_read_in_order_with_the_entry_marked():
    module = parse(STEP)
    assert list(module.computations) == ["add", "fused_dot", "main.7"]
    assert module.entry.name == "main.7"
    assert not module.computations["add"].entry
    assert module.computations["fused_dot"].parameters == (
        ("p0", "bf16[16,8]"),
        ("p1", "bf16[8,32]"),
    )
    assert [op.name for op in module.entry.instructions] == [
        "x",
        "w",
        "ag-start",
        "ag-done",
        "f",
        "cc",
        "ar",
    ]
    assert module.entry.root.name == "ar"


def test_an_instruction_s_parts():
    ops = {op.name: op for _, op in parse(STEP).instructions()}
    start = ops["ag-start"]
    assert start.opcode == "all-gather-start" and start.operands == ("w",)
    assert start.arrays == (Array("bf16", (2, 32)), Array("bf16", (8, 32)))
    assert start.attributes["replica_groups"] == "[1,4]<=[4]"
    assert start.attributes["channel_id"] == "1"
    fusion = ops["f"]  # its frontend_attributes span two lines
    assert fusion.operands == ("x", "ag-done")
    assert fusion.calls == {"calls": ("fused_dot",)}
    assert fusion.attributes["kind"] == "kOutput"
    assert fusion.attributes["frontend_attributes"] == "{kernel_metadata={\n}}"
    call = ops["cc"]  # an operand printed with its type; a quoted comma
    assert call.operands == ("f",) and call.target == "__cublas$gemm"
    assert call.attributes["metadata"].startswith('{op_name="jit(step)/dot(a, b)"')
    assert ops["ar"].called == ("add",) and ops["ar"].root
    assert ops["x"].literal == "0" and ops["x"].operands == ()
    assert ops["p0"].shape == (16, 8) and ops["p0"].dtype == "bf16"
    assert ops["d"].attributes["operand_precision"] == "{highest,highest}"


def test_operand_types_are_looked_up_by_name():
    module = parse(STEP)
    assert module.types["ag-done"] == "bf16[8,32]{1,0}"
    assert module.types["p1"] == "bf16[8,32]{1,0}"  # the instruction's, not the header's
    assert array_bytes(module.types["ag-start"]) == (2 * 32 + 8 * 32) * 2


def test_array_types():
    assert arrays("f32[]") == (Array("f32", ()),)
    assert arrays("(bf16[2,32]{1,0}, u32[])")[1] == Array("u32", ())
    assert arrays("f32[<=8,4]{1,0}") == (Array("f32", (8, 4)),)  # a dynamic bound
    assert array_bytes("f32[1024,1024]{1,0:T(8,128)}") == 4 * 2**20
    assert array_bytes("(token[], f8e4m3fn[16])") == 16


def test_trip_counts_multiply_through_nested_loops_and_reach_called_computations():
    times = parse(LOOPS).trip_counts
    assert times["outer_body"] == 3
    assert times["inner_body"] == 12  # 3 outer trips x 4 inner ones
    assert times["fused_tanh"] == 12  # called by the inner body
    assert times["traced_body"] == 1  # a traced count (i < n) counts once
    assert "main" not in times and "traced_cond" not in times


def test_a_trip_count_the_compiler_states_is_taken_as_stated():
    """The NVIDIA compiler's loop conditions are fusions, not a compare it can
    be read from; it states the count in the loop's backend_config instead."""
    stated = LOOPS.replace(
        "condition=%traced_cond, body=%traced_body",
        'condition=%traced_cond, body=%traced_body, backend_config={"known_trip_count":{"n":"16"}}',
    )
    assert parse(stated).trip_counts["traced_body"] == 16


def test_a_snippet_without_headers_is_one_computation():
    text = "  %w = (f32[4]{0}, s32[]) while(%t), condition=%c, body=%b, metadata={}\n"
    module = parse(text)
    (op,) = module.computations[""].instructions
    assert op.calls == {"condition": ("c",), "body": ("b",)}


def test_lines_that_are_no_instruction_are_none():
    assert parse_instruction("HloModule m, entry_computation_layout={()->f32[]}") is None
    assert parse_instruction("}") is None
    assert parse_instruction("1 {file_name_id=1 function_name_id=1 line=3}") is None


def test_a_program_compiled_on_this_cpu():
    def step(x, w):
        def body(c, _):
            return jnp.tanh(c @ w), None

        y, _ = jax.lax.scan(body, x, None, length=3)
        return jnp.sum(y**2)

    x, w = jnp.ones((16, 32)), jnp.ones((32, 32))
    text = jax.jit(jax.grad(step, argnums=(0, 1))).lower(x, w).compile().as_text()
    module = parse(text)
    assert module.entry is not None
    names = [op.name for _, op in module.instructions()]
    assert len(names) == len(set(names))  # names are unique within a module
    for _, op in module.instructions():
        assert op.opcode and op.type_text
        for operand in op.operands:
            assert operand in module.types, (op.name, operand)
        for called in op.called:
            assert called in module.computations, (op.name, called)
    dots = [op for _, op in module.instructions() if op.opcode == "dot"]
    assert dots and all(op.dtype == "f32" for op in dots)
    assert any(op.opcode == "while" for _, op in module.instructions())

"""Sequence parallelism (s2_train.py --sequence-parallel; Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 4.2.2) on the 8 simulated CPU
devices, and deviceless on h100:8 (tests/helpers.py need: skipped without the chip compilers).

Between the blocks the residual stream [B, S, E] is split along S over tp
(sessions/shard/sharding.py SEQUENCE_PARALLEL_SPECS); inside attention and the MLP the heads
and F stay split over tp. The arithmetic is the same, so the loss is; what changes is the
collectives and the memory plan. By hand, for L layers, each [B, S, E] a device's batch rows:

    forward   each block's output (attention's wo, the MLP's w_out): partial sums over tp,
              reduce-scattered onto the S/tp slices (2L); each block's normed input, and
              the output layer's, all-gathered before its matmuls (2L + 1)
    backward  each collective's transpose: an all-gather's is a reduce-scatter (2L + 1),
              a reduce-scatter's an all-gather (2L)

so 4L + 1 reduce-scatters and 4L + 1 all-gathers where tensor parallelism alone all-reduces
the same partial sums: 2L forward and 2L + 1 backward (fewer where XLA adds two partial sums
before one all-reduce). What the compilers wrote (JAX 0.10.2), in this file's shapes:

    h100:8   just that: no all-reduce of [B, S, E] over tp left, 4L + 1 reduce-scatters
             along S and 4L + 1 all-gathers (one of them, the embedding gradient's, laid
             out [S, B, E]), the same bytes over the links; XLA's GPU pipeline fuses an
             all-reduce and the slice after it into a reduce-scatter (ReduceScatterCreator).
    CPU      the all-gathers, 4L + 1 of them, [B, S/tp, E] -> [B, S, E]; but each
             reduce-scatter stays an all-reduce of the whole [B, S, E], then a dynamic-slice
             of the device's S/tp positions fused into the residual add: XLA's CPU pipeline
             leaves the two apart.
    v5e:2x4  its reduce-scatters are fusions named all-reduce-scatter (an all-reduce and the
             slice, run as one), which roofline/compiled/program.py counts as all-reduces.
             Not compiled here: its plans of small steps keep their temporaries off HBM
             (temp 0), and a step where the plan means something takes minutes to compile.

The memory plan: the saved tensors that live in the residual stream (each layer's input and
its sum after attention, the output layer's input) are held S/tp a device, so XLA's plan
shrinks by at least (1 - 1/tp) of (2L + 1) x [B, S, E] in the compute dtype.
"""

import collections
import dataclasses
import functools
import math

import jax
import numpy as np
import pytest
from helpers import need, s2_in_process

from roofline.compiled.arrays import arrays
from roofline.compiled.hlo import parse
from roofline.compiled.program import collective_kind, collectives, group_size
from roofline.memory import planned_bytes
from sessions.model.config import ModelConfig, TrainConfig
from sessions.plan import programs
from sessions.run.cli import resolve, train_flags
from sessions.shard import sharding
from sessions.train.step import compile_ahead, init_state, make_optimizer, make_train_step

# Sizes that differ pairwise where it matters (E, H·D, F, S, V), tp = 4 dividing H, F, V and
# S, and two sequences a device (B = 8 over data = 2) so that the S/tp slice of a device's
# rows is not one block of rows.
CFG = ModelConfig(vocab=512, embed=32, ff=80, heads=4, head_dim=12, layers=2, seq=64)
TC = TrainConfig(batch=8, steps=2, lr=1e-2, warmup=1)
MESH = "data=2,tp=4"
TP, ROWS = 4, 4  # tp, and the batch rows a device holds (B / data)
STREAM = ROWS * CFG.seq * CFG.embed  # elements of one device's [B, S, E]
BOTH = (False, True)


def stream_collectives(hlo_text, devices):
    """Counter of (kind, operand shape, result shape) for the collectives over tp (groups of
    TP devices) whose result or operand is one device's whole [B, S, E], in any layout. An
    asynchronous one is read at its start (its operands) and its done (its results)."""
    module = parse(hlo_text)
    results = {
        op.operands[0]: op.type_text
        for _, op in module.instructions()
        if collective_kind(op.opcode)[1] == "-done"
    }
    found = collections.Counter()
    for _, op in module.instructions():
        kind, phase = collective_kind(op.opcode)
        if kind is None or phase == "-done" or group_size(op.attribute_text, devices) != TP:
            continue
        ins = [arrays(module.types[name])[0].shape for name in op.operands]
        outs = [a.shape for a in arrays(results[op.name] if phase else op.type_text)]
        for shape_in, shape_out in zip(ins, outs[-len(ins) :], strict=True):
            if STREAM in (math.prod(shape_in), math.prod(shape_out)):
                found[kind, shape_in, shape_out] += 1
    return found


def by_kind(found):
    """{kind: how many} of stream_collectives' count."""
    totals = collections.Counter()
    for (kind, _, _), n in found.items():
        totals[kind] += n
    return totals


@functools.cache
def trained(sequence_parallel):
    """(losses of TC.steps steps, the compiled step) on this CPU's 8 devices over MESH."""
    cfg = dataclasses.replace(CFG, sequence_parallel=sequence_parallel)
    mesh = sharding.make_mesh(sharding.parse_mesh(MESH, 8))
    optimizer = make_optimizer(TC, TC.steps)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (TC.steps, TC.batch, cfg.seq + 1))
    with jax.set_mesh(mesh):
        init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
        state, shardings = sharding.init_sharded(init, jax.random.key(0), mesh)
        rows = sharding.batch_sharding(mesh)
        step = make_train_step(cfg, optimizer, state_shardings=shardings, batch_sharding=rows)
        batches = [
            sharding.place_batch({"inputs": t[:, :-1], "targets": t[:, 1:]}, rows) for t in tokens
        ]
        step = compile_ahead(step, state, batches[0], lambda *a: None)
        losses = []
        for batch in batches:
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
    return losses, step


def test_the_loss_is_the_loss_without_it():
    """The same steps on the same batches: only the layout differs, so the loss agrees to
    float rounding (the partial sums over tp add in another order)."""
    np.testing.assert_allclose(trained(True)[0], trained(False)[0], rtol=1e-5)


def test_on_a_cpu_the_stream_is_gathered_along_s_before_each_matmul():
    """4L + 1 all-gathers of [B, S/tp, E] into [B, S, E] over tp, none without the flag; the
    reduce-scatters stay all-reduces on a CPU (this module's docstring)."""
    slices = (ROWS, CFG.seq // TP, CFG.embed)
    whole = (ROWS, CFG.seq, CFG.embed)
    off = stream_collectives(trained(False)[1].as_text(), 8)
    on = stream_collectives(trained(True)[1].as_text(), 8)
    assert by_kind(off)["all-gather"] == 0
    assert on[("all-gather", slices, whole)] == 4 * CFG.layers + 1
    assert by_kind(on)["all-gather"] == 4 * CFG.layers + 1
    assert by_kind(on)["reduce-scatter"] == 0  # the CPU's: all-reduce, then a slice


def residual_bound(dtype_bytes):
    """Bytes the plan must lose at least: (1 - 1/tp) of the 2L + 1 stream tensors saved."""
    return (1 - 1 / TP) * (2 * CFG.layers + 1) * STREAM * dtype_bytes


def test_on_a_cpu_the_plan_holds_the_saved_stream_in_slices():
    off, on = (planned_bytes(trained(sp)[1].memory_analysis()) for sp in BOTH)
    assert off - on >= residual_bound(4)  # float32


def test_the_flag_reaches_the_model():
    argv = ["--preset", "tiny", "--mesh", MESH, "--sequence-parallel"]
    assert resolve(train_flags(argv), platform="cpu").model.sequence_parallel
    assert not resolve(train_flags(argv[:-1]), platform="cpu").model.sequence_parallel


@pytest.mark.parametrize(
    "argv",
    [
        ["--mesh", "fsdp=8"],
        [],  # every device on fsdp
        ["--mesh", "data=4,tp=2", "--seq", "63"],
    ],
    ids=["no tp", "default mesh", "seq over tp"],
)
def test_a_mesh_it_cannot_split_the_sequence_over_is_refused_in_one_line(argv, capsys):
    flags = ["--preset", "tiny", "--steps", "1", "--sample-bytes", "0", "--sequence-parallel"]
    code, err = s2_in_process([*flags, *argv], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--sequence-parallel" in err


# Deviceless: the chips' own compilers.


@functools.cache
def compiled_for(target_text, sequence_parallel):
    """The step of CFG compiled for a target over MESH, never run."""
    target, devices = programs.devices_for(target_text)
    cfg = dataclasses.replace(CFG, sequence_parallel=sequence_parallel)
    _, mesh = programs.target_mesh(MESH, target, devices)
    fn, inputs, static = programs.train_step_program(cfg, TC, mesh)
    compiled, _, _ = programs.compile_or_oom(fn, inputs, static, mesh, target.chip, print)
    return compiled


def test_on_h100_the_all_reduces_become_reduce_scatters_and_all_gathers():
    need("gpu")
    off = by_kind(stream_collectives(compiled_for("h100:8", False).as_text(), 8))
    text = compiled_for("h100:8", True).as_text()
    on = stream_collectives(text, 8)
    L = CFG.layers
    assert 4 * L <= off["all-reduce"] <= 4 * L + 1 and not off["reduce-scatter"]
    slices = (ROWS, CFG.seq // TP, CFG.embed)
    assert on[("reduce-scatter", (ROWS, CFG.seq, CFG.embed), slices)] == 4 * L + 1
    assert by_kind(on) == {"reduce-scatter": 4 * L + 1, "all-gather": 4 * L + 1}
    # Inside attention the heads stay split: its gradient is not laid out by S again.
    assert "all-to-all" not in collectives(text, 8)


def test_on_h100_the_plan_holds_the_saved_stream_in_slices():
    need("gpu")
    off, on = (planned_bytes(compiled_for("h100:8", sp).memory_analysis()) for sp in BOTH)
    assert off - on >= residual_bound(4)  # float32

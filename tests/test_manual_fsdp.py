"""FSDP written by hand (sessions/train/manual_fsdp.py) against the partitioner's:
the same losses step for step, and a compiled program that holds the
collectives the source writes and no others."""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from helpers import need, run_script, s2_in_process

from roofline.compiled.hlo import parse
from roofline.compiled.program import collectives, collectives_table
from roofline.compiled.scatters import scatters
from sessions.model.config import PRESETS
from sessions.shard import sharding
from sessions.train import data
from sessions.train.manual_fsdp import make_manual_step
from sessions.train.step import init_state, make_optimizer, make_train_step

PRESET = PRESETS["tiny"]
CFG = PRESET.model
TC = dataclasses.replace(PRESET.train, steps=4)
OPTIMIZER = make_optimizer(TC, TC.steps)
TRAIN = data.split(data.default_corpus(), CFG.seq)[0]
MESHES = ["fsdp=8", "data=2,fsdp=4"]


def train(mesh_text, manual):
    """(losses, grad norms, compiled HLO text) of TC.steps steps over 8 devices."""
    mesh = sharding.make_mesh(sharding.parse_mesh(mesh_text, 8))
    with jax.set_mesh(mesh):
        init = functools.partial(init_state, cfg=CFG, optimizer=OPTIMIZER)
        state, shardings = sharding.init_sharded(init, jax.random.key(TC.seed), mesh)
        rows = sharding.batch_sharding(mesh)
        if manual:
            step = make_manual_step(CFG, OPTIMIZER, TC.clip, shardings, rows)
        else:
            step = make_train_step(CFG, OPTIMIZER, state_shardings=shardings, batch_sharding=rows)
        batches = [
            sharding.place_batch(
                data.get_batch(TRAIN, i, batch=TC.batch, seq=CFG.seq, seed=TC.seed), rows
            )
            for i in range(TC.steps)
        ]
        compiled = step.lower(state, batches[0]).compile()
        losses, norms = [], []
        for batch in batches:
            state, metrics = compiled(state, batch)
            losses.append(float(metrics["loss"]))
            norms.append(float(metrics["grad_norm"]))
    return losses, norms, compiled.as_text()


@pytest.fixture(scope="module", params=MESHES)
def both(request):
    return request.param, train(request.param, manual=False), train(request.param, manual=True)


def test_manual_and_automatic_fsdp_train_alike(both):
    # The same sums in another order (the partitioner's reductions are not ours):
    # float32 rounding, 1e-7 relative per op, stays far below 1e-5 over 4 steps.
    # The gradient norm is checked too: AdamW hardly notices a gradient scaled by
    # a constant (a forgotten 1/fsdp), its norm does.
    mesh_text, (auto_loss, auto_norm, _), (loss, norm, _) = both
    np.testing.assert_allclose(loss, auto_loss, rtol=1e-5, err_msg=mesh_text)
    np.testing.assert_allclose(norm, auto_norm, rtol=1e-5, err_msg=mesh_text)
    assert loss[-1] < loss[0] - 1  # it learns: the steps are not all alike


def hand_collectives(cfg, sizes):
    """{(kind, devices per group): (ops, bytes of their results per device)} of the
    manual step, written out from the model's shapes, in float32.

    Split over fsdp: the embedding [V, E], positions [S, E], and per layer q, k, v,
    o [E, H, D] and the MLP's [E, F], [F, E]; replicated: 2 norm scales [E] per
    layer and the final one. Forward: one all-gather per split weight, with the
    whole weight as its result. Backward: one reduce-scatter each, with the shard.
    The backward gathers each layer's weights again (6 per layer), unless the
    compiler merges that gather with the forward's, the same instruction on the
    same shard: JAX 0.10.2's CPU pipeline drops the checkpoint's optimisation
    barrier and merges them; JAX 0.12's keeps them apart, as a TPU does
    (test_tpu_gathers_the_weights_again_in_the_backward). Either is allowed here.
    Then all-reduces, None ops where XLA's all-reduce combiner merges them: over
    fsdp the norm scales' gradients, the loss and the squared norm of the
    gradient shards (two scalars); over data every gradient shard and the loss."""
    V, E, F, H, D, L, S = cfg.vocab, cfg.embed, cfg.ff, cfg.heads, cfg.head_dim, cfg.layers, cfg.seq
    fsdp, n_data, f32 = sizes["fsdp"], sizes["data"], 4
    whole = f32 * (V * E + S * E + L * (4 * E * H * D + 2 * E * F))
    split = 2 + 6 * L
    norms = f32 * (2 * L + 1) * E
    layer_weights = f32 * L * (4 * E * H * D + 2 * E * F)
    expected = {
        ("all-gather", fsdp): {(split, whole), (split + 6 * L, whole + layer_weights)},
        ("reduce-scatter", fsdp): (split, whole // fsdp),
        ("all-reduce", fsdp): (None, norms + 2 * f32),
    }
    if n_data > 1:
        expected[("all-reduce", n_data)] = (None, whole // fsdp + norms + f32)
    return expected


def test_the_compiled_manual_step_holds_the_collectives_written_and_no_others(both):
    mesh_text, _, (_, _, hlo) = both
    sizes = sharding.parse_mesh(mesh_text, 8)
    found = collectives(hlo, 8, by_group=True)
    expected = hand_collectives(CFG, sizes)
    assert set(found) == set(expected), mesh_text
    gathered = found[("all-gather", sizes["fsdp"])]
    allowed = expected.pop(("all-gather", sizes["fsdp"]))
    assert (gathered.count, gathered.output_bytes) in allowed, mesh_text
    for key, (ops, out_bytes) in expected.items():
        assert found[key].output_bytes == out_bytes, (mesh_text, key)
        if ops is not None:
            assert found[key].count == ops, (mesh_text, key)


def test_manual_moves_no_more_bytes_than_the_partitioner(both):
    # Each weight crosses the links once gathered and once reduce-scattered; the
    # partitioner's own program moves at least as much (and more: it all-reduces
    # gradients that are then sliced, and reshuffles activations with all-to-alls).
    mesh_text, (_, _, auto_hlo), (_, _, hlo) = both

    def total(text):
        return sum(c.bytes for c in collectives(text, 8).values())

    assert total(hlo) <= total(auto_hlo), mesh_text


def test_the_table_sets_the_two_programs_side_by_side(both):
    _, (_, _, auto_hlo), (_, _, hlo) = both
    lines = collectives_table({"manual": hlo, "auto": auto_hlo}, 8)
    assert lines[0].split() == ["collective", "manual", "auto"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    # The partitioner writes no reduce-scatter here; manual none of its all-to-alls.
    assert rows["reduce-scatter"][0] == str(2 + 6 * CFG.layers) and rows["reduce-scatter"][4] == "0"
    assert set(rows) == set(collectives(hlo, 8)) | set(collectives(auto_hlo, 8))


def test_manual_collectives_with_tp_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--preset", "tiny", "--mesh", "fsdp=4,tp=2", "--collectives", "manual"]
    code, err = s2_in_process([*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "tp=1" in err and "not tp=2" in err


def test_s2_train_runs_the_manual_step_and_says_so(tmp_path, capsys):
    # TC's steps on MESHES[0]: the step `both` compiled there, read back from the compile cache.
    argv = ["--preset", "tiny", "--steps", str(TC.steps), "--log-every", "1", "--mesh", "fsdp=8"]
    argv += ["--collectives", "manual", "--sample-bytes", "0", "--run-dir", str(tmp_path)]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    assert "collectives: manual" in out


def test_tpu_gathers_the_weights_again_in_the_backward(tmp_path, capsys):
    # Compiled for a TPU slice (nothing runs): there the backward's all-gathers stay
    # apart from the forward's (JAX names them checkpoint/rematted_computation), so no
    # layer's whole weights are kept from forward to backward.
    need("tpu")
    hlo = tmp_path / "step.hlo"
    argv = ["--target", "tpu-v5e:2x4", "--preset", "tiny", "--mesh", "fsdp=8"]
    argv += ["--collectives", "manual", "--hlo-out", str(hlo)]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    assert "collectives: manual" in out
    names = {
        op.attributes.get("metadata", "")
        for _, op in parse(hlo.read_text()).instructions()
        if op.opcode.startswith("all-gather")
    }
    assert any("rematted_computation/all_gather" in n for n in names)
    assert any("jvp()/all_gather" in n and "rematted" not in n for n in names)


def test_the_manual_step_in_bf16_sums_the_lookup_s_gradient_in_float32():
    """The shards are cast to bf16 before their all-gathers (half the bytes sent),
    but the embedding is gathered in float32 for its lookup, whose gradient is a
    scatter-add (sessions/model/transformer.py, embed). Compiled here, never run."""
    cfg = dataclasses.replace(CFG, dtype="bfloat16", layers=1)
    mesh = sharding.make_mesh(sharding.parse_mesh("fsdp=8", 8))
    with jax.set_mesh(mesh):
        init = functools.partial(init_state, cfg=cfg, optimizer=OPTIMIZER)
        state = sharding.abstract_sharded(init, jax.random.key(TC.seed), mesh)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        rows = sharding.batch_sharding(mesh)
        batch = jax.ShapeDtypeStruct((TC.batch, cfg.seq), "int32", sharding=rows)
        step = make_manual_step(cfg, OPTIMIZER, TC.clip, shardings, rows)
        hlo = step.lower(state, {"inputs": batch, "targets": batch}).compile().as_text()
    found = scatters(hlo)
    assert (cfg.vocab, cfg.embed) in {s.shape for s in found}  # the whole table, each device
    assert {s.dtype for s in found} == {"f32"}, found

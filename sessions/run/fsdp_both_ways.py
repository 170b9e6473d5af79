"""Session 4's check of FSDP by hand: the same steps trained twice, once with the
partitioner's collectives (`--collectives auto`) and once with those written in
sessions/manual_fsdp.py, from the same state on the same batches.
"""

import functools

import jax

from sessions import data, sharding
from sessions.config import PRESETS
from sessions.manual_fsdp import make_manual_step
from sessions.train import init_state, make_optimizer, make_train_step


def train_both_ways(mesh_text, steps, devices, preset="tiny"):
    """{"auto" | "manual": (losses, compiled step)}: the same `steps` steps of
    `preset` over `mesh_text` on `devices`, from the same initial state and
    batches, once with the partitioner's collectives and once with ours."""
    cfg, tc = PRESETS[preset].model, PRESETS[preset].train
    optimizer = make_optimizer(tc, steps)
    tokens = data.split(data.default_corpus(), cfg.seq)[0]
    mesh = sharding.make_mesh(sharding.parse_mesh(mesh_text, len(devices)), devices)
    runs = {}
    with jax.set_mesh(mesh):
        rows = sharding.batch_sharding(mesh)
        init = functools.partial(init_state, cfg=cfg, optimizer=optimizer)
        for mode in ("auto", "manual"):
            state, shardings = sharding.init_sharded(init, jax.random.key(tc.seed), mesh)
            if mode == "manual":
                step = make_manual_step(cfg, optimizer, tc.clip, shardings, rows)
            else:
                step = make_train_step(
                    cfg, optimizer, state_shardings=shardings, batch_sharding=rows
                )
            batches = [
                sharding.place_batch(
                    data.get_batch(tokens, i, batch=tc.batch, seq=cfg.seq, seed=tc.seed), rows
                )
                for i in range(steps)
            ]
            compiled = step.lower(state, batches[0]).compile()
            losses = []
            for batch in batches:
                state, metrics = compiled(state, batch)
                losses.append(float(metrics["loss"]))
            runs[mode] = (losses, compiled)
    return runs

"""scripts/profile_s2.py profiles the step on the mesh it trains on: the XLA
column is the step compiled for that mesh, and the trace holds every device."""

import json
import os

from helpers import hand_flops, run_script

from roofline.measured.record import METADATA
from sessions.model.config import PRESETS


def test_profile_s2_traces_the_step_on_its_mesh(tmp_path, capsys):
    logdir = str(tmp_path / "prof")
    argv = ["--preset", "tiny", "--steps", "4", "--mesh", "fsdp=4,tp=2", "--logdir", logdir]
    code, out, _ = run_script("scripts/profile_s2.py", argv, capsys)
    assert code == 0
    assert "8 x cpu" in out
    assert "step time: the log" in out and "the trace" in out
    with open(os.path.join(logdir, METADATA)) as f:
        record = json.load(f)
    assert record["devices"] == 8
    # XLA's count of the partitioned step, all 8 devices together, is the
    # whole step's: within a few percent of the hand count (elementwise work
    # and the optimizer on top of the matmuls), not an eighth of it.
    exact = sum(hand_flops(PRESETS["tiny"].model, PRESETS["tiny"].train.batch))
    assert 1.0 <= record["xla_flops"] / exact < 1.2

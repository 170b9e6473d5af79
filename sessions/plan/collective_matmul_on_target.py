"""The collective matmuls of sessions/shard/collective_matmul.py, compiled for a chip
this machine may lack: each device of the chip's slice on one fsdp ring, so a
session script can print what the scheduler made of each
(roofline/compiled/schedule.py).
"""

from sessions.plan import programs
from sessions.shard.collective_matmul import (
    GPT2_MLP,
    allgather_matmul,
    auto_matmul,
    collective_matmul,
    compiled_matmul,
)


def programs_on(target_text, shape=GPT2_MLP):
    """{name: compiled program text} of the three matmuls for a chip this machine
    may lack ('tpu-v5e:2x4'), every device on the fsdp ring. A session script prints

        for name, text in programs_on("tpu-v5e:2x4").items():
            print(schedule_line(name, schedule_summary(text)))
    """
    target, devices = programs.devices_for(target_text)
    _, mesh = programs.target_mesh(f"fsdp={len(devices)}", target, devices)
    matmuls = (allgather_matmul, collective_matmul, auto_matmul)
    return {m.__name__: compiled_matmul(m, mesh, shape).as_text() for m in matmuls}

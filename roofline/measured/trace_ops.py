"""The ops a trace holds, from any chip: each op that ran, where and when.

jax.profiler writes LOGDIR/plugins/profile/<timestamp>/<host>.xplane.pb, one
file per host (roofline/measured/xspace.py reads one). Where the ops are depends on the
chip that ran them:

  CPU  plane "/host:CPU": the runtime's thunks on its worker threads, each with
       the stats hlo_op, hlo_module, run_id (one per execution of a program) and
       device_ordinal (xla/backends/cpu/runtime/thunk_executor.cc).
  GPU  plane "/device:GPU:N", one line per CUDA stream, "Stream #S(...)": the
       kernels CUPTI saw, each named by itself, with the annotation XLA pushed
       around each launch parsed into stats hlo_op, hlo_module, program_id, and a
       correlation_id; no run_id (xla/backends/profiler/gpu/cupti_collector.cc,
       CreateXEvent; xla/backends/gpu/runtime/annotation.cc writes the
       annotations). Kernels launched from a command buffer (a CUDA graph) carry
       the buffer's annotation, hlo_op "command_buffer_N", and a
       cuda_graph_node_id: roofline/measured/kernel_ops.py finds their ops.
  TPU  plane "/device:TPU:N": line "XLA Ops", one event per op, shown by its HLO
       instruction's name, with hlo_category, program_id, flops on its metadata
       and no hlo_op; line "XLA Modules", one event per execution, named
       "jit_train_step(<fingerprint>)", with a run_id (so a real v6e capture in
       xprof's tests holds them, xprof/convert/test_xplanes/tpu_inference_2.xplane.pb).
       "Async XLA Ops" (copies and collectives in flight, with an hlo_op stat) is
       not time an op ran; xprof's trace viewer leaves it out too
       (xla/tsl/profiler/convert/xplane_to_trace_events.cc).

Plane, line and stat names are tsl's (xla/tsl/profiler/utils/xplane_schema.cc).
"""

import bisect
import dataclasses
import glob
import os
import re

from roofline.measured.xspace import read_xspace

HOST_PLANE = "/host:CPU"
TPU_PLANE = re.compile(r"/device:TPU:\d+$")  # not "/device:TPU:0 SparseCore 0"
GPU_PLANE = re.compile(r"/device:GPU:\d+$")
PS = 1e-12  # seconds per picosecond, the XSpace's unit


def run_dirs(logdir):
    """Run directories under logdir, oldest first (their names are timestamps)."""
    pattern = os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")
    return sorted({os.path.dirname(p) for p in glob.glob(pattern)})


def latest_run(logdir):
    """The newest run directory of a trace directory (or logdir itself if it is one)."""
    if glob.glob(os.path.join(logdir, "*.xplane.pb")):
        return logdir
    runs = run_dirs(logdir)
    if not runs:
        raise FileNotFoundError(
            f"no trace under {logdir} (expected plugins/profile/*/*.xplane.pb, "
            "as jax.profiler writes)"
        )
    return runs[-1]


@dataclasses.dataclass(frozen=True)
class Op:
    """One op that ran, wherever it ran. Times in picoseconds."""

    name: str  # the HLO instruction's name, e.g. "fusion.3"
    module: str  # its program, e.g. "jit_train_step"
    device: tuple  # (host file, device plane or CPU device ordinal)
    line: str  # the thread, stream or line it ran on: ops nest only within one
    start_ps: int
    end_ps: int
    execution: object = None  # which execution of the program, where the runtime says
    category: str | None = None  # the TPU's hlo_category
    kernel: str = ""  # a GPU kernel's own name ("nvjet_sm90_...", "loop_add_fusion_3")


def _tpu_ops(host, plane):
    lines = {line.name: line for line in plane.lines}
    modules = (
        sorted(plane.events(lines["XLA Modules"]), key=lambda m: m.start_ps)
        if "XLA Modules" in lines
        else []
    )
    starts = [m.start_ps for m in modules]
    for e in plane.events(lines["XLA Ops"]) if "XLA Ops" in lines else ():
        i = bisect.bisect_right(starts, e.start_ps) - 1
        module = modules[i] if i >= 0 and e.start_ps < modules[i].end_ps else None
        yield Op(
            e.name,
            re.sub(r"\(\d+\)$", "", module.name) if module else "",
            (host, plane.name),
            "XLA Ops",
            e.start_ps,
            e.end_ps,
            execution=module.start_ps if module else None,
            category=e.stats.get("hlo_category"),
        )


def _gpu_ops(host, plane):
    for line in plane.lines:
        if line.name.startswith("Stream #"):
            for e in plane.events(line, having="hlo_op"):
                yield Op(
                    str(e.stats["hlo_op"]),
                    str(e.stats.get("hlo_module", "")),
                    (host, plane.name),
                    line.name,
                    e.start_ps,
                    e.end_ps,
                    kernel=e.long_name,
                )


def _cpu_ops(host, plane):
    for line in plane.lines:
        for e in plane.events(line, having="hlo_op"):
            yield Op(
                str(e.stats["hlo_op"]),
                str(e.stats.get("hlo_module", "")),
                (host, e.stats.get("device_ordinal", 0)),
                line.name,
                e.start_ps,
                e.end_ps,
                execution=e.stats.get("run_id"),
            )


def load_ops(run_dir):
    """(platform, ops, {host: [(marker start, step number)]}) of every host's
    .xplane.pb in the run: the device planes' ops where a host has devices
    with ops, else the CPU runtime's."""
    platform, ops, markers = "cpu", [], {}
    for host, path in enumerate(sorted(glob.glob(os.path.join(run_dir, "*.xplane.pb")))):
        planes = read_xspace(path)
        found = []
        for kind, pattern, read in (("tpu", TPU_PLANE, _tpu_ops), ("gpu", GPU_PLANE, _gpu_ops)):
            found = [op for p in planes if pattern.match(p.name) for op in read(host, p)]
            if found:
                platform = kind
                break
        host_planes = [p for p in planes if p.name == HOST_PLANE]
        if not found:
            found = [op for p in host_planes for op in _cpu_ops(host, p)]
        ops += found
        markers[host] = sorted(
            (e.start_ps, int(e.stats["step_num"]))
            for p in host_planes
            for line in p.lines
            for e in p.events(line, having="step_num")
        )
    return platform, ops, markers

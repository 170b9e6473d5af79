"""Plan decoding on a chip you don't have: one decode step of each batch,
compiled for a target, read and put on the roofline (s3_infer.py --target).

Per device: what it holds (weights, its rows of the KV cache), what XLA plans
beside the chip's HBM, the step's bytes, FLOPs and kernel launches against the
chip's roofs (roofline/decode_cost.py, roofline/launch_bound.py), its
collectives inside and outside the decode loop, and every kernel a token
launches (roofline/compiled/launches.py).
"""

import dataclasses

from roofline.compiled.launches import launch_text
from roofline.compiled.program import collectives_summary, matmul_dtypes_summary
from roofline.launch_bound import FUSED_KERNELS_PER_LAYER, estimated_kernels
from roofline.units import flop, gb, ms


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """One decode step of `batch` sequences compiled for a target, per device
    (s3_infer.py --target): what it holds, what XLA plans, and its roofline."""

    batch: int
    weight_bytes: int  # held, by the sharding rules, in the compute dtype
    cache_bytes: int  # held: this device's rows and heads of the KV cache
    argument_bytes: int  # XLA's plan: weights, cache, tokens, logits (with the chip's padding)
    temp_bytes: int
    memory_bytes: int  # arguments + outputs + temporaries - donated
    hbm_bytes: float
    step: object  # roofline.decode_cost.DecodeStep, per device
    comm_s: float | None  # the step's collectives over one direction of the links
    collectives: dict  # kind -> Collective, per step (inside the decode loop)
    per_call: dict  # kind -> Collective, once per call (outside the loop)
    kernels: dict  # custom call target -> count
    launches: object  # roofline.compiled.launches.Launches: every kernel a token launches
    launch: object  # roofline.launch_bound.LaunchBound: bytes, FLOPs, launches; which binds
    times: object  # roofline.plan.decode_estimate.DecodeTimes, with the kernels as compiled
    matmul_dtypes: dict
    xla_flops: float | None  # XLA's count of one step, per device
    xla_source: str
    compile_s: float

    @property
    def fits(self):
        return self.memory_bytes <= self.hbm_bytes

    @property
    def step_s(self):
        return max(self.launch.step_s, self.comm_s or 0.0)

    @property
    def bound(self):
        """Whichever takes longest: "bytes", "FLOPs", "launches" or "communication"."""
        return "communication" if (self.comm_s or 0.0) > self.launch.step_s else self.launch.bound

    @property
    def tokens_per_s(self):
        return self.batch / self.step_s

    @property
    def estimate_s(self):
        """The estimate (decode_estimate.py) with the bytes its collectives send; None: no fit."""
        if self.times.estimate_s is None:
            return None
        return self.times.estimate_s + (self.comm_s or 0.0)


# At one row per device the compilers turn each matrix-vector product into a
# multiply-and-reduce fusion (a TPU's in float32, whose conversions XLA's count charges too).
NO_DOTS = "none: matrix-vector products as multiply-and-reduce fusions"


def _collective_text(found):
    return ", ".join(f"{kind} x{c.count} {gb(c.output_bytes)}" for kind, c in found.items())


def decode_lines(plans, hbm_bytes):
    """DecodePlans as text: what each device holds, the roofline, what the compiler did."""
    header = (
        f"  {'batch':>6} {'weights':>9} {'KV cache':>9} {'XLA args':>9} {'temp':>8} "
        f"{'of ' + gb(hbm_bytes) + ' HBM':>16} | {'MB/step':>8} {'mem':>9} {'flop':>9} "
        f"{'comm':>9} {'launches':>9} {'floor':>9} {'tokens/s':>10}  {'bound':<13} "
        f"{'estimate':>9}  binds"
    )
    lines = [header]
    for p in plans:
        fit = f"{100 * p.memory_bytes / p.hbm_bytes:.0f}%" + ("" if p.fits else " NO FIT")
        comm = "?" if p.comm_s is None else ms(p.comm_s)
        launch = "-" if p.launch.launch_s is None else ms(p.launch.launch_s)
        estimate = "-" if p.estimate_s is None else ms(p.estimate_s)
        lines.append(
            f"  {p.batch:>6} {gb(p.weight_bytes):>9} {gb(p.cache_bytes):>9} "
            f"{gb(p.argument_bytes):>9} {gb(p.temp_bytes):>8} {fit:>16} | "
            f"{p.step.bytes / 1e6:>8,.1f} {ms(p.step.memory_s):>9} {ms(p.step.compute_s):>9} "
            f"{comm:>9} {launch:>9} {ms(p.step_s):>9} {p.tokens_per_s:>10,.0f}  {p.bound:<13} "
            f"{estimate:>9}  {p.times.estimate_bound or '-'}"
        )
    lines.append(
        "  per step and device, XLA's FLOPs against the napkin B·f / n, and what the compiler did:"
    )
    if plans:
        lines.append(f"  (XLA's count: {plans[0].xla_source})")
    for p in plans:
        flops = "XLA gives none"
        if p.xla_flops is not None:
            flops = (
                f"XLA {flop(p.xla_flops)} vs {flop(p.step.flops)} "
                f"({100 * (p.xla_flops / p.step.flops - 1):+.0f}%)"
            )
        dtypes = ", ".join(
            f"{a} x {b} -> {c} x{n}"
            for (a, b, c), n in sorted(p.matmul_dtypes.items(), key=lambda kv: -kv[1])
        )
        lines.append(
            f"  {p.batch:>6}: {flops} | collectives "
            f"{_collective_text(p.collectives) or 'none'} | matmuls "
            f"{dtypes or NO_DOTS} | kernels {launch_text(p.launches)}"
        )
    once = {kind for p in plans for kind in p.per_call}
    if once:
        lines.append(f"  outside the loop, once per call: {', '.join(sorted(once))}")
    return lines


def launch_lines(plans, layers, per_launch_s):
    """Where launches bind: what they cost against the bytes, and what a decode layer
    fused into FUSED_KERNELS_PER_LAYER kernels would launch instead."""
    bound = [p for p in plans if p.bound == "launches"]
    if not bound:
        return []
    p, fused = bound[0], estimated_kernels(layers, FUSED_KERNELS_PER_LAYER)
    fused_s = fused * per_launch_s
    then = "the bytes would bind" if fused_s <= p.step.memory_s else "still launch-bound"
    return [
        f"launch-bound at batch {', '.join(str(q.batch) for q in bound)}: batch {p.batch}'s "
        f"{p.launches.per_token} kernels x {per_launch_s * 1e6:.1f} us = {ms(p.launch.launch_s)}"
        f", its bytes {ms(p.step.memory_s)}; {FUSED_KERNELS_PER_LAYER} kernels a layer "
        f"({fused} a token) would take {ms(fused_s)}: {then} (predictions)"
    ]


# Fields whose JSON name (s3_infer.py --target ... --summary-out) says more
# than the short name the code reads.
SUMMARY_NAMES = {
    "weight_bytes": "weight_bytes_per_device",
    "cache_bytes": "cache_bytes_per_device",
    "argument_bytes": "argument_bytes_per_device",
    "temp_bytes": "temp_bytes_per_device",
    "memory_bytes": "memory_per_device_bytes",
    "hbm_bytes": "hbm_bytes_per_device",
    "comm_s": "communication_seconds",
    "xla_flops": "xla_flops_per_device",
    "xla_source": "xla_flops_source",
    "collectives": "collectives_per_step",
    "per_call": "collectives_per_call",
    "compile_s": "compile_seconds",
    "kernels": "custom_calls",
}


def decode_summary(p):
    """One DecodePlan as JSON-ready values (s3_infer.py --target ... --summary-out):
    its fields, the roofline's step (roofline.decode_cost.DecodeStep) spelled
    out, then what they imply."""
    fields = {
        k: v
        for k, v in dataclasses.asdict(p).items()
        if k not in ("step", "launches", "launch", "times")
    }
    fields["collectives"] = collectives_summary(p.collectives)
    fields["per_call"] = collectives_summary(p.per_call)
    fields["kernels"] = sorted(p.kernels)
    fields["kernels_per_token"] = p.launches.per_token
    fields["kernel_kinds"] = p.launches.kinds  # roofline.compiled.launches.KINDS says each
    fields["command_buffers_per_token"] = p.launches.command_buffers
    fields["kernels_outside_loop"] = p.launches.outside
    fields["matmul_dtypes"] = matmul_dtypes_summary(p.matmul_dtypes)
    return {
        **{SUMMARY_NAMES.get(k, k): v for k, v in fields.items()},
        "fits": p.fits,
        "bytes_per_step_per_device": p.step.bytes,
        "memory_seconds": p.step.memory_s,
        "compute_seconds": p.step.compute_s,
        "launch_seconds": p.launch.launch_s,
        "napkin_flops_per_device": p.step.flops,
        "predicted_step_seconds": p.step_s,
        "predicted_tokens_per_sec": p.tokens_per_s,
        "bound": p.bound,
        "floor_step_seconds": p.step_s,
        "floor_bound": p.bound,
        "estimate_step_seconds": p.estimate_s,
        "estimate_bound": p.times.estimate_bound,
        "achievable_bandwidth": p.times.achievable,
    }

"""Plan a training run on a chip you don't have: one compiled step, read and put
on the roofline (s2_train.py --target). Decode's plan: roofline/plan/decode.py.

From a step compiled for a target (roofline/plan/targets.py) and the config it was
built from, per device:

    memory      XLA's plan of the compiled step beside the chip's HBM: fits, or not
    FLOPs       XLA's count of the compiled step beside the exact count
    collectives what the partitioner inserted, and the bytes they send
    kernels     the custom kernels the compiler chose (cuDNN, Pallas)
    roofline    compute-, memory- and communication-bound step times; the step
                takes at least the largest (all three overlapped perfectly)
    per op      each op of the compiled step on its own roof, in the compiler's
                order (roofline/compiled/op_roofline.py): a tighter best case, and the
                ops that keep the step from the whole-step bound
"""

import dataclasses

from roofline.compiled.op_report import prediction_lines, prediction_summary
from roofline.compiled.program import collectives_summary, kernel_lines, matmul_dtypes_summary
from roofline.flops import attention_flops, train_bytes, train_flops
from roofline.predict import comm_time
from roofline.units import flop, gb, ms


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """One training step compiled for a target, per device."""

    target: str  # "tpu-v5e:2x4"
    devices: int
    mesh: dict  # axis -> size
    tokens: int  # per step
    exact_flops_per_device: float
    xla_flops_per_device: float | None  # XLA's count of the compiled step (None on NVIDIA)
    xla_source: str  # where that count comes from
    kernel_flops_per_device: float  # exact FLOPs inside custom kernels XLA cannot count
    memory_per_device_bytes: int
    hbm_bytes_per_device: float
    collectives: dict  # kind -> roofline.compiled.program.Collective
    kernels: dict  # custom call target -> count
    windowed_loops: int  # collective-matmul loops: XLA counts their bodies once
    matmul_dtypes: dict
    peak: float  # FLOP/s per device at the precision the matmuls run
    peak_note: str
    hbm_bandwidth: float
    interconnect: float | None  # bytes/s per chip, one direction
    compute_s: float
    memory_s: float
    comm_s: float | None
    per_op: object = (
        None  # roofline.compiled.op_roofline.OpPrediction of the compiled step, or None
    )

    @property
    def fits(self):
        return self.memory_per_device_bytes <= self.hbm_bytes_per_device

    @property
    def link_bytes(self):
        return sum(c.bytes for c in self.collectives.values())

    @property
    def step_s(self):
        return max(self.compute_s, self.memory_s, self.comm_s or 0.0)

    @property
    def bound(self):
        times = {
            "compute": self.compute_s,
            "memory": self.memory_s,
            "communication": self.comm_s or 0.0,
        }
        return max(times, key=times.get)

    @property
    def predicted_s(self):
        """The per-op prediction where there is one, else the whole-step bound."""
        return self.per_op.step_s if self.per_op else self.step_s

    @property
    def tokens_per_s(self):
        return self.tokens / self.predicted_s

    @property
    def mfu(self):
        """The best MFU this step can reach: compute time over predicted step time."""
        return self.compute_s / self.predicted_s


def training_plan(
    cfg,
    batch,
    target,
    facts,
    *,
    mesh,
    kernel_attention=False,
    xla_flops=None,
    xla_source="XLA's cost analysis of the compiled step",
    per_op=None,
):
    """The TrainingPlan of one training step of `batch` sequences compiled for `target`.

    facts: roofline.compiled.program.ProgramFacts of the compiled step. kernel_attention:
    attention runs inside a custom kernel (cuDNN, splash), whose FLOPs XLA's
    count cannot see. xla_flops (per device) overrides facts.xla_flops, e.g.
    with the count of the program before optimisation where the target's
    compiler gives none."""
    chip, n = target.chip, target.devices
    dtype = cfg.dtype
    peak = chip.peak(dtype, facts.matmul_precision)
    if dtype == "float32" and "tf32" in chip.flops and facts.matmul_precision == "default":
        peak_note = "float32 matmuls run as TF32 under JAX's default precision"
    elif dtype == "float32" and chip.platform == "tpu":
        peak_note = "float32 matmuls run as bf16 passes under JAX's default precision"
    else:
        peak_note = f"{dtype} matmuls"
    exact = train_flops(cfg, batch) / n
    link, comm_s = comm_time(facts.collectives, chip)
    if xla_flops is None:
        xla_flops = facts.xla_flops
    return TrainingPlan(
        target=target.name,
        devices=n,
        mesh=dict(mesh),
        tokens=batch * cfg.seq,
        exact_flops_per_device=exact,
        xla_flops_per_device=xla_flops,
        xla_source=xla_source,
        kernel_flops_per_device=3 * attention_flops(cfg, batch) / n if kernel_attention else 0,
        memory_per_device_bytes=facts.memory_bytes,
        hbm_bytes_per_device=target.hbm_per_device,
        collectives=facts.collectives,
        kernels=facts.kernels,
        windowed_loops=facts.windowed_loops,
        matmul_dtypes=facts.matmul_dtypes,
        peak=peak,
        peak_note=peak_note,
        hbm_bandwidth=chip.hbm_bandwidth * target.chips / n,
        interconnect=link,
        compute_s=exact / peak,
        memory_s=train_bytes(cfg, batch).total / n / (chip.hbm_bandwidth * target.chips / n),
        comm_s=comm_s,
        per_op=per_op,
    )


def plan_lines(p):
    """The plan as text, in the order a student reads it."""
    fit = "fits" if p.fits else "DOES NOT FIT"
    share = p.memory_per_device_bytes / p.hbm_bytes_per_device
    memory = f"{gb(p.memory_per_device_bytes)} of {gb(p.hbm_bytes_per_device)} HBM"
    lines = [f"memory per device: {memory} ({100 * share:.0f}%): {fit}"]
    exact = p.exact_flops_per_device
    if p.xla_flops_per_device is None:
        lines.append(f"FLOPs per device: exact {flop(exact)}; the target's compiler gives no count")
    else:
        xla = p.xla_flops_per_device
        lines.append(
            f"FLOPs per device: XLA {flop(xla)}, exact {flop(exact)}: "
            f"{100 * (xla / exact - 1):+.1f}%"
        )
        lines.append(f"  XLA's count: {p.xla_source}")
        if p.kernel_flops_per_device:
            seen = exact - p.kernel_flops_per_device
            lines.append(
                f"  attention runs inside a custom kernel XLA cannot count "
                f"({flop(p.kernel_flops_per_device)}): exact without it "
                f"{flop(seen)}, XLA {100 * (xla / seen - 1):+.1f}%"
            )
        if p.windowed_loops:
            lines.append(
                f"  {p.windowed_loops} collective matmuls (windowed einsums: loops that "
                "multiply while they pass shards around) are counted once a loop, not "
                "once a trip: XLA falls short (roofline/README.md)"
            )
    if p.collectives:
        lines.append("collectives per step, per device (link bytes: what a device sends, ring):")
        for kind, c in p.collectives.items():
            lines.append(
                f"  {kind:<19}x{c.count:<4} {gb(c.output_bytes):>10} results "
                f"{gb(c.bytes):>10} over the links"
            )
    else:
        lines.append("collectives: none (one device, or nothing to share)")
    kinds = kernel_lines(p.kernels)
    lines.append("custom kernels: " + ("; ".join(kinds) if kinds else "none (XLA's own fusions)"))
    dtypes = ", ".join(
        f"{lhs} x {rhs} -> {out}: {n}"
        for (lhs, rhs, out), n in sorted(p.matmul_dtypes.items(), key=lambda kv: -kv[1])
    )
    lines.append(f"matmuls (dot/convolution ops) by dtype: {dtypes or 'none visible'}")
    comm = (
        f"{ms(p.comm_s)} at {p.interconnect / 1e9:,.0f} GB/s a direction"
        if p.comm_s is not None and p.interconnect
        else "unknown (no interconnect figure)"
    )
    hidden = ""
    if p.comm_s:
        hidden = (
            " (hides behind compute, if overlapped)"
            if p.comm_s <= p.compute_s
            else " (longer than compute: it cannot hide)"
        )
    roof = f"{p.peak / 1e12:,.1f} TFLOP/s ({p.peak_note}), {p.hbm_bandwidth / 1e9:,.0f} GB/s HBM"
    best = (
        f"{ms(p.step_s)} a step ({p.bound}-bound), {p.tokens / p.step_s:,.0f} tokens/s, "
        f"MFU {100 * p.compute_s / p.step_s:.0f}%"
    )
    lines += [
        f"roofline per device: {roof}",
        f"  compute-bound  {ms(p.compute_s)}   exact FLOPs / peak",
        f"  memory-bound   {ms(p.memory_s)}   bytes lower bound / HBM bandwidth",
        f"  communication  {comm}{hidden}",
        f"  whole-step bound (best case): {best}",
    ]
    if p.per_op:
        lines += prediction_lines(p.per_op, p.tokens, p.exact_flops_per_device, p.step_s)
    return lines


# Fields whose JSON name (s2_train.py --target ... --summary-out, a documented
# interface) says more than the short name the code reads.
SUMMARY_NAMES = {
    "xla_source": "xla_flops_source",
    "windowed_loops": "windowed_einsum_loops",
    "peak": "peak_flops_per_device",
    "compute_s": "compute_seconds",
    "memory_s": "memory_seconds",
    "comm_s": "communication_seconds",
}


def plan_summary(p):
    """The plan as JSON-ready values (s2_train.py --target ... --summary-out):
    its fields, then what they imply (whether it fits, the best step)."""
    fields = {
        **{f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "per_op"},
        "kernels": sorted(p.kernels),
    }
    fields["collectives"] = collectives_summary(p.collectives)
    fields["matmul_dtypes"] = matmul_dtypes_summary(p.matmul_dtypes)
    return {
        **{SUMMARY_NAMES.get(k, k): v for k, v in fields.items()},
        "fits": p.fits,
        "bound_step_seconds": p.step_s,
        "predicted_step_seconds": p.predicted_s,
        "predicted_tokens_per_sec": p.tokens_per_s,
        "predicted_mfu": p.mfu,
        **(prediction_summary(p.per_op, p.exact_flops_per_device) if p.per_op else {}),
    }

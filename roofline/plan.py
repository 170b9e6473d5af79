"""Plan a run on a chip you don't have: one compiled step, read and put on the roofline.

From a step compiled for a target (roofline/targets.py) and the config it was
built from, per device:

    memory      XLA's plan of the compiled step beside the chip's HBM: fits, or not
    FLOPs       XLA's count of the compiled step beside the exact count
    collectives what the partitioner inserted, and the bytes they send
    kernels     the custom kernels the compiler chose (cuDNN, Pallas)
    roofline    compute-, memory- and communication-bound step times; the step
                takes at least the largest (all three overlapped perfectly)
"""

import dataclasses

from roofline.flops import attention_flops, train_bytes, train_flops
from roofline.program import kernel_lines


@dataclasses.dataclass(frozen=True)
class Plan:
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
    collectives: dict  # kind -> roofline.program.Collective
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
    def tokens_per_s(self):
        return self.tokens / self.step_s

    @property
    def mfu(self):
        """The best MFU this step can reach: compute time over step time."""
        return self.compute_s / self.step_s


def plan(
    cfg,
    batch,
    target,
    facts,
    *,
    mesh,
    kernel_attention=False,
    xla_flops=None,
    xla_source="XLA's cost analysis of the compiled step",
):
    """The Plan of one training step of `batch` sequences compiled for `target`.

    facts: roofline.program.ProgramFacts of the compiled step. kernel_attention:
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
    return Plan(
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
    )


def comm_time(collectives, chip):
    """(link bytes/s one direction, seconds to send the collectives' link bytes
    over it): None for the time where the chip has no interconnect figure and
    something must be sent."""
    link = chip.interconnect / 2 if chip.interconnect else None  # one direction of the link
    sent = sum(c.bytes for c in collectives.values())
    return link, sent / link if link else (None if sent else 0.0)


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
    step: object  # roofline.decode.DecodeStep, per device
    comm_s: float | None  # the step's collectives over one direction of the links
    collectives: dict  # kind -> Collective, per step (inside the decode loop)
    per_call: dict  # kind -> Collective, once per call (outside the loop)
    kernels: dict
    matmul_dtypes: dict
    xla_flops: float | None  # XLA's count of one step, per device
    xla_source: str
    compile_s: float

    @property
    def fits(self):
        return self.memory_bytes <= self.hbm_bytes

    @property
    def step_s(self):
        return max(self.step.step_s, self.comm_s or 0.0)

    @property
    def bound(self):
        return "communication" if (self.comm_s or 0.0) > self.step.step_s else self.step.bound

    @property
    def tokens_per_s(self):
        return self.batch / self.step_s


def _gb(x):
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.2f} MB"


def _ms(s):
    return f"{s * 1e3:,.2f} ms" if s >= 1e-4 else f"{s * 1e6:,.2f} us"


def _flops(x):
    return f"{x / 1e9:,.1f} GFLOP" if x >= 1e10 else f"{x / 1e6:,.1f} MFLOP"


def plan_lines(p):
    """The plan as text, in the order a student reads it."""
    fit = "fits" if p.fits else "DOES NOT FIT"
    share = p.memory_per_device_bytes / p.hbm_bytes_per_device
    memory = f"{_gb(p.memory_per_device_bytes)} of {_gb(p.hbm_bytes_per_device)} HBM"
    lines = [f"memory per device: {memory} ({100 * share:.0f}%): {fit}"]
    exact = p.exact_flops_per_device
    if p.xla_flops_per_device is None:
        lines.append(
            f"FLOPs per device: exact {_flops(exact)}; the target's compiler gives no count"
        )
    else:
        xla = p.xla_flops_per_device
        lines.append(
            f"FLOPs per device: XLA {_flops(xla)}, exact {_flops(exact)}: "
            f"{100 * (xla / exact - 1):+.1f}%"
        )
        lines.append(f"  XLA's count: {p.xla_source}")
        if p.kernel_flops_per_device:
            seen = exact - p.kernel_flops_per_device
            lines.append(
                f"  attention runs inside a custom kernel XLA cannot count "
                f"({_flops(p.kernel_flops_per_device)}): exact without it "
                f"{_flops(seen)}, XLA {100 * (xla / seen - 1):+.1f}%"
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
                f"  {kind:<19}x{c.count:<4} {_gb(c.output_bytes):>10} results "
                f"{_gb(c.bytes):>10} over the links"
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
        f"{_ms(p.comm_s)} at {p.interconnect / 1e9:,.0f} GB/s a direction"
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
        f"{_ms(p.step_s)} a step ({p.bound}-bound), {p.tokens_per_s:,.0f} tokens/s, "
        f"MFU {100 * p.mfu:.0f}%"
    )
    lines += [
        f"roofline per device: {roof}",
        f"  compute-bound  {_ms(p.compute_s)}   exact FLOPs / peak",
        f"  memory-bound   {_ms(p.memory_s)}   bytes lower bound / HBM bandwidth",
        f"  communication  {comm}{hidden}",
        f"  best case: {best}",
    ]
    return lines


def plan_summary(p):
    """The plan as JSON-ready values (s2_train.py --target ... --summary-out)."""
    return {
        "target": p.target,
        "devices": p.devices,
        "mesh": p.mesh,
        "exact_flops_per_device": p.exact_flops_per_device,
        "xla_flops_per_device": p.xla_flops_per_device,
        "xla_flops_source": p.xla_source,
        "kernel_flops_per_device": p.kernel_flops_per_device,
        "memory_per_device_bytes": p.memory_per_device_bytes,
        "hbm_bytes_per_device": p.hbm_bytes_per_device,
        "fits": p.fits,
        "collectives": {
            k: {"count": c.count, "bytes": c.bytes, "output_bytes": c.output_bytes}
            for k, c in p.collectives.items()
        },
        "kernels": sorted(p.kernels),
        "windowed_einsum_loops": p.windowed_loops,
        "matmul_dtypes": {f"{a},{b}->{c}": n for (a, b, c), n in p.matmul_dtypes.items()},
        "peak_flops_per_device": p.peak,
        "compute_seconds": p.compute_s,
        "memory_seconds": p.memory_s,
        "communication_seconds": p.comm_s,
        "predicted_step_seconds": p.step_s,
        "predicted_tokens_per_sec": p.tokens_per_s,
        "predicted_mfu": p.mfu,
    }


# At one row per device the compilers turn each matrix-vector product into a
# multiply-and-reduce fusion (a TPU's in float32, whose conversions XLA's count charges too).
NO_DOTS = "none: matrix-vector products as multiply-and-reduce fusions"


def _collective_text(found):
    return ", ".join(f"{kind} x{c.count} {_gb(c.output_bytes)}" for kind, c in found.items())


def decode_lines(plans, hbm_bytes):
    """DecodePlans as text: what each device holds, the roofline, what the compiler did."""
    header = (
        f"  {'batch':>6} {'weights':>9} {'KV cache':>9} {'XLA args':>9} {'temp':>8} "
        f"{'of ' + _gb(hbm_bytes) + ' HBM':>16} | {'MB/step':>8} {'mem':>9} {'flop':>9} "
        f"{'comm':>9} {'step':>9} {'tokens/s':>10}  bound"
    )
    lines = [header]
    for p in plans:
        fit = f"{100 * p.memory_bytes / p.hbm_bytes:.0f}%" + ("" if p.fits else " NO FIT")
        comm = "?" if p.comm_s is None else _ms(p.comm_s)
        lines.append(
            f"  {p.batch:>6} {_gb(p.weight_bytes):>9} {_gb(p.cache_bytes):>9} "
            f"{_gb(p.argument_bytes):>9} {_gb(p.temp_bytes):>8} {fit:>16} | "
            f"{p.step.bytes / 1e6:>8,.1f} {_ms(p.step.memory_s):>9} {_ms(p.step.compute_s):>9} "
            f"{comm:>9} {_ms(p.step_s):>9} {p.tokens_per_s:>10,.0f}  {p.bound}"
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
                f"XLA {_flops(p.xla_flops)} vs {_flops(p.step.flops)} "
                f"({100 * (p.xla_flops / p.step.flops - 1):+.0f}%)"
            )
        dtypes = ", ".join(
            f"{a} x {b} -> {c} x{n}"
            for (a, b, c), n in sorted(p.matmul_dtypes.items(), key=lambda kv: -kv[1])
        )
        kinds = kernel_lines(p.kernels)
        lines.append(
            f"  {p.batch:>6}: {flops} | collectives "
            f"{_collective_text(p.collectives) or 'none'} | matmuls "
            f"{dtypes or NO_DOTS} | kernels "
            f"{'; '.join(kinds) if kinds else 'none'}"
        )
    once = {kind for p in plans for kind in p.per_call}
    if once:
        lines.append(f"  outside the loop, once per call: {', '.join(sorted(once))}")
    return lines


def decode_summary(p):
    """One DecodePlan as JSON-ready values (s3_infer.py --target ... --summary-out)."""

    def found(collectives):
        return {
            k: {"count": c.count, "bytes": c.bytes, "output_bytes": c.output_bytes}
            for k, c in collectives.items()
        }

    return {
        "weight_bytes_per_device": p.weight_bytes,
        "cache_bytes_per_device": p.cache_bytes,
        "argument_bytes_per_device": p.argument_bytes,
        "temp_bytes_per_device": p.temp_bytes,
        "memory_per_device_bytes": p.memory_bytes,
        "hbm_bytes_per_device": p.hbm_bytes,
        "fits": p.fits,
        "bytes_per_step_per_device": p.step.bytes,
        "memory_seconds": p.step.memory_s,
        "compute_seconds": p.step.compute_s,
        "communication_seconds": p.comm_s,
        "predicted_step_seconds": p.step_s,
        "predicted_tokens_per_sec": p.tokens_per_s,
        "bound": p.bound,
        "xla_flops_per_device": p.xla_flops,
        "napkin_flops_per_device": p.step.flops,
        "xla_flops_source": p.xla_source,
        "collectives_per_step": found(p.collectives),
        "collectives_per_call": found(p.per_call),
        "kernels": sorted(p.kernels),
        "matmul_dtypes": {f"{a},{b}->{c}": n for (a, b, c), n in p.matmul_dtypes.items()},
        "compile_seconds": p.compile_s,
    }

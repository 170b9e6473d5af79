"""Compare: three columns for the same training step.

    napkin     6·B·P, then the exact count with attention, and the bytes the
               step must move at least (roofline/flops.py), on the chip's roof
    XLA        what the compiler says the compiled step does:
               `compiled.cost_analysis()` flops and "bytes accessed"
    measured   the step time from a profiler trace (captured by roofline/measured/profile.py,
               read by roofline/measured/trace.py on any chip), the FLOP/s and MFU that
               implies, and where the time went

The napkin column gives lower bounds on the step time (the roofline:
roofline/predict.py); XLA's column an estimate, as if no byte it counts
stayed in a cache; the measured column says how far above them the step
really ran, and why. The table is written by roofline/measured/table.py, the chart
drawn by roofline/measured/chart.py.
"""

import dataclasses

import jax

from roofline import calibrate
from roofline.chip import chip_roofs
from roofline.compiled.op_roofline import predict_ops
from roofline.compiled.op_work import matmul_shapes
from roofline.compiled.program import cost_analysis
from roofline.flops import ledger, train_bytes
from roofline.hardware import local_roofs
from roofline.measured.record import chip_record, save_hlo, save_metadata
from roofline.measured.table import report_lines
from roofline.measured.trace import read_trace
from roofline.predict import predict, utilisation


def xla_cost(compiled_or_cost, devices=None):
    """(FLOPs, bytes accessed) of a whole step from XLA's cost analysis, or None
    where there is none.

    Takes a `jax.stages.Compiled` or what its `cost_analysis()` returned
    (roofline.compiled.program.cost_analysis unwraps either). A program partitioned over
    several devices (SPMD) reports the work of one device, so it is multiplied
    by the device count (read from the compiled program's input shardings, or
    given as `devices`)."""
    if devices is None and hasattr(compiled_or_cost, "input_shardings"):
        shardings = jax.tree.leaves(compiled_or_cost.input_shardings)
        devices = max((len(s.device_set) for s in shardings), default=1)
    cost = cost_analysis(compiled_or_cost)
    if cost is None:
        return None
    devices = devices or 1
    return devices * float(cost["flops"]), devices * float(cost.get("bytes accessed", 0.0))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Every number of the table. Step FLOPs and bytes are for the whole step
    (all devices); peaks and bandwidths per device."""

    cfg: object  # the ModelConfig
    batch: int  # sequences per step
    devices: int
    ledger: object  # roofline.flops.Ledger
    bytes_bound: int  # roofline.flops.train_bytes(...).total
    roof_name: str  # which roof the predictions stand on
    peak: float  # FLOP/s per device of that roof
    bandwidth: float  # bytes/s per device of that roof
    napkin: object  # StepPrediction from the exact count and the bytes bound
    xla: object = None  # StepPrediction from XLA's counts, or None
    xla_flops: float | None = None
    xla_bytes: float | None = None
    trace: object = None  # roofline.measured.trace.TraceProfile, or None
    use: object = None  # roofline.predict.Utilisation of the traced step, or None
    roofs: object = None  # roofline.chip.Roofs the step was held against, whole
    log_peak: tuple | None = None  # (FLOP/s per device, source) the training log used
    ops: object = None  # roofline.compiled.op_roofline.OpPrediction of the compiled step, or None
    best_ops: object = None  # the same on the ceilings alone, where ops used measured rates


def compare(cfg, batch, roofs, *, devices=1, cost=None, trace=None, hlo_text=None, log_peak=None):
    """The three columns for one training step of `batch` sequences, per device
    on `roofs` (a roofline.chip.Roofs).

    The predictions stand on the datasheet's roof when roofs has one, else on
    the measured one (a CPU), which roofs.name says whose it is. cost: (FLOPs,
    bytes) from `xla_cost`, or None. trace: a TraceProfile, or None. hlo_text:
    the compiled step's HLO, for the per-op prediction (on the same roofs), or
    None. log_peak: (FLOP/s, source) the training log's MFU divided by."""
    g = ledger(cfg, batch)
    bytes_bound = train_bytes(cfg, batch).total
    datasheet = roofs.datasheet
    if datasheet is not None:
        roof_name = f"{datasheet.name} datasheet, {cfg.dtype}"
        peak, bandwidth = datasheet.peak(cfg.dtype), datasheet.hbm_bandwidth
    else:
        roof_name, peak, bandwidth = roofs.name, roofs.peak_flops, roofs.bandwidth

    def bound(flops, bytes_moved):
        return predict(
            flops, bytes_moved, peak_flops=peak, bandwidth=bandwidth, tokens=g.tokens, chips=devices
        )

    xla = bound(*cost) if cost and cost[1] > 0 else None
    use = None
    if trace is not None:
        use = utilisation(
            g.exact,
            trace.step_s,
            chips=devices,
            measured_peak=roofs.peak_flops if roofs.measured else None,
            datasheet_peak=datasheet.peak(cfg.dtype) if datasheet else None,
        )
    ops = best_ops = None
    if hlo_text:  # on the same roofs as the napkin's: a datasheet, else measured
        if datasheet is not None:
            best_ops = ops = predict_ops(hlo_text, chip_roofs(datasheet, cfg.dtype), devices)
        else:
            # The best case: the ceilings alone, a CPU's cache among them. The prediction:
            # where matmul rates were measured by shape (a CPU), at those rates instead.
            best = dataclasses.replace(roofs, matmul_rates=None)
            best_ops = ops = predict_ops(hlo_text, best, devices)
            if roofs.matmul_rates:
                ops = predict_ops(hlo_text, dataclasses.replace(roofs, cache=None), devices)
    return Comparison(
        cfg=cfg,
        batch=batch,
        devices=devices,
        ledger=g,
        bytes_bound=bytes_bound,
        roof_name=roof_name,
        peak=peak,
        bandwidth=bandwidth,
        napkin=bound(g.exact, bytes_bound),
        xla=xla,
        xla_flops=cost[0] if cost else None,
        xla_bytes=cost[1] if cost else None,
        trace=trace,
        use=use,
        roofs=roofs,
        log_peak=log_peak,
        ops=ops,
        best_ops=best_ops if best_ops is not ops else None,
    )


def local_comparison(cfg, batch, compiled=None, peak=None, *, devices=None, logdir=None):
    """The Comparison of a training step run on this machine, on its roofs.

    compiled: the compiled step (`jax.jit(step).lower(...).compile()`), or its
    `cost_analysis()` (per device of a program partitioned over `devices`), or
    (FLOPs, bytes) of the whole step, for the XLA column; None leaves it empty.
    A compiled step also gives the per-op prediction. peak: the (FLOP/s per
    device, source) pair the training log computed its MFU with
    (roofline.hardware.local_peak_flops). logdir: where a run was traced; its
    trace fills the measured column, and LOGDIR/roofline.json (roofline/measured/record.py:
    the chip this runs on and the roofs measured on it) and the compiled step's
    HLO (step.hlo.txt) are written beside it, so `python -m roofline compare
    LOGDIR` can redo the table on any machine. Without logdir (scripts/bench.py),
    no trace and nothing written."""
    devices = devices or jax.device_count()
    if compiled is None or isinstance(compiled, tuple):
        cost = compiled
    else:  # a compiled step knows its device count; its cost analysis alone does not
        cost = xla_cost(compiled, None if hasattr(compiled, "input_shardings") else devices)
    roofs = local_roofs(cfg.dtype, measured=True, devices=devices)
    hlo_text = compiled.as_text() if hasattr(compiled, "as_text") else None
    if hlo_text and roofs.datasheet is None:  # a CPU: time each matmul shape of the step
        measured = calibrate.matmul_rates(matmul_shapes(hlo_text))
        rates = {shape: flops / roofs.share for shape, flops in measured.items()}
        roofs = dataclasses.replace(roofs, matmul_rates=rates)
    trace = None
    if logdir is not None:
        save_metadata(logdir, cfg, batch, cost, devices, chip_record(cfg.dtype, devices, roofs))
        if hlo_text:
            save_hlo(logdir, hlo_text)
        trace = read_trace(logdir, hlo_text=hlo_text)
    return compare(
        cfg, batch, roofs, devices=devices, cost=cost, trace=trace, hlo_text=hlo_text, log_peak=peak
    )


def profile_table(logdir, cfg, batch, compiled=None, peak=None, *, devices=None, chart=True):
    """The table for a training run traced into logdir, as lines to print; what
    `s2_train.py --profile DIR` prints at the end. Arguments as for
    `local_comparison`; also writes LOGDIR/roofline.png (the chart)."""
    c = local_comparison(cfg, batch, compiled, peak, devices=devices, logdir=logdir)
    return report_lines(c, logdir, chart)

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
from roofline.compiled.op_work import matmul_shapes
from roofline.compiled.program import cost_analysis
from roofline.flops import ledger, train_bytes
from roofline.hardware import local_roofs
from roofline.measured.op_table import predict_step
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
    datasheet_name: str | None = None
    measured_peak: float | None = None  # the measured ceiling, FLOP/s per device
    measured_bandwidth: float | None = None
    log_peak: tuple | None = None  # (FLOP/s per device, source) the training log used
    measured_name: str = "measured on this machine"  # whose the measured roof is
    ops: object = None  # roofline.compiled.op_roofline.OpPrediction of the compiled step, or None
    best_ops: object = None  # the same on the ceilings alone, where ops used measured rates


def compare(
    cfg,
    batch,
    *,
    cost=None,
    trace=None,
    devices=1,
    datasheet=None,
    measured_peak=None,
    measured_bandwidth=None,
    log_peak=None,
    measured_name="measured on this machine",
    hlo_text=None,
    measured_cache=None,
    measured_matmul_rates=None,
):
    """The three columns for one training step of `batch` sequences.

    cost: (FLOPs, bytes) from `xla_cost`, or None. trace: a TraceProfile, or
    None. The predictions stand on the datasheet's roof when there is one,
    else on the measured one (a CPU), which measured_name says whose it is.
    hlo_text: the compiled step's HLO, for the per-op prediction (on the same
    roofs: roofline/measured/op_table.py), or None."""
    g = ledger(cfg, batch)
    bytes_bound = train_bytes(cfg, batch).total
    if datasheet is not None:
        roof_name = f"{datasheet.name} datasheet, {cfg.dtype}"
        peak, bandwidth = datasheet.peak(cfg.dtype), datasheet.hbm_bandwidth
    else:
        roof_name = measured_name
        peak, bandwidth = measured_peak, measured_bandwidth

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
            measured_peak=measured_peak,
            datasheet_peak=datasheet.peak(cfg.dtype) if datasheet else None,
        )
    ops = best_ops = None
    if hlo_text:  # on the same roofs as the napkin's: a datasheet, else measured
        roofs = {"peak": measured_peak, "bandwidth": measured_bandwidth, "name": measured_name}
        # The best case: the ceilings alone, a CPU's cache among them. The prediction:
        # where matmul rates were measured by shape (a CPU), at those rates instead.
        best_ops = predict_step(
            hlo_text, cfg.dtype, devices, datasheet=datasheet, cache=measured_cache, **roofs
        )
        ops = best_ops
        if datasheet is None and measured_matmul_rates:
            ops = predict_step(
                hlo_text, cfg.dtype, devices, matmul_rates=measured_matmul_rates, **roofs
            )
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
        datasheet_name=datasheet.name if datasheet else None,
        measured_peak=measured_peak,
        measured_bandwidth=measured_bandwidth,
        log_peak=log_peak,
        measured_name=measured_name,
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
    rates = None
    if hlo_text and roofs.datasheet is None:  # a CPU: time each matmul shape of the step
        measured = calibrate.matmul_rates(matmul_shapes(hlo_text))
        rates = {shape: flops / roofs.share for shape, flops in measured.items()}
    trace = None
    if logdir is not None:
        record = chip_record(
            cfg.dtype, devices, roofs.peak_flops, roofs.bandwidth, roofs.cache, rates
        )
        save_metadata(logdir, cfg, batch, cost, devices, record)
        if hlo_text:
            save_hlo(logdir, hlo_text)
        trace = read_trace(logdir, hlo_text=hlo_text)
    return compare(
        cfg,
        batch,
        cost=cost,
        trace=trace,
        devices=devices,
        datasheet=roofs.datasheet,
        measured_peak=roofs.peak_flops,
        measured_bandwidth=roofs.bandwidth,
        log_peak=peak,
        hlo_text=hlo_text,
        measured_cache=roofs.cache,
        measured_matmul_rates=rates,
    )


def profile_table(logdir, cfg, batch, compiled=None, peak=None, *, devices=None, chart=True):
    """The table for a training run traced into logdir, as lines to print; what
    `s2_train.py --profile DIR` prints at the end. Arguments as for
    `local_comparison`; also writes LOGDIR/roofline.png (the chart)."""
    c = local_comparison(cfg, batch, compiled, peak, devices=devices, logdir=logdir)
    return report_lines(c, logdir, chart)

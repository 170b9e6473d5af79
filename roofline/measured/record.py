"""What ran, and on which chip: roofline.json, written beside a trace.

`python -m roofline compare DIR` redoes the roofline table from a trace
directory, perhaps on another machine than the one that captured it (a TPU
VM's trace, copied to a laptop). Its roofs must be those of the chip the
trace ran on, not the reader's, so the record names that chip:

    "chip": {"platform": "tpu", "device_kind": "TPU v5 lite", "devices": 8,
             "dtype": "bfloat16", "datasheet": "tpu-v5e", "host": "t1v-n-0",
             "measured_peak": 1.8e14, "measured_bandwidth": 7.9e11}

An accelerator's trace is held against its datasheet, looked up again from
device_kind (roofline.hardware.chip_for_kind, so a corrected table applies
to old traces; the recorded name if the lookup fails), and against the
ceilings measured on it when it was captured (per device, FLOP/s and bytes/s).
A CPU has no datasheet: its roof is what was measured on the capture machine,
recorded here. A record without a chip (written before this one) falls back
to this machine's measurement, and says so.
"""

import dataclasses
import json
import os
import socket
import types

import jax

from roofline.chip import Roofs, chip_roofs
from roofline.hardware import chip_for_kind, datasheet_chip, find_chip, local_roofs
from roofline.measured.op_table import op_summary

METADATA = "roofline.json"
# The compiled step's HLO (compiled.as_text()), so the per-op prediction
# (roofline/compiled/op_roofline.py) can be redone from the directory alone.
HLO = "step.hlo.txt"


def chip_record(dtype, devices, roofs):
    """The chip this process runs on, as roofline.json records it: jax's names for
    it, the datasheet entry if the chip table knows it, and the roofs measured on
    it (a roofline.chip.Roofs of local_roofs(measured=True), per device)."""
    device = jax.local_devices()[0]
    chip = datasheet_chip(device)
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": devices,
        "dtype": dtype,
        "datasheet": chip.name if chip else None,
        "host": socket.gethostname(),
        "measured_peak": roofs.peak_flops,
        "measured_bandwidth": roofs.bandwidth,
        "measured_cache": list(roofs.cache) if roofs.cache else None,
        # {"batch,M,N,K,dtype": FLOP/s}: each matmul shape of the step, timed (a CPU)
        "matmul_rates": {",".join(map(str, s)): r for s, r in (roofs.matmul_rates or {}).items()},
    }


@dataclasses.dataclass(frozen=True)
class Saved:
    """A roofline.json, read back."""

    cfg: object  # the model's config, built by load_metadata's `model`
    batch: int
    cost: tuple | None  # (FLOPs, bytes) of the whole step from XLA's count, or None
    devices: int
    chip: dict | None  # chip_record(...) of the capture machine, or None


def save_metadata(logdir, cfg, batch, cost, devices, chip=None):
    """What ran, beside the trace, so `python -m roofline compare LOGDIR` can redo the table."""
    record = {
        "model": dataclasses.asdict(cfg),
        "batch": batch,
        "devices": devices,
        "xla_flops": cost[0] if cost else None,
        "xla_bytes": cost[1] if cost else None,
        "chip": chip,
    }
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, METADATA), "w") as f:
        json.dump(record, f, indent=1)


def save_hlo(logdir, hlo_text):
    """The compiled step's HLO text, beside roofline.json."""
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, HLO), "w") as f:
        f.write(hlo_text)


def load_hlo(logdir):
    """The HLO text save_hlo wrote, or None if the directory has none."""
    path = os.path.join(logdir, HLO)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def load_metadata(logdir, model=types.SimpleNamespace):
    """The Saved record `save_metadata` wrote, or None if the directory has none.

    model(**fields) builds the model's config from the recorded fields: the
    entry point passes sessions' ModelConfig; by default a namespace, whose
    fields read as attributes (cfg.seq) all the same."""
    path = os.path.join(logdir, METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    cost = (record["xla_flops"], record["xla_bytes"]) if record.get("xla_flops") else None
    return Saved(
        model(**record["model"]),
        record["batch"],
        cost,
        record.get("devices", 1),
        record.get("chip"),
    )


def roofs_for(chip, dtype, devices, trace_platform=None):
    """The roofline.chip.Roofs a trace captured on `chip` (a chip_record, or None)
    is held against, per device: the measured figures recorded with it, the
    chip table's entry beside them.

    This machine's measured roofs (roofline.hardware.local_roofs) stand in only
    where the record has no measured figures of its own."""

    def here(name):
        roofs = local_roofs(dtype, measured=True, devices=devices)
        return dataclasses.replace(
            roofs, name=name, peak_source=name, bandwidth_source=name, datasheet=None
        )

    if chip is None:
        ran_on = (
            f"; the trace ran on a {trace_platform}" if trace_platform not in (None, "cpu") else ""
        )
        return here(
            "measured on this machine (roofline.json does not "
            f"say which chip captured the trace{ran_on})"
        )
    datasheet = None
    if chip["platform"] != "cpu":
        datasheet = chip_for_kind(chip["device_kind"])
        if datasheet is None and chip.get("datasheet"):
            try:
                datasheet = find_chip(chip["datasheet"].split("/")[0])
            except KeyError:
                datasheet = None
        # Per jax device, as the trace's devices are (a TPU v3 chip is two of them).
        datasheet = datasheet.per_device() if datasheet else None
    if chip.get("measured_peak"):
        host = chip.get("host") or "the machine that captured the trace"
        where = "this machine" if host == socket.gethostname() else host
        name = f"measured on {where} ({chip['platform']}: {chip['device_kind']})"
        rates = {
            (*map(int, key.split(",")[:4]), key.split(",")[4]): flops
            for key, flops in (chip.get("matmul_rates") or {}).items()
        }
        return Roofs(
            name,
            chip["measured_peak"],
            name,
            chip.get("measured_bandwidth"),
            name,
            measured=True,
            datasheet=datasheet,
            cache=tuple(chip["measured_cache"]) if chip.get("measured_cache") else None,
            matmul_rates=rates,
        )
    if datasheet is not None:
        return chip_roofs(datasheet, dtype)
    return here(
        f"measured on this machine, not on the {chip['platform']} "
        f"({chip['device_kind']}) that captured the trace"
    )


def comparison_summary(c):
    """A roofline.measured.compare.Comparison as JSON-ready numbers (`compare DIR
    --summary-out`): the measured step beside the napkin's bound and XLA's
    estimate, seconds per step; MFU against each roof there is; the per-op
    prediction, by kind and its top ops beside their measured time (None
    where the directory has no HLO: roofline/measured/op_table.py)."""
    t, u = c.trace, c.use
    return {
        **op_summary(c),
        "measured_step_seconds": t.step_s if t else None,
        "bound_step_seconds": c.napkin.step_s,
        "bound": c.napkin.bound,
        "xla_step_seconds": c.xla.step_s if c.xla else None,
        "measured_seconds_by_kind": t.kind_seconds() if t else None,
        "mfu_datasheet": u.mfu_datasheet if u else None,
        "mfu_measured_roof": u.mfu_measured if u else None,
        "model_flops_per_step": c.ledger.exact,
        "devices": c.devices,
        "roof": c.roof_name,
    }

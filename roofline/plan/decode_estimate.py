"""A decode step's floor and its estimate, with Little's law between them.

    floor      = max(bytes / bandwidth, FLOPs / peak, kernels x launch)      no step is faster
    estimate   = bytes / achievable + kernels x launch + all-reduces x (latency + bytes / link)
    achievable = min(bandwidth, bytes in flight / latency)                    Little's law

The floor (roofline/launch_bound.py) lets the largest of three times hide the other
two. On a GPU they do not hide each other: no weight moves while a kernel is launched
or drains, so a kernel's launch and its bytes add. And bytes stream at the bandwidth
only if enough are on their way: a read returns a memory latency after it is issued,
so streaming at `bandwidth` takes bandwidth x latency bytes in flight at every moment
(Little's law: what is inside = throughput x time inside). On an H100, 3.35 TB/s x
0.7 us = 2.3 MB. A kernel that keeps less in flight streams at in_flight / latency.

How many bytes a kernel keeps in flight:
  ours   read off its grid and rings (blocks x slots in flight x a slot's bytes), the
         kernels' own bytes_in_flight; the caller passes it in.
  XLA's  not in the program we read: XLA picks each fusion's threads and unrolling as
         it emits it. So it is fitted, with the launch cost, on the H100's measured
         decode rows (H100_ROWS): the two numbers that best explain all eight (least
         squares on estimate / measured - 1). XLA's fusions stream at 76% of the roof, as if
         1.8 MB were in flight (76% of the Little's-law need); a launch costs 1.67 us.
         Both are fitted, not measured; other NVIDIA GPUs carry them over, as a launch
         cost and as a fraction of their own bandwidth.

The floor's launch is launch_bound's 1.5 us, the least a measured step gives a kernel,
so the floor stays under every row; the estimate's 1.67 us is a kernel's whole share of
the time its bytes do not explain. A TPU or a CPU has no launch to fit, and no row to
fit XLA's bandwidth on: no estimate there (None), only the floor.

On several chips, tensor parallelism's all-reduces (2 a layer) add a latency each, NCCL's
own model of a ring in its low-latency protocol over NVLink: 6.6 us + 2(n-1) x 0.6 us
(baseLatencies and hwLatencies, NVIDIA/nccl src/graph/tuning.cc), and their bytes over
one direction of a link, 2(n-1)/n of the message (a ring's traffic).
"""

from math import inf
from typing import NamedTuple

from roofline.launch_bound import launch_bound, launch_cost

# HBM's latency under load on an H100: an assumption, not measured here. Unloaded, a
# dependent read takes about 600 cycles (0.3 us at 1.98 GHz); streaming, reads queue at
# the memory controllers and take about twice that. 0.7 us is the figure the course's
# review of the decode kernels used; the estimate of XLA's step does not depend on it
# (its bandwidth is fitted), ours does (bytes in flight / latency).
HBM_LATENCY_S = 0.7e-6
HBM_LATENCY_SOURCE = "assumed: HBM's latency under load, about twice an unloaded read's 0.3 us"

# NCCL's ring all-reduce, LL protocol, over NVLink (src/graph/tuning.cc, commit 5067397):
# a base latency and one per step; a ring all-reduce takes 2(n-1) steps.
NCCL_BASE_S, NCCL_STEP_S = 6.6e-6, 0.6e-6


class MeasuredDecode(NamedTuple):
    """One decode step measured on an H100 SXM (JAX 0.11.2): its bytes (decode_cost's
    count), the kernels its step launches (compiled for h100:1, JAX 0.10.2:
    python sessions/s3_infer.py --target h100:1), the seconds a step took."""

    model: str
    batch: int
    bytes: int
    kernels: int
    seconds: float
    source: str


_COURSE = "docs/h100-run/accelerator-check/s3.json"
_GPT2, _BIG = "docs/h100-run/s3_gpt2_bf16_random.log", "docs/h100-run/s3_1.2B_bf16_random.log"
# The logs give tokens/s to 4 digits; a step is batch / tokens/s.
H100_ROWS = (
    MeasuredDecode("course", 1, 26_486_784, 60, 90.774e-6, _COURSE),
    MeasuredDecode("course", 4, 29_632_512, 73, 132.167e-6, _COURSE),
    MeasuredDecode("course", 16, 42_215_424, 72, 158.339e-6, _COURSE),
    MeasuredDecode("course", 64, 92_547_072, 84, 206.682e-6, _COURSE),
    MeasuredDecode("gpt2-bytes (V=256)", 1, 208_051_200, 163, 1 / 2_596, _GPT2),
    MeasuredDecode("gpt2-bytes (V=256)", 8, 472_292_352, 226, 8 / 13_990, _GPT2),
    MeasuredDecode("1.2B", 1, 2_618_499_072, 343, 1 / 618, _BIG),
    MeasuredDecode("1.2B", 8, 4_027_785_216, 475, 8 / 3_594, _BIG),
)
H100_BANDWIDTH = 3350e9  # the datasheet's, as the rows' MBU was read against


def fit(rows, bandwidth):
    """(seconds a launch, the fraction of `bandwidth` XLA's fusions stream at) that make
    rows' estimates bytes / (fraction x bandwidth) + kernels x launch closest to their
    measured seconds: least squares on estimate / measured - 1, in x = 1 / fraction and
    the launch, two unknowns, so two normal equations (Cramer's rule)."""
    a = [r.bytes / bandwidth / r.seconds for r in rows]  # the bytes' share at the full roof
    k = [r.kernels / r.seconds for r in rows]
    aa, ak, kk = sum(x * x for x in a), sum(x * y for x, y in zip(a, k)), sum(y * y for y in k)
    det = aa * kk - ak * ak
    x = (sum(a) * kk - sum(k) * ak) / det
    launch = (aa * sum(k) - ak * sum(a)) / det
    return launch, 1 / x


LAUNCH_S, XLA_FRACTION = fit(H100_ROWS, H100_BANDWIDTH)
FIT_SOURCE = (
    f"fitted on {len(H100_ROWS)} decode steps measured on an H100 SXM (the course preset, "
    f"GPT-2's shapes and a 1.2B at batches 1-64): a launch {LAUNCH_S * 1e6:.2f} us, XLA's "
    f"fusions at {XLA_FRACTION:.0%} of the bandwidth"
)


def littles_law_bytes(bandwidth, latency=HBM_LATENCY_S):
    """The bytes that must be in flight to stream at `bandwidth`: bandwidth x latency."""
    return bandwidth * latency


def achievable_bandwidth(bandwidth, in_flight, latency=HBM_LATENCY_S):
    """What a kernel keeping `in_flight` bytes on their way streams at: the bandwidth,
    or less where in_flight / latency is less."""
    return min(bandwidth, in_flight / latency)


def all_reduce_seconds(chips, message_bytes, link_bandwidth):
    """One all-reduce of `message_bytes` over `chips` in a ring: NCCL's latency model
    plus a ring's traffic, 2(n-1)/n of the message, over one direction of a link."""
    if chips <= 1:
        return 0.0
    steps = 2 * (chips - 1)
    return NCCL_BASE_S + steps * NCCL_STEP_S + steps / chips * message_bytes / link_bandwidth


class DecodeTimes(NamedTuple):
    """A decode step's floor and estimate (seconds), and what binds each."""

    floor: object  # roofline.launch_bound.LaunchBound: bytes, FLOPs, launches; the largest
    estimate_s: float | None  # the sum; None where nothing is fitted for the chip
    estimate_bound: str | None  # its largest term: "bytes", "launches" or "all-reduces"
    bytes_s: float | None  # the estimate's terms
    launch_s: float | None
    all_reduce_s: float | None
    achievable: float | None  # bytes/s the estimate streams at on each chip, on the whole

    @property
    def floor_s(self):
        return self.floor.step_s  # no step is faster

    @property
    def floor_bound(self):
        return self.floor.bound  # "bytes", "FLOPs" or "launches"


def decode_times(step, kernels, chip, *, streams=None, all_reduces=0, message_bytes=0, chips=1):
    """The floor and the estimate of one decode step: `step` a decode_cost.DecodeStep
    (its memory_s already over `chips`), `kernels` a token, on `chip`s of the table.
    streams: the step's bytes on a chip by what moves them, [(bytes, bytes in flight)],
    None in flight for XLA's fusions (the fit); None: all of them XLA's.
    all_reduces of `message_bytes` each, over the chips (tensor parallelism)."""
    floor = launch_bound(step, kernels, launch_cost(chip).seconds)
    if chip.platform != "gpu" or kernels is None:
        return DecodeTimes(floor, None, None, None, None, None, None)
    bandwidth = chip.hbm_bandwidth
    moved = step.memory_s * bandwidth  # bytes on each chip
    bytes_s = 0.0
    for nbytes, in_flight in streams or [(moved, None)]:
        if in_flight is None:
            achievable = XLA_FRACTION * bandwidth
        else:
            achievable = achievable_bandwidth(bandwidth, in_flight)
        bytes_s += nbytes / achievable
    terms = {
        "bytes": bytes_s,
        "launches": kernels * LAUNCH_S,
        "all-reduces": all_reduces * all_reduce_seconds(chips, message_bytes, chip.link or inf),
    }
    binds = max(terms, key=terms.get)
    return DecodeTimes(floor, sum(terms.values()), binds, *terms.values(), moved / bytes_s)

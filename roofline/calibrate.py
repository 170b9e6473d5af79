"""Measure the local device's ceilings: matmul FLOP/s and copy bandwidth.

On a CPU this is the only honest peak: the right figure depends on the core
count you were given, the vector width and the clock under load. The result
is cached on disk, keyed by the device, so it is measured once per machine.
Run `python -m roofline calibrate` to (re)measure.
"""

import contextlib
import functools
import glob
import json
import os
import platform

try:
    import fcntl
except ImportError:  # Windows: no lock, one process at a time is up to you
    fcntl = None

import jax
import jax.numpy as jnp

from roofline.memory import outside_the_step
from roofline.timing import time_calls

CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
    "hpllm-jax",
    "calibration.json",
)


def device_key(dtype):
    d = jax.local_devices()[0]
    cpu = platform.processor() or platform.machine()
    cores = os.cpu_count() if d.platform == "cpu" else ""
    return f"{d.platform}|{d.device_kind}|{cpu}|{cores}|{dtype}"


def best_time(fn, *args, repeats=5):
    """Fastest of `repeats` runs, after one warm-up run that compiles: the
    ceiling is what the device can do when nothing gets in its way."""
    return time_calls(lambda: fn(*args), repeats=repeats).best


def measure(dtype="float32", n=None):
    """{'matmul_flops': FLOP/s of an n x n matmul, 'copy_bandwidth': bytes/s of a
    read+write of a large array}, on the first local device, with everything in
    the whole host's threads (a CPU device uses every core).

    An accelerator is measured where the chip table lacks it, or beside its
    datasheet, often in the process that then trains: 8192 x 8192 operands (128
    or 256 MiB; 1.1 TFLOP a product, 1.6 ms at 700 TFLOP/s) and a 256 MiB array
    to copy, five times an H100's L2 (50 MiB: roofline/plan/targets.py
    GPU_SPECS). Each product is timed from the host, so it must outlast the call's
    own cost: one of 4096 (137 GFLOP) read 416 TFLOP/s on an H100 whose GPT-2 step
    then ran at 427 (docs/results.md, the second H100 run). What it leaves in the
    allocator's lifetime peak is recorded (roofline/memory.py)."""
    device = jax.local_devices()[0]
    n = n or (2048 if device.platform == "cpu" else 8192)
    # 64 MiB (CPU) or 256 MiB of float32: past the last-level cache, so DRAM or HBM answers.
    size = 2**24 if device.platform == "cpu" else 2**26
    with outside_the_step(device):
        a = jax.device_put(jnp.ones((n, n), dtype), device)
        matmul = jax.jit(lambda x, y: x @ y)
        flops = 2 * n**3 / best_time(matmul, a, a)
        x = jax.device_put(jnp.ones((size,), jnp.float32), device)
        copy = jax.jit(lambda v: v + 1)
        bandwidth = 2 * x.nbytes / best_time(copy, x)  # one read and one write per element
    return {"matmul_flops": flops, "copy_bandwidth": bandwidth, "n": n}


def cached(dtype="float32"):
    """The cached measurement for this device and dtype, or None: never measures."""
    try:
        with open(CACHE) as f:
            return json.load(f).get(device_key(dtype))
    except (OSError, ValueError):
        return None


def measured(dtype="float32", refresh=False):
    """The cached measurement for this device and dtype, measuring if absent.

    refresh measures again, and each figure keeps the best of the old and the
    new: a ceiling is the most the device has been seen to do, and a
    measurement taken while something else used the cores must not lower it."""
    return _cached_best(device_key(dtype), lambda: measure(dtype), refresh)


def _cached_best(key, measure_now, refresh):
    """The figures cached under key, measuring (measure_now() -> {name: value})
    if absent or asked to; each figure keeps the best of the old and the new.

    Processes on one machine (a pod's hosts under launch_local.py, pytest's
    workers) share the file, so one at a time reads, measures and writes it:
    none measures while another loads the cores, none writes over what another
    wrote since it read, and a figure is measured once, not once per process."""
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with _only_this_process():
        cache = {}
        if os.path.exists(CACHE):
            try:
                with open(CACHE) as f:
                    cache = json.load(f)
            except (OSError, ValueError):
                cache = {}  # a damaged cache is just measured again
        if refresh or key not in cache:
            new, old = measure_now(), cache.get(key, {})
            cache[key] = {name: max(value, old.get(name, 0)) for name, value in new.items()}
            tmp = f"{CACHE}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(cache, f, indent=1)
            os.replace(tmp, CACHE)  # a reader without the lock sees the old file or the new
    return cache[key]


@contextlib.contextmanager
def _only_this_process():
    """An exclusive lock on CACHE's lock file, held until the block ends."""
    with open(CACHE + ".lock", "a") as lock:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def measure_read_bandwidth():
    """bytes/s of a read-only stream over a large float32 array on the first
    local device: the fastest of a sum and the two matrix-vector products
    (vector on the right, on the left), which XLA's CPU backend spreads over
    its threads differently. Decode reads weights and cache and writes almost
    nothing, so this, not a copy, is its roof."""
    device = jax.local_devices()[0]
    rows = 2**14 if device.platform == "cpu" else 2**16  # 256 MiB or 1 GiB: past every cache
    with outside_the_step(device):
        a = jax.device_put(jnp.ones((rows, 4096), jnp.float32), device)
        right = jax.device_put(jnp.ones((4096,), jnp.float32), device)
        left = jax.device_put(jnp.ones((rows,), jnp.float32), device)
        seconds = min(
            best_time(jax.jit(jnp.sum), a),
            best_time(jax.jit(jnp.matmul), a, right),
            best_time(jax.jit(jnp.matmul), left, a),
        )
    return a.nbytes / seconds


def last_level_cache_bytes():
    """This CPU's largest cache, bytes, as Linux describes it
    (/sys/devices/system/cpu/cpu0/cache/index*/size, "32768K"); 0 if unknown."""
    sizes = []
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size")):
        try:
            with open(index) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        sizes.append(int(digits) * scale if digits.isdigit() else 0)
    return max(sizes, default=0)


def measure_cache_bandwidth():
    """{'cache_bandwidth': bytes/s of a read+write of an array that fits in the
    last-level cache, 'cache_bytes': that cache's size}, on this CPU; {} if the
    cache's size is unknown. A step's small arrays live there, not in DRAM: an
    op on them runs faster than the copy bandwidth, so the per-op best case
    needs this roof too (roofline/compiled/op_roofline.py)."""
    cache = last_level_cache_bytes()
    if not cache:
        return {}
    device = jax.local_devices()[0]
    with outside_the_step(device):
        # Read and written: half the cache in all, so both stay in it across calls.
        x = jax.device_put(jnp.ones((cache // 16,), jnp.float32), device)
        copy = jax.jit(lambda v: v + 1)
        seconds = min(best_time(copy, x, repeats=20) for _ in range(3))
    return {"cache_bandwidth": 2 * x.nbytes / seconds, "cache_bytes": cache}


def cache_roof(refresh=False):
    """(bytes/s, bytes) of this CPU's last-level cache, measured once and cached
    beside `measured`'s figures; (None, None) where its size is unknown."""
    figures = _cached_best(device_key("cache"), measure_cache_bandwidth, refresh)
    return figures.get("cache_bandwidth"), figures.get("cache_bytes")


def measure_matmul(batch, m, n, k, dtype):
    """FLOP/s of one batched matmul [batch, M, K] @ [batch, K, N] on this device,
    the best of 5 calls after one that compiles."""
    device = jax.local_devices()[0]
    dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}.get(dtype, dtype)
    with outside_the_step(device):
        a = jax.device_put(jnp.ones((batch, m, k), dtype), device)
        b = jax.device_put(jnp.ones((batch, k, n), dtype), device)
        product = jax.jit(jnp.matmul)  # batched: [batch, M, K] @ [batch, K, N]
        return 2 * batch * m * n * k / best_time(product, a, b)


def matmul_rates(shapes, refresh=False):
    """{(batch, M, N, K, dtype): FLOP/s} for the matmul shapes of a step, each
    timed once on this device and cached: on a CPU a small or thin matmul runs
    well below the 2048 x 2048 one that sets the peak, and that is measured,
    not assumed (roofline/compiled/op_roofline.py uses it for the prediction)."""
    rates = {}
    for shape in set(shapes):
        key = device_key("matmul " + ",".join(map(str, shape)))
        timed = _cached_best(key, functools.partial(_matmul_figures, *shape), refresh)
        rates[shape] = timed["flops"]
    return rates


def _matmul_figures(batch, m, n, k, dtype):
    return {"flops": measure_matmul(batch, m, n, k, dtype)}


def read_bandwidth(refresh=False):
    """This device's read-only stream bandwidth, bytes/s: measured once and cached
    beside `measured`'s figures; refresh measures again and keeps the best seen."""
    figures = _cached_best(
        device_key("read"), lambda: {"read_bandwidth": measure_read_bandwidth()}, refresh
    )
    return figures["read_bandwidth"]


def calibrate_lines(dtype):
    """Measure this machine afresh (`python -m roofline calibrate`), as text."""
    m = measured(dtype, refresh=True)
    lines = [
        f"{device_key(dtype)}",
        f"  matmul  {m['matmul_flops'] / 1e12:.3f} TFLOP/s "
        f"({m['n']} x {m['n']} {dtype}, best of 5)",
        f"  copy    {m['copy_bandwidth'] / 1e9:,.1f} GB/s (read + write of a large array)",
        f"  read    {read_bandwidth(refresh=True) / 1e9:,.1f} GB/s (read-only: decode's roof)",
    ]
    cache_bandwidth, cache_bytes = cache_roof(refresh=True)
    if cache_bandwidth:
        lines.append(
            f"  cache   {cache_bandwidth / 1e9:,.1f} GB/s (read + write within the "
            f"{cache_bytes / 2**20:,.0f} MiB last-level cache: the per-op roof of small ops)"
        )
    return [*lines, f"cached in {CACHE}"]

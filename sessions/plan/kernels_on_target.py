"""Our decode kernels compiled for the GPU they are written for, on a machine without one.

Nothing runs: each program is compiled from shapes for h100:1 (deviceless, as --target
compiles; roofline/plan/targets.py), with the JAX at hand. From that, two answers:

    decode_launches   the kernels a decode token launches, ours against XLA's step, read
                      off the compiled decode loop (roofline/compiled/launches.py):
                      s3_infer.py --decode-impl pallas says it on a CPU, where it times nothing
    compile_kernels   whether each kernel compiles with this JAX, alone and in the whole
                      decode, or which API it lacks, and how long each compile took beside
                      XLA's decode (scripts/kernels_across_jax.py; compile_times.py says it)

A compile may also never answer: JAX 0.12.0.1's Mosaic GPU searches the kernels' register
layouts (its layout inference) for minutes, or finds none (docs/results.md, "Decode kernels'
compile time"), where 0.10.2 and 0.11.2 compile each in seconds. So each compile can run under
a time limit (time_limit), past which it is given up and said to be, where it was stuck.
"""

import contextlib
import itertools
import signal
import threading
import time
from typing import NamedTuple

import jax

from roofline.compiled.launches import kernel_launches
from roofline.plan.targets import (
    EXTRAS,
    TargetError,
    compile_only_devices,
    missing_extras,
    parse_target,
)
from sessions.inference import kernel_step, kv_cache, layout, shapes
from sessions.kernels.decode_head import head_refusal
from sessions.model import init_params
from sessions.plan import programs

TARGET = "h100:1"  # the kernels use Hopper's wgmma and TMA: an H100 is what they are for


def target_devices(target_text=TARGET):
    """((Target, compile-only devices), None), or (None, why not: one line) where this
    machine cannot compile for the target (its chip compiler is not installed, or this
    JAX's refuses the target)."""
    chip, _ = parse_target(target_text)
    if missing := missing_extras(chip.platform):
        return None, f"{missing}, not installed here: pip install -r {EXTRAS}"
    try:
        return compile_only_devices(target_text), None
    except TargetError as e:  # e.g. the CUDA plugin, started with the CPU, found no driver
        return None, f"a compiler that starts ({e}; JAX_PLATFORMS=cpu defers it to here)"


def decode_program(cfg, batch, impl, target, devices):
    """kv_cache.decode_steps of `batch` rows with step `impl` (None: XLA's; "pallas": ours),
    compiled for the target (one device): a jax.stages.Compiled."""
    _, mesh = programs.target_mesh(None, target, devices)
    inputs, static = shapes.abstract_decode_inputs(cfg, batch, mesh)
    static = {**static, "impl": impl}
    compiled, oom, _ = programs.compile_or_oom(
        kv_cache.decode_steps, inputs, static, mesh, target.chip, lambda *a: None
    )
    if compiled is None:
        raise TargetError(f"decode of batch {batch} does not fit {target.name}: {oom}")
    return compiled


class NoAnswer(Exception):
    """A compile given up at its time limit; the message says where it was."""


def _where(frame):
    """Where a program was stopped: the outermost three functions of Mosaic GPU's lowering
    it was in ("lower_mgpu_module > infer_layout > ..."), else its innermost function."""
    innermost, outward = frame.f_code.co_name, []
    while frame is not None:
        if "mosaic/gpu/" in frame.f_code.co_filename.replace("\\", "/"):
            outward.append(frame.f_code.co_name)
        frame = frame.f_back
    inward = [name for name, _ in itertools.groupby(reversed(outward))]  # a recursion once
    return f"Mosaic GPU's {' > '.join(inward[:3])}" if inward else innermost


@contextlib.contextmanager
def time_limit(seconds):
    """Raise NoAnswer if the block runs past `seconds` (None: no limit). By SIGALRM, so in
    the main thread, between Python steps (a compile stuck inside C++ answers late)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise NoAnswer(f"given up after {seconds:g} s, still in {_where(frame)}")

    before = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def decode_launches(cfg, batch, target_text=TARGET, seconds=None):
    """One line: the kernels a decode token of `batch` rows launches, ours against XLA's,
    each compiled for the target, ours within `seconds`; or, where this machine cannot
    compile for it, why."""
    found, why = target_devices(target_text)
    if found is None:
        return f"kernels a token: not counted, compiling for {target_text} needs {why}"
    xla = kernel_launches(decode_program(cfg, batch, None, *found).as_text())
    head = f"kernels a token, compiled ({target_text}):"
    try:
        with time_limit(seconds):
            ours = kernel_launches(decode_program(cfg, batch, "pallas", *found).as_text())
    except NoAnswer as e:
        return (
            f"{head} XLA's step {xla.per_token}; ours not counted: {e} (JAX {jax.__version__}; "
            "scripts/kernels_across_jax.py says which kernel)"
        )
    pallas = ours.kinds.get("pallas", 0)
    return (
        f"{head} ours {ours.per_token} ({pallas} of them our Mosaic GPU kernels), XLA's step "
        f"{xla.per_token} (--target {target_text} --decode-impl pallas says what each is)"
    )


def refusal(error):
    """An exception as one line: its type and its first line (the API a JAX lacks)."""
    first = next((line for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first.strip()}"[:300]


class Attempt(NamedTuple):
    """One compile of compile_kernels."""

    name: str  # "attention", "MLP", "head"; "ours" (the whole decode), "XLA's" (its decode)
    what: str  # where it is written, or which program
    status: str  # "compiled", "refused", "no answer" or "not tried"
    said: str  # what it launches, or why not, in a line
    seconds: float | None  # lower and compile, measured here (None: not compiled)


def timed(compile):
    """(compile(), its seconds): a lowering and compile timed together, as a student waits."""
    start = time.perf_counter()
    compiled = compile()
    return compiled, time.perf_counter() - start


def compile_kernels(cfg, batch, target, devices, seconds=None, whole=True):
    """[Attempt] for our attention kernel and MLP kernel, each alone over one layer of cfg
    at `batch` rows, the head kernel (where cfg's head is one it runs:
    decode_head.head_refusal), XLA's decode loop, then (where `whole`) the decode loop with
    ours (its kernels a token beside XLA's), each compiled for the target within `seconds`,
    from cold caches, and timed. What does not compile says why in one line: on an older
    JAX, the API it lacks; past the time limit, where it was."""
    on_chip = jax.sharding.SingleDeviceSharding(devices[0])

    def abstract(tree):  # shapes on the target's device: nothing is allocated
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_chip), tree
        )

    w = jax.eval_shape(lambda: layout.decode_weights(init_params(cfg, jax.random.key(0)), cfg))
    cache = jax.eval_shape(lambda: kv_cache.init_cache(cfg, batch))
    x = jax.ShapeDtypeStruct((batch, cfg.embed), cfg.dtype)
    pending = jax.ShapeDtypeStruct((0, batch, cfg.embed), "float32")  # the first layer's: none
    pos, live = jax.ShapeDtypeStruct((), "int32"), jax.ShapeDtypeStruct((), "bool")

    # Each kernel's module is imported as its program is traced, so that a JAX which lacks
    # an API the module uses as it loads refuses that kernel alone, in one line.
    def attention(layer, cache, x, pending, pos, live):
        from sessions.kernels.decode_attention import attention_layer

        rope = kernel_step.rope_tables(pos, cfg.head_dim, cfg.rope_base) if cfg.rope else None
        where = kernel_step.clock(pos, live)
        return attention_layer(layer, cache, x, pending, where, cfg, rope=rope, interpret=False)

    def mlp(layer, x, pending):
        from sessions.kernels.decode_mlp import mlp_layer

        return mlp_layer(layer, x, pending, cfg, interpret=False)

    def head(w, x, pending, held, pos, live):
        from sessions.kernels.decode_head import head

        where = kernel_step.clock(pos, live)
        return head(w, x, pending, held, where, cfg, interpret=False)

    def launches_of_ours(program, inputs):
        compiled, s = timed(lambda: jax.jit(program).lower(*abstract(inputs)).compile())
        launches = kernel_launches(compiled.as_text())  # with XLA's few around it
        ours, n = launches.kinds.get("pallas", 0), launches.per_token
        return f"{ours} Mosaic GPU kernel{'s' * (ours != 1)} of {n} launch{'es' * (n != 1)}", s

    xla_per_token = []  # XLA's kernels a token, once its decode compiled

    def launches_of_the_decode(impl):
        compiled, s = timed(lambda: decode_program(cfg, batch, impl, target, devices))
        n = kernel_launches(compiled.as_text()).per_token
        if impl is None:
            xla_per_token.append(n)
            return f"{n} kernels a token", s
        return f"{n} kernels a token" + "".join(f", XLA's {x}" for x in xla_per_token), s

    layer = w["layers"][0]
    last = jax.ShapeDtypeStruct((cfg.ff // 64, batch, cfg.embed), "float32")  # an MLP's partials
    held = jax.ShapeDtypeStruct((batch, cfg.vocab), "float32")
    attempts = {
        "sessions/kernels/decode_attention.py": lambda: launches_of_ours(
            attention, (layer, cache[0], x, pending, pos, live)
        ),
        "sessions/kernels/decode_mlp.py": lambda: launches_of_ours(mlp, (layer, x, pending)),
        "sessions/kernels/decode_head.py": lambda: launches_of_ours(
            head, (w, x, last, held, pos, live)
        ),
        "XLA's decode (kv_cache.decode_steps, XLA's step)": lambda: launches_of_the_decode(None),
        "the whole decode (kv_cache.decode_steps, our step)": lambda: launches_of_the_decode(
            "pallas"
        ),
    }
    names = dict(zip(attempts, ("attention", "MLP", "head", "XLA's", "ours")))
    if head_refusal(cfg) is not None:  # XLA's head, in the whole decode
        del attempts["sessions/kernels/decode_head.py"]
    if not whole:  # the caller has compiled (and timed) it already
        del attempts["the whole decode (kv_cache.decode_steps, our step)"]
    results = []
    for what, attempt in attempts.items():
        name = names[what]
        # The whole decode holds our kernels: where one did not compile, it would not either.
        if name == "ours" and any(r.status != "compiled" for r in results if r.name != "XLA's"):
            results.append(Attempt(name, what, "not tried", "a kernel above did not compile", None))
            continue
        jax.clear_caches()  # each compile from cold, as its first run: no trace of another's
        try:
            with time_limit(seconds):
                said, s = attempt()
            results.append(Attempt(name, what, "compiled", said, s))
        except NoAnswer as e:
            results.append(Attempt(name, what, "no answer", str(e), None))
        except Exception as e:  # a JAX without an API the kernel uses: said in one line
            results.append(Attempt(name, what, "refused", refusal(e), None))
    return results

"""How long our decode kernels take to compile, beside XLA's decode of the same shapes: a
measured figure, said with the machine and the JAX that measured it.

The compiles are kernels_on_target.compile_kernels' (each lowered and compiled from cold,
timed together); this says them, as s3_infer.py --target, s4_kernels.py and
scripts/kernels_across_jax.py print them:

    compiled for h100:1 in 4.1 s (XLA's decode) and 8.4 s (ours, 2.0x); measured on
        AMD EPYC, 2 cores, JAX 0.10.2                                      (one line)
    ours, each kernel alone: attention 2.5 s, MLP 0.9 s, head 0.9 s

A compile's time depends on the CPU that compiles, not on the chip compiled for: so the
machine is this one, its cores those this process may run on.
"""

import os
import platform

import jax

from sessions.plan import kernels_on_target


def machine():
    """'AMD EPYC, 2 cores, JAX 0.10.2': this CPU's model (/proc/cpuinfo's, else what
    platform knows), the cores this process may use, and this JAX."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            names = (line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
            model = next(names, None)
    except OSError:  # not Linux
        pass
    model = model or platform.processor() or platform.machine() or "an unnamed CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} core{'s' * (cores != 1)}, JAX {jax.__version__}"


def _took(attempt, label):
    """'4.4 s (label)', or, where it did not compile, 'label: no answer (why)'."""
    if attempt is None:
        return f"{label}: not compiled"
    if attempt.status == "compiled":
        return f"{attempt.seconds:.1f} s ({label})"
    return f"{label}: {attempt.status} ({attempt.said})"


def decode_line(attempts, target_name):
    """One line: the whole decode's compile with our kernels beside XLA's, and their ratio,
    from compile_kernels' attempts (with the caller's Attempt named "ours" where it
    compiled that decode itself)."""
    found = {a.name: a for a in attempts}
    xla, ours = found.get("XLA's"), found.get("ours")
    both = [a for a in (xla, ours) if a is not None and a.status == "compiled"]
    if len(both) == 2:
        said = f"{xla.seconds:.1f} s (XLA's decode) and {ours.seconds:.1f} s (ours, "
        said += f"{ours.seconds / xla.seconds:.1f}x)"
    else:
        said = " and ".join((_took(xla, "XLA's decode"), _took(ours, "ours")))
    return f"compiled for {target_name} in {said}; measured on {machine()}"


def kernels_line(attempts):
    """One line: each of our kernels' compile alone, or what became of it."""
    alone = [a for a in attempts if a.name not in ("ours", "XLA's")]
    each = (
        f"{a.name} {a.seconds:.1f} s" if a.status == "compiled" else f"{a.name} {a.status}"
        for a in alone
    )
    return f"ours, each kernel alone: {', '.join(each)}"


def lines_on_target(cfg, plans, target, devices, seconds=None):
    """s3_infer.py --target --decode-impl pallas: for each batch the planner compiled
    (roofline.plan.decode.DecodePlan, its compile of our whole decode timed), its line
    beside XLA's decode and each kernel's alone, compiled here for the target."""
    for plan in plans:
        attempts = kernels_on_target.compile_kernels(
            cfg, plan.batch, target, devices, seconds=seconds, whole=False
        )
        ours = kernels_on_target.Attempt("ours", "the planner's", "compiled", "", plan.compile_s)
        yield f"batch {plan.batch}: {decode_line([*attempts, ours], target.name)}"
        yield f"  {kernels_line(attempts)}"

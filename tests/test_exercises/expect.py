"""A student's answer against the expected one, in words a failure can show.

    expect(gqa_cache_bytes(32, 1, 8192, 32, 8, 128, 2), 2**30, "bytes", "L=32, B=1, T=8192, K=8")

fails as `assert got == want` would, and says which number is whose:

    L=32, B=1, T=8192, K=8: yours 536,870,912 bytes (537 MB), expected 1,073,741,824 bytes (1.07 GB)

That line is what scripts/homework.py prints for the exercise, with its hint.
The comparison is the test's own, unchanged: `got == want` (want a number, a
tuple, a string, or pytest.approx of them where the test allows a tolerance),
`got is None`, and the bounds `above` (got > x), `below` (got < x), `at_most`
(got <= x) and `at_least` (x <= got). So a test is exactly as strict as its
bare assert was; only the message is better.
"""

import pytest

# The class every pytest.approx(...) is an instance of (private in pytest 8, whose
# module moved in 9): its base, found from one.
APPROX = type(pytest.approx(0.0)).__base__

# Units shown again in SI prefixes where the count is large or small: "(1.07 GB)".
SI_UNITS = {"bytes": "B", "FLOPs": "FLOPs", "s": "s"}
PREFIXES = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
PREFIXES += [(1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]


def expect(got, want=..., unit="", what="", *, above=None, below=None, at_most=None, at_least=None):
    """Raise AssertionError unless got == want (want left out: no equality asked)
    and every bound given holds; the message says `what` was computed, the
    student's value and the expected one, each with its unit."""
    wants, holds = [], True
    if want is not ...:
        holds = got is None if want is None else got == want
        wants.append(show(want, unit))
    for word, bound, ok in [
        ("above", above, lambda: got > above),
        ("below", below, lambda: got < below),
        ("at most", at_most, lambda: got <= at_most),
        ("at least", at_least, lambda: at_least <= got),
    ]:
        if bound is not None:
            holds = holds and ok()
            wants.append(f"{word} {show(bound, unit)}")
    if holds:
        return
    yours = show(got, unit)
    if want is not ... and yours == show(untolerated(want), unit):  # alike to 7 digits
        yours, wants[0] = show(got, unit, digits=None), show(want, unit, digits=None)
    prefix = f"{what}: " if what else ""
    raise AssertionError(f"{prefix}yours {yours}, expected {' and '.join(wants)}")


def untolerated(want):
    """want without pytest.approx's tolerance: the value an answer is compared with."""
    if isinstance(want, APPROX):
        return want.expected
    if isinstance(want, (tuple, list)):
        return type(want)(untolerated(w) for w in want)
    return want


def show(value, unit="", digits=7):
    """A value as the message writes it: 1,073,741,824 bytes (1.07 GB), 0.25 ± 2.5e-07,
    (79.41129 GB, True), None, 'memory'. A float keeps `digits` significant digits,
    every one (repr's) when digits is None."""
    if isinstance(value, APPROX):
        expected = value.expected
        if isinstance(expected, (tuple, list)):
            each = [pytest.approx(e, rel=value.rel, abs=value.abs) for e in expected]
            return show(tuple(each), unit, digits)
        return f"{show(expected, unit, digits)} ± {value.tolerance:.2g}"
    if isinstance(value, (tuple, list)):
        shown = ", ".join(show(v, unit, digits) for v in value)
        return f"[{shown}]" if isinstance(value, list) else f"({shown})"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(repr(v) for v in value)) + "}" if value else "set()"
    if getattr(value, "shape", None) == ():  # a NumPy or JAX scalar
        value = value.item()
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return repr(value)
    if not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, int):
        text = f"{value:,}"
    else:
        text = repr(value) if digits is None else f"{value:,.{digits}g}"
    if not unit:
        return text
    text += unit if unit == "x" else f" {unit}"  # a speed-up: 1.9x
    return text + scaled(value, unit)


def scaled(value, unit):
    """' (1.07 GB)' for a count of bytes, FLOPs or seconds far from 1; '' otherwise."""
    if unit not in SI_UNITS or value == 0:
        return ""
    size, prefix = next(((s, p) for s, p in PREFIXES if abs(value) >= s), PREFIXES[-1])
    if size == 1.0:
        return ""
    return f" ({value / size:.3g} {prefix}{SI_UNITS[unit]})"

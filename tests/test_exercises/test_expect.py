"""tests/test_exercises/expect.py: a wrong answer says whose number is whose, with its unit,
and a test through it is exactly as strict as its bare assert; every session test uses it."""

import ast
import pathlib

import pytest

from .expect import expect

HERE = pathlib.Path(__file__).parent

# (got, want, bounds): a bare assert decides each; expect must decide it the same way.
CASES = [
    (2**29, 2**30, {}),
    (2**30, 2**30, {}),
    (1.0 + 1e-6, pytest.approx(1.0), {}),  # approx's own edge: rel 1e-6, inclusive
    (1.0 + 1.1e-6, pytest.approx(1.0), {}),
    (17.13426432 * (1 + 2e-9), pytest.approx(17.13426432, rel=1e-9), {}),
    ((1000.0, 502.0), pytest.approx((1000, 502)), {}),
    ((1000.0, 503.0), pytest.approx((1000, 502)), {}),
    ((79.411290112, True), (pytest.approx(79.411290112), True), {}),
    ((79.411290112, False), (pytest.approx(79.411290112), True), {}),
    (None, None, {}),
    (0, None, {}),
    ((None, None), (None, None), {}),
    ("memory", "compute", {}),
    ({"f32"}, {"f32"}, {}),
    (3, ..., {"above": 3}),  # strict: on the bound fails
    (3, ..., {"below": 3}),
    (3, ..., {"at_most": 3}),  # not strict: on the bound passes
    (3, ..., {"at_least": 3}),
    (2.95, ..., {"above": 2.9, "below": 3}),
    (3.0, ..., {"above": 2.9, "below": 3}),
    (float("nan"), ..., {"below": 1}),
]


def bare(got, want, bounds):
    """What the test's assert decided before expect."""
    ok = True if want is ... else (got is None if want is None else got == want)
    ops = {
        "above": lambda b: got > b,
        "below": lambda b: got < b,
        "at_most": lambda b: got <= b,
        "at_least": lambda b: b <= got,
    }
    return ok and all(ops[name](b) for name, b in bounds.items())


@pytest.mark.parametrize("got, want, bounds", CASES)
def test_expect_is_exactly_as_strict_as_the_bare_assert(got, want, bounds):
    if bare(got, want, bounds):
        expect(got, want, **bounds)
    else:
        with pytest.raises(AssertionError):
            expect(got, want, **bounds)


def message(*args, **kwargs):
    with pytest.raises(AssertionError) as failed:
        expect(*args, **kwargs)
    return str(failed.value)


def test_the_message_says_what_whose_number_and_the_unit():
    said = message(2**29, 2**30, "bytes", "L=32, B=1, T=8192, K=8")
    what, _, rest = said.partition(": ")
    assert what == "L=32, B=1, T=8192, K=8", said
    yours, _, expected = rest.partition(", expected ")
    # 2^29 = 536,870,912 bytes, 537 MB; 2^30 = 1,073,741,824 bytes, 1.07 GB.
    assert yours == "yours 536,870,912 bytes (537 MB)", said
    assert expected == "1,073,741,824 bytes (1.07 GB)", said


def test_tolerances_bounds_and_tuples_are_spelled_out():
    said = message(6.2e-5, pytest.approx(7.1e-5), "s", "batch 1")
    assert said == "batch 1: yours 6.2e-05 s (62 µs), expected 7.1e-05 s (71 µs) ± 7.1e-11"
    said = message(3.0, above=2.9, below=3, unit="x", what="K small")
    assert said == "K small: yours 3x, expected above 2.9x and below 3x"
    said = message((16.5, True), (pytest.approx(17.0), True), "GB")
    assert said == "yours (16.5 GB, True), expected (17 GB ± 1.7e-05, True)"
    assert message(None, 3, "chips") == "yours None, expected 3 chips"
    assert message([0, 1], [0, 1, 4]) == "yours [0, 1], expected [0, 1, 4]"


def test_numbers_alike_to_seven_digits_are_shown_whole():
    """A near miss under a tight tolerance must not read as 'yours 1, expected 1'."""
    said = message(1.0000001, pytest.approx(1.0, rel=1e-9))
    assert said == "yours 1.0000001, expected 1.0 ± 1e-09"


def asserts_without_words(path):
    """The line of every `assert` in a file that gives no message."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert) and not node.msg]


@pytest.mark.parametrize("path", sorted(HERE.glob("test_session_*.py")), ids=lambda p: p.name)
def test_session_tests_compare_through_expect_or_say_why(path):
    """A bare `assert a == b` reaches the homework report as 'assert 536870912 ==
    1073741824': whose number, in what unit, for which case? A session test
    compares through expect(), or its assert says what failed."""
    assert asserts_without_words(path) == [], f"{path.name}: bare asserts at these lines"

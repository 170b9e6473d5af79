"""Numbers as the plans print them: bytes in GB or MB, seconds in ms or us,
FLOPs from MFLOP to EFLOP, whichever keeps a few digits; a chip's memory in the
unit its vendor sizes it in."""


def gb(x):
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.2f} MB"


def capacity(x, decimal=True):
    """A memory's size: in GiB where it is a whole number of them, as NVIDIA's "80GB"
    (80 GiB) and Google's TPU pages' GiB are, with GB beside it unless decimal=False
    ("80 GiB (85.90 GB)"); else gb(x) (a v5e's 16 GB)."""
    if x < 2**30 or x % 2**30:
        return gb(x)
    return f"{x / 2**30:,.0f} GiB" + (f" ({gb(x)})" if decimal else "")


def ms(s):
    return f"{s * 1e3:,.2f} ms" if s >= 1e-4 else f"{s * 1e6:,.2f} us"


def flop(x):
    """FLOPs in the unit that keeps a few digits: MFLOP, GFLOP below a TFLOP, then the
    largest of TFLOP, PFLOP, EFLOP that leaves 1 or more (2.68e18 is "2.68 EFLOP")."""
    for unit, name in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP")):
        if x >= unit:
            return f"{x / unit:,.2f} {name}"
    return f"{x / 1e9:,.1f} GFLOP" if x >= 1e10 else f"{x / 1e6:,.1f} MFLOP"

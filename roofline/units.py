"""Numbers as the plans print them: bytes in GB or MB, seconds in ms or us,
FLOPs in GFLOP or MFLOP, whichever keeps a few digits."""


def gb(x):
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.2f} MB"


def ms(s):
    return f"{s * 1e3:,.2f} ms" if s >= 1e-4 else f"{s * 1e6:,.2f} us"


def flop(x):
    return f"{x / 1e9:,.1f} GFLOP" if x >= 1e10 else f"{x / 1e6:,.1f} MFLOP"

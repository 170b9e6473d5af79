"""MFU versus memory-bandwidth utilisation (MBU).

MFU asks what fraction of the chip's peak FLOP/s a kernel used; MBU what
fraction of its memory bandwidth. A kernel is limited by one or the other
(the roofline): a large matmul can approach MFU 1, an elementwise op never
can, because it does a FLOP or two per element it reads and writes. For
elementwise work MBU is the honest measure: 1 means as fast as memory goes.
"""


def matmul_utilisation(M, K, N, seconds, peak_flops, bandwidth, itemsize=2):
    """(MFU, MBU) of a [M, K] @ [K, N] matmul that took `seconds`.

    FLOPs = 2*M*K*N; bytes = itemsize * (M*K + K*N + M*N) (each operand read
    once, the result written once). MFU = FLOPs / seconds / peak_flops;
    MBU = bytes / seconds / bandwidth (bytes/s).
    """
    flops = 2 * M * K * N
    moved = itemsize * (M * K + K * N + M * N)
    return flops / seconds / peak_flops, moved / seconds / bandwidth


def elementwise_utilisation(
    n, seconds, peak_flops, bandwidth, itemsize=2, inputs=1, flops_per_element=1
):
    """(MFU, MBU) of an elementwise op over n elements that took `seconds`.

    It reads `inputs` arrays of n elements and writes one: bytes =
    itemsize * n * (inputs + 1); FLOPs = flops_per_element * n.
    """
    flops = flops_per_element * n
    moved = itemsize * n * (inputs + 1)
    return flops / seconds / peak_flops, moved / seconds / bandwidth


def best_mfu(intensity, peak_flops, bandwidth):
    """The highest MFU a kernel of this intensity (FLOPs per byte) can reach.

    Its time is at least max(FLOPs / peak, bytes / bandwidth), so
    MFU <= min(1, intensity * bandwidth / peak_flops) = min(1, intensity / ridge).
    """
    return min(1.0, intensity * bandwidth / peak_flops)

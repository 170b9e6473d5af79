"""jit: fusing relu into the matmul saves a round trip through memory.

Op by op, `jax.nn.relu(A @ B)` is two kernels: the matmul writes C = A @ B
to memory, then relu reads C back and writes its result. Under `jax.jit`,
XLA can apply relu to each block of C while it is still in registers or
cache: C never goes to memory. When the work is memory-bound (a small inner
dimension K: few FLOPs per byte), time is bytes / bandwidth, so the speed-up
is the ratio of bytes moved.

A: [M, K], B: [K, N], C and the output: [M, N].
"""

import jax

from roofline.calibrate import best_time


def unfused_bytes(M, K, N, itemsize=4):
    """Bytes moved by relu(A @ B) op by op, at least.

    The matmul reads A and B and writes C; relu reads C and writes the
    output: itemsize * (M*K + K*N + 3*M*N).
    Hint: count each array read or written once per kernel that touches it.
    """
    raise NotImplementedError


def fused_bytes(M, K, N, itemsize=4):
    """Bytes moved by jit(relu(A @ B)), one fused kernel: A and B read, the
    output written, C never stored: itemsize * (M*K + K*N + M*N).
    """
    raise NotImplementedError


def predicted_speedup(M, K, N, itemsize=4):
    """The speed-up of the fused version when both are memory-bound: a ratio >= 1.

    Time = bytes / bandwidth for each version, so the speed-up is
    unfused bytes / fused bytes; with K much smaller than M and N it nears 3.
    (With a large K the matmul is compute-bound and the speed-up nears 1.)
    Hint: two of the functions above.
    """
    raise NotImplementedError


def measure_speedup(M, K, N, repeats=5):
    """Time relu(A @ B) op by op and jitted on the default device.

    Returns {"op_by_op_s": seconds, "jit_s": seconds, "speedup": op_by_op_s /
    jit_s}. A, B: float32 [M, K], [K, N] from jax.random.normal. Each
    version runs once first (the compile is not timed), then the fastest of
    `repeats` runs counts, each ended by jax.block_until_ready (dispatch is
    asynchronous: without it you time the dispatch, not the work).
    Hint: roofline.calibrate.best_time(fn, *args, repeats=...) does exactly
    that; the op-by-op version is the same Python function without jax.jit.
    """
    raise NotImplementedError

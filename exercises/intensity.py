"""Arithmetic intensity of an attention-like chain: C @ relu(A @ B).

With A = K [T, D] (keys), B = Q^T [D, S] (queries), C = V^T [D, T] (values),
X = relu(A @ B) is a [T, S] score matrix and C @ X is the [D, S] output:
attention with relu in place of softmax. Its FLOPs grow with S*T*D, its
inputs and output only with (S + T)*D, but op by op the [T, S] matrix goes
to memory and back. Whether it does decides which side of the ridge it sits:

    intensity = FLOPs / bytes        ridge = peak FLOP/s / bandwidth (bytes/s)
    intensity < ridge: memory-bound  intensity >= ridge: compute-bound

Keeping X on chip is what flash attention does.
"""


def chain_flops(S, T, D):
    """FLOPs of C @ relu(A @ B): the two matmuls, 2*T*D*S each (relu's T*S
    comparisons are a 1/(4D) share: left out). Returns 4*S*T*D.
    Hint: a matmul [M, K] @ [K, N] costs 2*M*K*N (a multiply and an add).
    """
    raise NotImplementedError


def chain_bytes(S, T, D, itemsize=2, fused=False):
    """Bytes C @ relu(A @ B) moves to and from memory, at least.

    Always: read A [T, D], B [D, S], C [D, T]; write the output [D, S].
    Unfused (three kernels), also: X = A @ B written, read by relu, relu(X)
    written, read by the second matmul: 4 more [T, S] arrays.
    Hint: count elements, then multiply by itemsize (2 for bfloat16).
    """
    raise NotImplementedError


def chain_intensity(S, T, D, itemsize=2, fused=False):
    """FLOPs per byte of C @ relu(A @ B): chain_flops / chain_bytes."""
    raise NotImplementedError


def bound(intensity, peak_flops, bandwidth):
    """'memory' if intensity is below the ridge peak_flops / bandwidth, else 'compute'.

    peak_flops in FLOP/s, bandwidth in bytes/s (roofline/hardware.py has
    both per chip: chip.peak("bfloat16"), chip.hbm_bandwidth).
    """
    raise NotImplementedError

"""RoPE: rotary positions, and why q·k then sees only the distance between tokens.

A learned table adds a vector per position to the embedding. RoPE instead
rotates each query and key by an angle that grows with its position, inside
attention, so that the score of a query at position m and a key at position n
depends on m - n alone (Su et al., "RoFormer", 2021, arXiv:2104.09864).

The D dims of a head form D/2 pairs, and pair i turns by pos·θ_i, with

    θ_i = base^(-2i/D),   i = 0 .. D/2 - 1     (base 10,000; LLaMA-3: 500,000)

so the first pairs turn fast (θ_0 = 1 radian per token) and the last ones
slowly. The pairing is LLaMA's "rotate_half", as Hugging Face's LLaMA and
sessions/model/rotary.py write it: dims i and i + D/2 form pair i (not 2i and 2i + 1,
the interleaved form of Meta's original code; the two differ by a fixed
permutation of the dims, which the weights absorb). With x1 = x[:D/2],
x2 = x[D/2:] and a = pos·θ:

    out[:D/2] = x1·cos(a) − x2·sin(a)
    out[D/2:] = x2·cos(a) + x1·sin(a)

which is x·cos + rotate_half(x)·sin, with rotate_half(x) = [−x2, x1] and the
angles repeated to D.

Why only the distance: turning two 2-D vectors by angles a and b changes
their dot product as turning one of them by b − a would (a rotation keeps
lengths, so R(a)ᵀR(b) = R(b − a)). Pair by pair, q at m and k at n give
q_i · R((n − m)·θ_i) k_i: m and n appear only as n − m.
"""

import jax.numpy as jnp


def rotary_angles(positions, head_dim, base=10_000.0):
    """The angle each pair turns by: [S, D/2] floats, positions[s]·θ_i.

    positions: [S] ints; θ_i = base^(-2i/D) for i = 0 .. D/2 - 1.
    Hint: jnp.arange(0, head_dim, 2) / head_dim is 2i/D.
    """
    theta = base ** (-jnp.arange(0, head_dim, 2) / head_dim)  # [D/2]
    return positions[:, None] * theta[None, :]


def rotate(x, positions, base=10_000.0):
    """x [S, D] rotated, row s by positions[s]: [S, D].

    Pair i is (x[:, i], x[:, i + D/2]), LLaMA's rotate_half pairing; it turns
    by positions[s]·θ_i as the module docstring writes out.
    Hint: a = rotary_angles(...); cos and sin of jnp.concatenate([a, a], -1);
    rotate_half(x) = jnp.concatenate([-x2, x1], -1).
    """
    D = x.shape[-1]
    angles = rotary_angles(positions, D, base)
    angles = jnp.concatenate([angles, angles], axis=-1)  # [S, D]: pair i's angle at i and i + D/2
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    rotated_half = jnp.concatenate([-x2, x1], axis=-1)
    return x * jnp.cos(angles) + rotated_half * jnp.sin(angles)


def rotated_score(q, k, m, n, base=10_000.0):
    """The attention score q·k once q is rotated to position m and k to
    position n: a float32 scalar (unscaled, no 1/sqrt(D)).

    q, k: [D]. Use rotate on each as a one-row sequence. Whatever m and n,
    the result is the same for (m + s, n + s): try it.
    """
    q_rotated = rotate(q[None, :], jnp.array([m]), base)[0]
    k_rotated = rotate(k[None, :], jnp.array([n]), base)[0]
    return jnp.dot(q_rotated, k_rotated)

"""Overlap by hand: a collective matmul, the all-gather cut into ring steps.

With FSDP every weight is split along E over the "fsdp" axis, and each layer
gathers it back before use. The MLP's first matmul, in the model's layout
(sessions/shard/sharding.py):

    x     [B, S, E]   rows split over fsdp: each device holds B/N rows, all of E
    w_in  [E, F]      split on E over fsdp: each device holds E/N rows of it
    out   [B, S, F]   = x @ w_in, rows split like x

The plain way, `allgather_matmul`, gathers all N shards of w and then
multiplies once. While the bytes move the matmul units have nothing to do,
and while they multiply the links are idle: the step pays for both, one
after the other.

The matmul does not need the whole weight at once. x @ w is a sum over E,

    out = sum over shards k of  x[:, :, E-shard k] @ w[E-shard k, :]

so a device can multiply the shard it holds while the next one travels in.
`collective_matmul` passes the weight shards around the ring of fsdp devices
with N-1 `ppermute`s: at each step a device sends the shard in hand on to its
neighbour and, while it travels, multiplies it into its own output rows. Only
the last step has nothing left to send; if a shard's multiply takes longer
than its hop, all the traffic hides behind compute.

Which operand travels: the weight. A device already holds its own rows of x
with all of E, and its output rows are its own; all it lacks is the other
E-shards of w. Passing x around instead would bring it other devices' rows,
which its output does not use. (The mirror image, passing partial outputs
around and adding as they go, is the reduce-scatter matmul of the backward
pass's weight gradients.)

The loop is unrolled in Python: N is the mesh's size, known when tracing, so
each step's permute and matmul sit side by side in one straight program, and
XLA's scheduler can place the permute's start before the matmul and its end
after it without seeing through a loop. It also reads as the story above. A
`jax.lax.fori_loop` would keep the program small for a large ring, at the
cost of a loop body the scheduler must pipeline across trips.

Hiding pays only where a shard's matmul lasts as long as its hop. The napkin
on a v5e (roofline/hardware.py: 197 TFLOP/s bf16, 400 GB/s of links a chip, both
ways), for GPT2_MLP, one row of 1024 tokens a device on a ring of 8:

    hop      a shard of w_in, 96 x 3072 bf16 = 0.59 MB at 200 GB/s   ~3.0 us
    matmul   2 x 1024 x 96 x 3072 = 0.60 GFLOP at 197 TFLOP/s         ~3.1 us

At 256 tokens the matmul is a quarter of the hop, and the compiled program
shows it: the scheduler sends the first three shards back to back.

Compiled for tpu-v5e:2x4 at GPT2_MLP (sessions/plan/collective_matmul_on_target.py's
`programs_on`, then roofline/compiled/schedule.py's `schedule_summary`, which
reads what the compiled schedule hides behind its matmuls;
tests/test_collective_matmul.py checks each line):

    allgather_matmul   1 all-gather, then 1 matmul: nothing beside the gather
    collective_matmul  permute start, matmul, permute done, seven times, then
                       the last shard's matmul: 7 permutes, all 7 hidden
    auto_matmul        XLA's own loop, a "windowed einsum": one permute before
                       it, then 2 trips of 4 permutes (2 each way round the
                       ring, 2 in flight) and 2 matmuls of two shards each:
                       9 permutes, 8 hidden, 4 matmuls

So XLA does this on its own on TPU, in both directions at once (half the hops
each way), once the matmul is big enough: at 256 tokens it gathers instead.
In the gpt2-bytes step over `--mesh fsdp=8` (docs/chips.md, "Reading a plan") it
builds 145 such loops: a layer's q, k and v projections gather their weights
in loops, forward and backward, and six weight gradients are reduce-scattered
in loops (the mirror image), plus the embedding's gradient. The MLP's w_in and
w_out it gathers whole instead, asynchronously, started while the attention's
loops run. `schedule_summary` of that step: 1305 permutes, 122 all-gathers and
690 matmuls, 1085 of the permutes hidden behind a matmul, at most 5 in flight.
Writing the loop by hand puts it where the partitioner does not, and says
which operand travels. The overlap itself stays the scheduler's call: compiled
for h100:8 (deviceless), the same program runs six permutes back to back
first, and only the seventh flies beside a matmul.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from sessions.shard.sharding import ACTIVATION_SPECS, PARAM_SPECS

RING = "fsdp"  # the mesh axis whose devices pass the weight shards around
# (B, S, E, F) of the gpt2-bytes preset's first MLP matmul, one sequence of 1024 tokens a
# device on a ring of 8.
GPT2_MLP = (8, 1024, 768, 3072)
X_SPEC, W_SPEC, OUT_SPEC = ACTIVATION_SPECS["BSE"], PARAM_SPECS["w_in"], ACTIVATION_SPECS["BSF"]


def allgather_matmul(x, w, mesh):
    """x [B, S, E] @ w [E, F] -> [B, S, F]: gather every E-shard of w, then one matmul."""

    def local(x, w):
        w = jax.lax.all_gather(w, RING, axis=0, tiled=True)  # [E/N, F] -> [E, F]
        return jnp.einsum("BSE,EF->BSF", x, w)

    return jax.shard_map(local, mesh=mesh, in_specs=(X_SPEC, W_SPEC), out_specs=OUT_SPEC)(x, w)


def collective_matmul(x, w, mesh):
    """x [B, S, E] @ w [E, F] -> [B, S, F]: the same product, each E-shard of w
    multiplied while it travels on around the ring."""
    n = mesh.shape[RING]
    # Each device sends to the next one around the ring, so receives from the one
    # before: after k hops, device i holds the shard device i - k started with.
    ring = [(i, (i + 1) % n) for i in range(n)]

    def local(x, w):
        me = jax.lax.axis_index(RING)
        e = w.shape[0]  # E/N rows of the weight in each shard

        def times(k, w):
            """x's E-columns that match the shard held after k hops [B, S, E/N], times it."""
            x_k = jax.lax.dynamic_slice_in_dim(x, (me - k) % n * e, e, axis=2)
            return jnp.einsum("BSE,EF->BSF", x_k, w)

        out = 0.0
        for k in range(n - 1):
            w_next = jax.lax.ppermute(w, RING, ring)  # in flight while ...
            out = out + times(k, w)  # ... the shard in hand is multiplied
            w = w_next
        return out + times(n - 1, w)  # the last shard: nothing left to send

    return jax.shard_map(local, mesh=mesh, in_specs=(X_SPEC, W_SPEC), out_specs=OUT_SPEC)(x, w)


def auto_matmul(x, w, mesh):
    """x [B, S, E] @ w [E, F] -> [B, S, F] as the model writes it: one einsum, the
    layout pinned, the communication left to XLA's partitioner."""
    out = jnp.einsum("BSE,EF->BSF", x, w)
    return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, OUT_SPEC))


def compiled_matmul(matmul, mesh, shape, dtype=jnp.bfloat16):
    """The compiled program of matmul(x, w, mesh) for shape (B, S, E, F) over mesh:
    x and w as shapes only, in the model's layout, so a chip this machine lacks
    can be the target (mesh over compile-only devices, sessions/plan/programs.py)."""
    B, S, E, F = shape
    x = jax.ShapeDtypeStruct((B, S, E), dtype, sharding=NamedSharding(mesh, X_SPEC))
    w = jax.ShapeDtypeStruct((E, F), dtype, sharding=NamedSharding(mesh, W_SPEC))
    with jax.set_mesh(mesh):
        return jax.jit(lambda x, w: matmul(x, w, mesh)).lower(x, w).compile()

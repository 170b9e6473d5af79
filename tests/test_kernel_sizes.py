"""Our decode kernels loop over their tiles in the kernel, not in Python: each kernel's
Mosaic GPU module, as lowered for an H100 (nothing compiled), has as many operations at
E = 2,048 as at E = 1,024, and the attention kernel's as many at T = 4,096 as at 2,048.
An unrolled loop grows with E (the head kernel at E = 2,048 once unrolled 32 tiles' steps
in Python) and with it Mosaic GPU's layout search and the compile time.

Why those sizes and not E = 128 or T = 256: a ring has no more slots than its tiles (at
E = 128 the head's ring holds 2 tiles, not 8), each slot a barrier the module sets up
one by one, and a loop that runs once (E = 128 is one chunk of 128) is lowered with no
loop at all. Both make the module smaller there (on JAX 0.10.2: the MLP 6,921 operations
against 6,939, the attention 13,037 against 13,047), by a fixed few, not by tiles.
From E = 1,024 every ring is as deep as it will be (decode_grid.RINGS,
decode_mlp.mlp_rings) and every loop runs more than once, so the count must not move.

Constants are not counted: MLIR keeps one of each value, so the count of constants
changes with the shapes (a 128 that is also E) whatever the loops. JAX 0.12's Mosaic GPU
layout inference does not finish on these kernels (it searches for minutes or gives
up: docs/results.md, "Decode kernels' compile time"), so there the test is skipped.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax._src.pallas.mosaic_gpu import lowering

from sessions.inference import kernel_step
from sessions.kernels import decode_attention, decode_grid, decode_head, decode_mlp
from sessions.model.config import ModelConfig

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 12),
    reason="JAX 0.12's Mosaic GPU layout inference does not finish on these kernels",
)
BASE = ModelConfig(
    vocab=256, embed=1024, ff=1024, heads=2, head_dim=64, layers=1, seq=2048, dtype="bfloat16"
)
sds, bf16, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32
CONSTANTS = ("arith.constant", "llvm.mlir.constant")


def operations(op):
    """Operations in op and every region inside it, constants aside."""
    inner = (o.operation for r in op.regions for b in r.blocks for o in b.operations)
    return (op.name not in CONSTANTS) + sum(operations(o) for o in inner)


def lowered_size(monkeypatch, program, *args):
    """Operations in the Mosaic GPU module of the one kernel `program` holds, lowered for
    a GPU from shapes (jax.jit(...).trace(...).lower(lowering_platforms=("cuda",)))."""
    sizes, real = [], lowering.lower_jaxpr_to_module

    def counted(*a, **k):
        result = real(*a, **k)
        sizes.append(operations(result.module.operation))
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_module", counted)
    jax.jit(program).trace(*args).lower(lowering_platforms=("cuda",))
    (size,) = sizes
    return size


def mlp_size(monkeypatch, cfg, B=1):
    """The MLP kernel after an attention kernel: its partials weighed by their stats."""
    E, F, P, S = cfg.embed, cfg.ff, decode_grid.partials(cfg), decode_grid.slices(cfg)
    layer = {"w_in": sds((F, E), bf16), "w_out": sds((E, F), bf16), "mlp_norm": sds((E,), bf16)}

    def mlp(layer, x, pending, stats):
        return decode_mlp.mlp_layer(layer, x, pending, cfg, stats=stats, slices=S, interpret=False)

    args = layer, sds((B, E), bf16), sds((P, B, E), f32), sds((P, 2, 8), f32)
    return lowered_size(monkeypatch, mlp, *args)


def head_size(monkeypatch, cfg, B=1):
    """The head kernel with its ring held at 8 slots: it takes as many as SMEM holds (14 at
    E 2,048, 16 at 1,024: decode_head.head_rings, tests/test_decode_grid.py), each a barrier
    set up on its own, a size that follows the ring, not the tiles."""
    E, V, P = cfg.embed, cfg.vocab, cfg.ff // 64
    monkeypatch.setattr(decode_head, "head_rings", lambda cfg, P: (4, 8))
    w = {"embed": sds((V, E), bf16), "final_norm": sds((E,), bf16)}

    def head(w, x, pending, held):
        where = kernel_step.clock(3, True)
        return decode_head.head(w, x, pending, held, where, cfg, interpret=False)

    args = w, sds((B, E), bf16), sds((P, B, E), f32), sds((B, V), f32)
    return lowered_size(monkeypatch, head, *args)


def attention_size(monkeypatch, cfg, B=1):
    E, H, K, D, T = cfg.embed, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    layer = {"wq": sds((H, D, E), bf16), "wk": sds((K, D, E), bf16), "wv": sds((K, D, E), bf16)}
    layer |= {"wo": sds((E, H, D), bf16), "attn_norm": sds((E,), bf16)}
    cache = {"k": sds((B, K, D, T), bf16), "v": sds((B, K, T, D), bf16)}

    def attention(layer, cache, x, pending):
        where = kernel_step.clock(7, True)
        return decode_attention.attention_layer(
            layer, cache, x, pending, where, cfg, interpret=False
        )

    args = layer, cache, sds((B, E), bf16), sds((cfg.ff // 64, B, E), f32)
    return lowered_size(monkeypatch, attention, *args)


@pytest.mark.parametrize(
    "size", [mlp_size, head_size, attention_size], ids=["mlp", "head", "attention"]
)
def test_a_kernel_is_as_large_at_e_2048_as_at_1024(size, monkeypatch):
    wide = dataclasses.replace(BASE, embed=2048)
    small, large = size(monkeypatch, BASE), size(monkeypatch, wide)
    assert small == large, f"{small} operations at E 1,024, {large} at E 2,048: a loop unrolled"


def test_the_attention_kernel_is_as_large_at_t_4096_as_at_2048(monkeypatch):
    small = attention_size(monkeypatch, BASE)
    large = attention_size(monkeypatch, dataclasses.replace(BASE, seq=4096))
    assert small == large, f"{small} operations at T 2,048, {large} at T 4,096: a loop unrolled"

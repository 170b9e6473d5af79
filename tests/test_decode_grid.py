"""The decode kernels' bytes in flight (sessions/kernels/decode_grid.py, decode_mlp.py), held
to the grid and rings the kernels are actually called with: each kernel traced (shapes only,
nothing compiled) with plgpu.SMEM, plgpu.Mesh and mosaic.kernel watched."""

import jax
import jax.numpy as jnp
import pytest
from helpers import BIG
from helpers import GPT2_BF16 as GPT2
from jax.experimental.pallas import mosaic_gpu as plgpu

from sessions.inference import kernel_step
from sessions.kernels import decode_attention, decode_grid, decode_head, decode_mlp, mosaic


def watched(monkeypatch):
    """A dict that collects each plgpu.SMEM's (shape, bytes an element), each plgpu.Mesh's grid
    and each mosaic.kernel's grid and scratch, as a kernel is traced."""
    seen = {"smem": [], "grid": []}
    real_smem, real_mesh, real_kernel = plgpu.SMEM, plgpu.Mesh, mosaic.kernel

    def smem(shape, dtype, **kwargs):
        seen["smem"].append((tuple(shape), jnp.dtype(dtype).itemsize))
        return real_smem(shape, dtype, **kwargs)

    def mesh(**kwargs):
        seen["grid"].append(tuple(kwargs["grid"]))
        return real_mesh(**kwargs)

    def kernel(body, **kwargs):
        seen["grid"].append(tuple(kwargs["grid"]))
        return real_kernel(body, **kwargs)

    monkeypatch.setattr(plgpu, "SMEM", smem)
    monkeypatch.setattr(plgpu, "Mesh", mesh)
    monkeypatch.setattr(mosaic, "kernel", kernel)
    return seen


def shapes(cfg, batch):
    """A layer's weights in the decode layout, its cache, x and the MLP's pending partials."""
    E, F, H, K, D, T = cfg.embed, cfg.ff, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq
    bf16, f32 = jnp.bfloat16, jnp.float32
    sds = jax.ShapeDtypeStruct
    layer = {"wq": sds((H, D, E), bf16), "wk": sds((K, D, E), bf16), "wv": sds((K, D, E), bf16)}
    layer |= {"wo": sds((E, H, D), bf16), "attn_norm": sds((E,), bf16), "mlp_norm": sds((E,), bf16)}
    layer |= {"w_in": sds((F, E), bf16), "w_out": sds((E, F), bf16)}
    cache = {"k": sds((batch, K, D, T), bf16), "v": sds((batch, K, T, D), bf16)}
    return layer, cache, sds((batch, E), bf16), sds((F // 64, batch, E), f32)


@pytest.mark.parametrize("cfg", [GPT2, BIG], ids=["gpt2-bytes", "1.2B"])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_attention_kernel_s_bytes_in_flight_are_its_grid_times_its_rings(
    cfg, batch, monkeypatch
):
    seen = watched(monkeypatch)
    layer, cache, x, pending = shapes(cfg, batch)

    def half(layer, cache, x, pending):
        return decode_attention.attention_layer(
            layer, cache, x, pending, kernel_step.clock(7, True), cfg, interpret=False
        )

    jax.eval_shape(half, layer, cache, x, pending)
    (grid,) = seen["grid"]
    # The kernel's scratch, in the order it builds it: xn, cos/sin, the weights' ring
    # [W, 64, 64], the cache's k ring [C, D, 64] and v ring [C, 64, D].
    (w, *weight_tile), w_bytes = seen["smem"][2]
    (c, *k_tile), k_bytes = seen["smem"][3]
    (_, *v_tile), v_bytes = seen["smem"][4]
    assert weight_tile == [64, 64] and k_tile == [cfg.head_dim, 64] and v_tile == k_tile[::-1]
    weights, cache_tiles = w * 64 * 64 * w_bytes, c * 64 * cfg.head_dim * (k_bytes + v_bytes)
    assert grid == (cfg.n_kv_heads, decode_grid.slices(cfg))
    in_flight = grid[0] * grid[1] * min(weights, cache_tiles)
    assert decode_grid.attention_bytes_in_flight(cfg, batch) == in_flight
    assert in_flight >= decode_grid.IN_FLIGHT_NEED  # Little's law, on an H100 (predicted)


@pytest.mark.parametrize("cfg", [GPT2, BIG], ids=["gpt2-bytes", "1.2B"])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_mlp_kernel_s_bytes_in_flight_are_its_grid_times_its_ring(cfg, batch, monkeypatch):
    seen = watched(monkeypatch)
    layer, _, x, _ = shapes(cfg, batch)
    P = decode_grid.partials(cfg)  # the attention kernel's, with their stats
    pending = jax.ShapeDtypeStruct((P, batch, cfg.embed), jnp.float32)
    stats = jax.ShapeDtypeStruct((P, 2, 8), jnp.float32)
    slices = decode_grid.slices(cfg)

    def half(layer, x, pending, stats):
        return decode_mlp.mlp_layer(
            layer, x, pending, cfg, stats=stats, slices=slices, interpret=False
        )

    jax.eval_shape(half, layer, x, pending, stats)
    (grid,) = seen["grid"]
    (slots, *tile), itemsize = seen["smem"][0]  # the weights' ring comes first
    assert grid == (cfg.ff // 64,) and tile == [64, 64]
    in_flight = grid[0] * slots * 64 * 64 * itemsize
    assert decode_mlp.mlp_bytes_in_flight(cfg, batch) == in_flight
    assert in_flight >= decode_grid.IN_FLIGHT_NEED


@pytest.mark.parametrize("cfg, tiles", [(GPT2, 12), (BIG, 14)], ids=["gpt2", "1.2B"])
def test_the_head_kernel_s_bytes_in_flight_are_its_grid_times_its_ring(cfg, tiles, monkeypatch):
    """The head (decode_head.py): V/64 CTAs, each a ring of table tiles, as many as SMEM holds.
    By hand, of the 200 KB planned: the tokens x, their norm and the scale (34·E bytes), 4
    pending chunks of [8, 128] float32 (16 KB), 128 B of stats and barriers, the logits'
    stage (2 KB). GPT-2 (E 768): 156 KB left, room for all its 12 tiles a row block: the
    whole table, 393 KB, in flight at once. The 1.2B (E 2048): 114 KB left, 14 of its 32.
    Either way far under Little's law's 2.3 MB: the bytes' vocabulary makes it 4 CTAs."""
    seen = watched(monkeypatch)
    E, V, P = cfg.embed, cfg.vocab, cfg.ff // 64  # after the last MLP kernel's partials
    sds = jax.ShapeDtypeStruct
    w = {"embed": sds((V, E), jnp.bfloat16), "final_norm": sds((E,), jnp.bfloat16)}
    x, pending = sds((1, E), jnp.bfloat16), sds((P, 1, E), jnp.float32)
    held = sds((1, V), jnp.float32)

    def head(w, x, pending, held):
        where = kernel_step.clock(3, True)
        return decode_head.head(w, x, pending, held, where, cfg, interpret=False)

    jax.eval_shape(head, w, x, pending, held)
    (grid,) = seen["grid"]
    (slots, *tile), itemsize = seen["smem"][0]  # the table's ring comes first
    assert grid == (V // 64,) and tile == [64, 64] and slots == tiles
    in_flight = grid[0] * slots * 64 * 64 * itemsize
    assert decode_head.head_bytes_in_flight(cfg) == in_flight == 4 * tiles * 8192
    share = decode_head.head_share_of_need(cfg)
    assert share == pytest.approx(in_flight / decode_grid.IN_FLIGHT_NEED) and share < 0.2

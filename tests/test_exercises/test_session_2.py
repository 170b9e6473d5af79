"""Session 2: attention by hand, positions, jit, overlapped loading, multichip, FLOPs,
and the arithmetic intensity that says whether a step is compute- or memory-bound."""

import dataclasses
import math
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise
from jax.sharding import NamedSharding

from roofline.hardware import CHIPS
from sessions.model import init_params
from sessions.model.attention import attention
from sessions.model.config import ModelConfig
from sessions.shard.sharding import make_mesh

from .deadlines import take, wait_until
from .expect import expect

one_query = exercise("attention.one_query")
packed_attention = exercise("attention.packed_attention")
last_output_change = exercise("positions.last_output_change")
unfused_bytes = exercise("jit_fusion.unfused_bytes")
fused_bytes = exercise("jit_fusion.fused_bytes")
predicted_speedup = exercise("jit_fusion.predicted_speedup")
measure_speedup = exercise("jit_fusion.measure_speedup")
prefetch = exercise("prefetch.prefetch")
param_shapes = exercise("sharding.param_shapes")
param_specs = exercise("sharding.param_specs")
init_sharded = exercise("sharding.init_sharded")
param_count = exercise("flops.param_count")
train_flops = exercise("flops.train_flops")
attention_flops = exercise("flops.attention_flops")
attention_share = exercise("flops.attention_share")
mfu = exercise("flops.mfu")
chain_flops = exercise("intensity.chain_flops")
chain_bytes = exercise("intensity.chain_bytes")
chain_intensity = exercise("intensity.chain_intensity")
bound = exercise("intensity.bound")

B, S, H, D = 2, 6, 3, 8  # sizes that differ pairwise: a swapped axis cannot pass


def qkv(key=0, S=S):
    k = jax.random.split(jax.random.key(key), 3)
    return [jax.random.normal(k[i], (B, S, H, D)) for i in range(3)]


# Attention by hand.


@pytest.mark.exercise("attention.one_query")
def test_one_query_by_hand_matches_the_models_attention():
    q, k, v = qkv()
    expected = attention(q, k, v)  # [B, S, H, D]
    for b in range(B):
        for h in range(H):
            for s in range(S):
                got = one_query(q[b, s, h], k[b, :, h], v[b, :, h], s)
                np.testing.assert_allclose(
                    got, expected[b, s, h], atol=1e-5, err_msg=f"query b={b} h={h} s={s}"
                )


@pytest.mark.exercise("attention.one_query")
def test_one_query_ignores_later_keys_and_values():
    q, k, v = qkv()
    s = 2
    k2, v2 = k[0, :, 0].at[s + 1 :].set(100.0), v[0, :, 0].at[s + 1 :].set(-100.0)
    np.testing.assert_allclose(
        one_query(q[0, s, 0], k2, v2, s),
        one_query(q[0, s, 0], k[0, :, 0], v[0, :, 0], s),
        atol=1e-6,
        err_msg="the output at s changed when keys and values after s changed",
    )


SEGMENTS = jnp.array([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]])  # row 0: three documents


@pytest.mark.exercise("attention.packed_attention")
def test_packed_attention_matches_the_models_attention():
    q, k, v = qkv()
    np.testing.assert_allclose(
        packed_attention(q, k, v, SEGMENTS),
        attention(q, k, v, SEGMENTS),
        atol=1e-5,
        err_msg="differs from sessions.model.attention.attention with segment_ids",
    )


@pytest.mark.exercise("attention.packed_attention")
def test_each_packed_document_is_attended_to_alone():
    """Segment isolation: each document's outputs equal attention over it alone."""
    q, k, v = qkv()
    out = packed_attention(q, k, v, SEGMENTS)
    for start, stop in [(0, 3), (3, 5), (5, 6)]:
        part = slice(start, stop)
        alone = attention(q[:1, part], k[:1, part], v[:1, part])
        np.testing.assert_allclose(
            out[:1, part],
            alone,
            atol=1e-5,
            err_msg=f"tokens {start}..{stop - 1} saw another segment",
        )


# Positions.


def one_layer(positions):
    return ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=1, seq=16, positions=positions)


DISTINCT = jnp.array([[3, 14, 15, 92, 65, 35, 89, 79], [27, 18, 28, 182, 84, 59, 4, 52]])


@pytest.mark.exercise("positions.last_output_change")
def test_without_positions_the_last_output_ignores_the_order_of_earlier_tokens(key):
    cfg = one_layer(positions=False)
    change = last_output_change(init_params(cfg, key), DISTINCT, cfg, jax.random.key(3))
    expect(change, below=1e-4, what="without positions, how far the last logits moved")


@pytest.mark.exercise("positions.last_output_change")
def test_positions_make_the_order_matter(key):
    cfg = one_layer(positions=True)
    params = init_params(cfg, key)
    params["pos"] = params["pos"] * 100  # unit scale, as after some training
    change = last_output_change(params, DISTINCT, cfg, jax.random.key(3))
    expect(change, above=1e-2, what="with positions, how far the last logits moved")


# Jit.


@pytest.mark.exercise("jit_fusion.unfused_bytes")
def test_unfused_bytes_by_hand():
    # A [4, 2], B [2, 3]: 8 + 6 read, C 12 written, read, out 12 written: 50 floats.
    expect(unfused_bytes(4, 2, 3, 4), 50 * 4, "bytes", "M=4, K=2, N=3, float32")
    expect(
        unfused_bytes(1024, 16, 1024, 2),
        2 * (2 * 16 * 1024 + 3 * 1024 * 1024),
        "bytes",
        "M=1024, K=16, N=1024, bfloat16",
    )


@pytest.mark.exercise("jit_fusion.fused_bytes")
def test_fused_bytes_by_hand():
    # A and B read, the output written: 8 + 6 + 12 = 26 floats.
    expect(fused_bytes(4, 2, 3, 4), 26 * 4, "bytes", "M=4, K=2, N=3, float32")
    expect(
        fused_bytes(1024, 16, 1024, 2),
        2 * (2 * 16 * 1024 + 1024 * 1024),
        "bytes",
        "M=1024, K=16, N=1024, bfloat16",
    )


@pytest.mark.exercise("jit_fusion.predicted_speedup")
def test_predicted_speedup_is_the_ratio_of_bytes():
    expect(predicted_speedup(4, 2, 3, 4), pytest.approx(50 / 26), "x", "M=4, K=2, N=3, float32")
    expect(
        predicted_speedup(2048, 8, 2048),
        pytest.approx((32768 + 3 * 2048**2) / (32768 + 2048**2)),
        "x",
        "M=2048, K=8, N=2048",
    )
    expect(predicted_speedup(4096, 4, 4096), above=2.9, below=3, unit="x", what="K small: nearly 3")


@pytest.mark.exercise("jit_fusion.measure_speedup")
def test_measure_speedup_runs_and_reports_consistent_numbers(record_property):
    """Timings are reported, never asserted against a threshold."""
    M, K, N = 1024, 16, 1024
    result = measure_speedup(M, K, N, repeats=3)
    assert set(result) >= {"op_by_op_s", "jit_s", "speedup"}, f"keys: {sorted(result)}"
    times = {k: result[k] for k in ("op_by_op_s", "jit_s")}
    assert all(math.isfinite(s) and s > 0 for s in times.values()), f"not times: {times}"
    expect(
        result["speedup"],
        pytest.approx(result["op_by_op_s"] / result["jit_s"]),
        "x",
        "speedup: op_by_op_s / jit_s",
    )
    record_property(
        "measured",
        f"relu(A@B) {M}x{K}x{N}: op by op {result['op_by_op_s'] * 1e3:.2f} ms, "
        f"jit {result['jit_s'] * 1e3:.2f} ms, {result['speedup']:.1f}x "
        f"(bytes predict {(M * K + K * N + 3 * M * N) / (M * K + K * N + M * N):.1f}x)",
    )


# Overlapped loading.


@pytest.mark.exercise("prefetch.prefetch")
def test_prefetch_yields_every_batch_in_order():
    squares = ([s * s for s in range(10)], None)
    what = "(batches, error) of 10 steps, depth 3"
    expect(take(prefetch(lambda step: step * step, 10, 3)), squares, "", what)
    expect(take(prefetch(lambda step: step, 0, 2)), ([], None), "", "(batches, error) of 0 steps")


@pytest.mark.exercise("prefetch.prefetch")
def test_prefetch_runs_ahead_by_depth_on_another_thread_and_no_further():
    made, threads, depth = [], set(), 3

    def make_batch(step):
        made.append(step)
        threads.add(threading.get_ident())
        return step

    batches = prefetch(make_batch, 20, depth)
    expect(take(batches, 1), ([0], None), "", "(batches, error): the first one")
    # The consumer holds batch 0; a prefetcher fills its `depth` places meanwhile.
    wait_until(lambda: len(made) >= 1 + depth, f"only {len(made)} batches were made ahead")
    time.sleep(0.1)  # give a runaway thread the chance to overrun
    assert len(made) <= 1 + depth + 1, f"{len(made)} batches made with 1 taken, depth {depth}"
    assert threading.get_ident() not in threads, "batches were made on the consumer's thread"
    expect(take(batches), (list(range(1, 20)), None), "", "(batches, error): the other 19")


@pytest.mark.exercise("prefetch.prefetch")
def test_prefetch_raises_the_loaders_error_to_the_consumer():
    def make_batch(step):
        if step == 2:
            raise ValueError("disk on fire")
        return step

    taken, error = take(prefetch(make_batch, 5, 2))
    assert taken == [0, 1], f"took {taken} before the error"
    assert isinstance(error, ValueError) and "disk on fire" in str(error), f"raised {error!r}"


# Multichip.

# H = 4 so that heads divide over tp = 4; the other sizes still differ pairwise.
MESH_CFG = ModelConfig(embed=24, ff=40, heads=4, head_dim=8, layers=2, seq=16)
MATMUL_WEIGHTS = {"embed", "wq", "wk", "wv", "wo", "w_in", "w_out"}


def mesh_2x4():
    return make_mesh({"data": 1, "fsdp": 2, "tp": 4}, jax.devices()[:8])


def named_leaves(tree):
    flat = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )[0]
    return [(jax.tree_util.keystr(path), path[-1].key, leaf) for path, leaf in flat]


@pytest.mark.exercise("sharding.param_shapes")
def test_param_shapes_are_shape_dtype_structs_of_the_params(key):
    shapes = param_shapes(MESH_CFG)
    params = init_params(MESH_CFG, key)
    assert jax.tree.structure(shapes) == jax.tree.structure(params), (
        f"not the params' tree: {jax.tree.structure(shapes)}"
    )
    for (name, _, s), x in zip(named_leaves(shapes), jax.tree.leaves(params)):
        assert isinstance(s, jax.ShapeDtypeStruct), f"{name} is a {type(s).__name__}"
        assert (s.shape, s.dtype) == (x.shape, x.dtype), (
            f"{name}: yours {s.shape} {s.dtype}, expected {x.shape} {x.dtype}"
        )


@pytest.mark.exercise("sharding.param_specs")
def test_param_specs_split_every_matmul_weight_eight_ways(key):
    shapes = jax.eval_shape(lambda: init_params(MESH_CFG, key))
    specs = param_specs(shapes)
    mesh = mesh_2x4()
    flat_specs = named_leaves(specs)
    assert len(flat_specs) == len(jax.tree.leaves(shapes)), "one PartitionSpec per weight"
    for (name, weight, spec), s in zip(flat_specs, jax.tree.leaves(shapes)):
        assert isinstance(spec, jax.sharding.PartitionSpec), f"{name}: {spec!r}"
        shard = NamedSharding(mesh, spec).shard_shape(s.shape)  # raises if it does not divide
        if weight in MATMUL_WEIGHTS:
            assert math.prod(shard) * 8 == math.prod(s.shape), (
                f"{name} {s.shape} -> {shard} per device with {spec}: not split over fsdp x tp"
            )


@pytest.mark.exercise("sharding.init_sharded")
def test_init_sharded_builds_the_same_params_in_shards(key):
    mesh = mesh_2x4()
    params = init_sharded(MESH_CFG, key, mesh)
    expected = init_params(MESH_CFG, key)
    specs = named_leaves(param_specs(param_shapes(MESH_CFG)))
    for (name, _, spec), x, want in zip(specs, jax.tree.leaves(params), jax.tree.leaves(expected)):
        assert isinstance(x.sharding, NamedSharding), f"{name}: {x.sharding}"
        assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), (
            f"{name}: {x.sharding.spec}, expected {spec}"
        )
        np.testing.assert_allclose(x, want, atol=1e-6, err_msg=f"{name}: not init_params' values")


# Training FLOPs.


@pytest.mark.exercise("flops.param_count")
def test_param_count_counts_every_scalar(cfg, key):
    params = init_params(cfg, key)
    what = "E=24, F=40, H=3, D=8, L=2, S=16, V=256"
    expect(param_count(cfg), sum(x.size for x in jax.tree.leaves(params)), "params", what)
    # By hand for the fixture: embed V*E, pos S*E, final norm E, per layer 2 norms,
    # q k v o 4*E*H*D, MLP 2*E*F.
    E, F, HD, V, L, T = 24, 40, 24, 256, 2, 16
    by_hand = V * E + T * E + E + L * (2 * E + 4 * E * HD + 2 * E * F)
    expect(param_count(cfg), by_hand, "params", f"{what}, counted by hand")


@pytest.mark.exercise("flops.train_flops")
def test_train_flops_is_six_b_p(cfg):
    P = 256 * 24 + 16 * 24 + 24 + 2 * (2 * 24 + 4 * 24 * 24 + 2 * 24 * 40)
    expect(train_flops(cfg, 2), 6 * (2 * 16) * P, "FLOPs", f"6·B·P, B = 2·16 tokens, P = {P:,}")
    expect(train_flops(cfg, 4), 2 * train_flops(cfg, 2), "FLOPs", "batch 4: twice batch 2's")


@pytest.mark.exercise("flops.attention_flops")
def test_attention_flops_by_hand(cfg):
    # 2 layers x 2 matmuls x 2*B*S*S*H*D, times 3 for the backward pass.
    by_hand = 3 * 2 * 2 * (2 * 2 * 16 * 16 * 3 * 8)
    expect(attention_flops(cfg, 2), by_hand, "FLOPs", "L=2, batch 2, S=16, H=3, D=8")
    longer = attention_flops(dataclasses.replace(cfg, seq=32), 2)
    expect(longer, 4 * attention_flops(cfg, 2), "FLOPs", "S=32: four times S=16's (S²)")
    none = attention_flops(dataclasses.replace(cfg, attention=False), 2)
    expect(none, 0, "FLOPs", "a model without attention")


@pytest.mark.exercise("flops.attention_share")
def test_attention_share_by_hand_and_growing_with_seq(cfg):
    P = 256 * 24 + 16 * 24 + 24 + 2 * (2 * 24 + 4 * 24 * 24 + 2 * 24 * 40)
    attn = 3 * 2 * 2 * (2 * 2 * 16 * 16 * 3 * 8)
    share = pytest.approx(attn / (6 * 32 * P + attn))
    expect(attention_share(cfg, 2), share, "", "batch 2, S=16: attention / (6·B·P + attention)")
    longer = dataclasses.replace(cfg, seq=64)
    expect(attention_share(longer, 2), above=attention_share(cfg, 2), what="S=64 against S=16")


@pytest.mark.exercise("flops.mfu")
def test_mfu_by_hand():
    # 6e15 FLOPs in 2 s on 8 chips of 989 TFLOP/s (H100 SXM, bf16).
    expect(mfu(6e15, 2.0, 989e12, chips=8), pytest.approx(6e15 / 2 / (8 * 989e12)), "", "8 H100s")
    expect(mfu(1e12, 1.0, 1e12), pytest.approx(1.0), "", "1e12 FLOPs in 1 s at 1e12 FLOP/s")


# Arithmetic intensity of C @ relu(A @ B), attention-shaped.

H100 = CHIPS["h100-sxm"]  # bf16 989 TFLOP/s, 3.35 TB/s: ridge about 295 FLOPs per byte
CHAIN = 2048, 4096, 128  # queries S, keys T, head dim D: attention-like, S != T


@pytest.mark.exercise("intensity.chain_flops")
def test_chain_flops_by_hand():
    S, T, D = CHAIN
    expect(chain_flops(S, T, D), 4 * S * T * D, "FLOPs", f"S={S}, T={T}, D={D}")
    expect(chain_flops(1, 2, 3), 2 * 2 * 3 * 1 + 2 * 3 * 2 * 1, "FLOPs", "S=1, T=2, D=3")


@pytest.mark.exercise("intensity.chain_bytes")
def test_chain_bytes_by_hand():
    S, T, D = CHAIN
    inputs_and_output = T * D + D * S + D * T + D * S
    what = f"S={S}, T={T}, D={D}"
    expect(
        chain_bytes(S, T, D, 2, fused=True), 2 * inputs_and_output, "bytes", f"{what}, bf16, fused"
    )
    unfused = 2 * (inputs_and_output + 4 * S * T)
    expect(chain_bytes(S, T, D, 2, fused=False), unfused, "bytes", f"{what}, bf16, unfused")
    expect(
        chain_bytes(S, T, D, 4, fused=True), 4 * inputs_and_output, "bytes", f"{what}, f32, fused"
    )


@pytest.mark.exercise("intensity.chain_intensity")
def test_chain_intensity_by_hand():
    S, T, D = CHAIN
    what, unit = f"S={S}, T={T}, D={D}, bf16", "FLOPs/byte"
    fused = 4 * S * T * D / (2 * 2 * D * (S + T))  # ~ 1365
    expect(chain_intensity(S, T, D, 2, fused=True), pytest.approx(fused), unit, f"{what}, fused")
    unfused = 4 * S * T * D / (2 * (2 * D * (S + T) + 4 * S * T))  # ~ 61
    got = chain_intensity(S, T, D, 2, fused=False)
    expect(got, pytest.approx(unfused), unit, f"{what}, unfused")


@pytest.mark.exercise("intensity.bound")
def test_keeping_the_score_matrix_on_chip_crosses_the_ridge():
    """Op by op, attention is memory-bound on an H100; fused, compute-bound."""
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    ridge = peak / bandwidth
    expect(bound(61.0, peak, bandwidth), "memory", "", f"61 FLOPs/byte, ridge {ridge:.0f}")
    expect(bound(1365.0, peak, bandwidth), "compute", "", f"1365 FLOPs/byte, ridge {ridge:.0f}")
    # On the ridge: either, say compute.
    expect(bound(ridge, peak, bandwidth), "compute", "", "on the ridge")

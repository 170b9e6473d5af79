"""Session 5 (s5_serve), more users from the same memory: the KV cache's bytes
under grouped-query attention and how many sequences fit; RoPE's rotation and
why q·k then sees only the distance; int8 weights per output channel and their
error bound; the critical batch with int8 weights; whether a published model's
decode fits a chip; an int8 absmax-scaled sum.

Every expected number is worked out by hand in a comment or computed here
in float64 NumPy, never by the code under test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adapters import exercise

from .expect import expect

gqa_cache_bytes = exercise("decode_cost.gqa_cache_bytes")
sequences_that_fit = exercise("decode_cost.sequences_that_fit")
int8_weight_bytes = exercise("decode_cost.int8_weight_bytes")
critical_batch_int8 = exercise("decode_cost.critical_batch_int8")
published_params = exercise("decode_cost.published_params")
decode_fits = exercise("decode_cost.decode_fits")
rotary_angles = exercise("rotary.rotary_angles")
rotate = exercise("rotary.rotate")
rotated_score = exercise("rotary.rotated_score")
quantize_per_channel = exercise("quantize.quantize_per_channel")
int8_matvec = exercise("quantize.int8_matvec")
matvec_error_bound = exercise("quantize.matvec_error_bound")
rounding_errors = exercise("quantize.rounding_errors")
quantize_absmax = exercise("int8_numerics.quantize_absmax")
int8_sum = exercise("int8_numerics.int8_sum")
int8_sum_error_bound = exercise("int8_numerics.int8_sum_error_bound")

# LLaMA-3-8B by hand, from Meta's config.json (the numbers are written again here,
# not read from the module under test): L=32, E=4096, F=14336, H=32, K=8, D=128,
# V=128256, untied, gated. Its H100-SXM: "80GB", 3.35 TB/s, 989 TFLOP/s bf16 dense
# (NVIDIA's H100 datasheet); NVIDIA's 80GB is 80 GiB, 85,899,345,920 bytes (nvidia-smi
# on one read 81,559 MiB, past 80e9 bytes: docs/h100-run-2/nvidia-smi.csv).
LLAMA3_8B = {
    "layers": 32,
    "embed": 4096,
    "ff": 14336,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 128256,
    "seq": 8192,
}
HBM, BW, PEAK = 80 * 2**30, 3.35e12, 989e12
# Per layer: wq and wo 4096·4096 each, wk and wv 4096·1024 each, three 4096·14336:
# 2·16,777,216 + 2·4,194,304 + 3·58,720,256 = 218,103,808; norms 2·4096.
# 32 layers: 6,979,321,856 matmul weights + 262,144 norm scales; the embedding and the
# output projection 128,256·4096 = 525,336,576 each; the final norm 4096.
PARAMS = 8_030_261_248  # 6,979,321,856 + 262,144 + 2·525,336,576 + 4096
WEIGHTS_BF16 = 2 * PARAMS  # 16,060,522,496 bytes held
CACHE_8192 = 2**30  # one sequence at T=8192: 2·32·8192·8·128·2 = 2^(1+5+13+3+7+1) bytes


# The KV cache under grouped-query attention, and what fits.


@pytest.mark.exercise("decode_cost.gqa_cache_bytes")
def test_gqa_cache_bytes_by_hand():
    llama = "LLaMA-3-8B, B=1, T=8192"
    got = gqa_cache_bytes(32, 1, 8192, 32, 8, 128, 2)
    expect(got, CACHE_8192, "bytes", f"{llama}, K=8 of H=32")  # 1.07 GB
    got = gqa_cache_bytes(32, 1, 8192, 32, 32, 128, 2)
    expect(got, 4 * CACHE_8192, "bytes", f"{llama}, K = H = 32")  # 4.29 GB
    got = gqa_cache_bytes(32, 1, 8192, 32, 1, 128, 2)
    expect(got, CACHE_8192 // 8, "bytes", f"{llama}, multi-query K=1")
    # The query heads do not count, only K ...
    got = gqa_cache_bytes(32, 1, 8192, 64, 8, 128, 2)
    expect(got, CACHE_8192, "bytes", f"{llama}, K=8 of H=64: H does not count")
    # ... and sizes that differ pairwise make each factor count once.
    got = gqa_cache_bytes(2, 3, 5, 14, 7, 11, 4)
    expect(got, 2 * 2 * 3 * 5 * 7 * 11 * 4, "bytes", "L=2, B=3, T=5, H=14, K=7, D=11, 4 bytes")


@pytest.mark.exercise("decode_cost.gqa_cache_bytes")
@pytest.mark.parametrize("kv_heads", [5, 64], ids=["5 of 32", "64 of 32"])
def test_gqa_cache_bytes_refuses_a_k_that_does_not_divide_h(kv_heads):
    with pytest.raises(ValueError):
        gqa_cache_bytes(32, 1, 8192, 32, kv_heads, 128, 2)


@pytest.mark.exercise("decode_cost.sequences_that_fit")
def test_sequences_that_fit_by_hand(record_property):
    # 85,899,345,920 - 16,060,522,496 = 69,838,823,424 bytes left for caches: 65.04
    # caches of 2^30 bytes, 16.26 of 2^32 (K = H), 520.34 of 2^27 (K = 1).
    fit = {k: sequences_that_fit(HBM, WEIGHTS_BF16, CACHE_8192 * k // 8) for k in (32, 8, 1)}
    llama = "LLaMA-3-8B bf16 on 80 GiB, T=8192"
    expect(fit[8], 65, "sequences", f"{llama}, K=8: 65.04 caches' room")  # 65·2^30 <= left
    expect(fit[32], 16, "sequences", f"{llama}, K = H = 32: 16.26 caches' room")
    expect(fit[1], 520, "sequences", f"{llama}, multi-query: 520.34 caches' room")
    expect(sequences_that_fit(10, 4, 2), 3, "sequences", "HBM 10, weights 4, caches of 2: full")
    got = sequences_that_fit(HBM, 141e9, 1)
    expect(got, 0, "sequences", "a 70B model's bf16 weights on 80 GiB: none")
    expect(sequences_that_fit(HBM, HBM, 1), 0, "sequences", "weights that fill the chip")
    record_property(
        "measured",
        "LLaMA-3-8B's bf16 weights on 80 GiB, T=8192: "
        + ", ".join(f"K={k}: {n} sequences" for k, n in fit.items()),
    )


# int8 weights and the critical batch.

# LLaMA-3-8B's decode step reads every matmul weight (the untied output projection
# [128256, 4096] among them; the embedding is a lookup of B rows) and the norms.
MATMULS = 32 * [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096)]
MATMULS += 32 * [(14336, 4096), (14336, 4096), (4096, 14336)] + [(128256, 4096)]
NORMS = 32 * 2 * 4096 + 4096  # 266,240
# 6,979,321,856 + 525,336,576 = 7,504,658,432 int8 values; output channels per layer
# 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096 = 43,008, so 32·43,008 + 128,256 =
# 1,504,512 scales of 4 bytes; the norms in bf16.
W8 = 7_504_658_432 + 4 * 1_504_512 + 2 * NORMS  # 7,511,208,960 bytes
W16 = 2 * (7_504_658_432 + NORMS)  # 15,009,849,344 bytes


@pytest.mark.exercise("decode_cost.int8_weight_bytes")
def test_int8_weight_bytes_by_hand():
    # The scales count per output row: 3 of them for a [3, 5] weight.
    expect(int8_weight_bytes([(3, 5)], 0), 15 + 4 * 3, "bytes", "one [out=3, in=5] weight")
    got = int8_weight_bytes([(3, 5), (7, 2)], 11)
    expect(got, 27 + (14 + 28) + 22, "bytes", "[3, 5] and [7, 2], 11 bf16 others")
    got = int8_weight_bytes([(3, 5)], 11, other_bytes=4)
    expect(got, 27 + 44, "bytes", "[3, 5], 11 float32 others")
    assert W8 == 7_511_208_960, "the test's own count"
    expect(int8_weight_bytes(MATMULS, NORMS), W8, "bytes", "LLaMA-3-8B's matmuls and norms")


@pytest.mark.exercise("decode_cost.critical_batch_int8")
def test_critical_batch_int8_by_hand():
    # One [1000, 1000] weight: 2 MB in bf16, 1,004,000 bytes in int8. f = 2e6 FLOPs
    # on 1e12 FLOP/s is 2 µs a sequence; 1e9 B/s reads bf16's weights in 2 ms.
    one = [(1000, 1000)]
    unit, what = "sequences", "(bf16, int8), one [1000, 1000] weight"
    # 2e-3 / 2e-6; 1.004e-3 / 2e-6.
    got = critical_batch_int8(one, 0, 0, 2e6, 1e12, 1e9)
    expect(got, pytest.approx((1000, 502)), unit, f"{what}, no cache")
    # A cache of 1000 bytes a sequence takes 1 µs to read: the margin halves.
    got = critical_batch_int8(one, 0, 1000, 2e6, 1e12, 1e9)
    expect(got, pytest.approx((2000, 1004)), unit, f"{what}, 1 µs of cache")
    # A cache that takes as long to read as its FLOPs to do: never compute-bound.
    got = critical_batch_int8(one, 0, 2000, 2e6, 1e12, 1e9)
    expect(got, (None, None), unit, f"{what}, 2 µs of cache, as long as the FLOPs")
    got = critical_batch_int8(one, 0, 3000, 2e6, 1e12, 1e9)
    expect(got, (None, None), unit, f"{what}, 3 µs of cache, longer than the FLOPs")


@pytest.mark.exercise("decode_cost.critical_batch_int8")
def test_critical_batch_of_llama3_8b_on_an_h100(record_property):
    """At T=256 (a cache of 33,554,432 bytes a sequence, f = 2·7,504,658,432 +
    4·32·256·32·128 = 15,143,534,592 FLOPs): B* about 846 in bf16, 423 in int8,
    their ratio W8 / W16 = 0.5004. At T=8192 the cache's 320 µs per sequence
    outweighs its 20 µs of FLOPs: no batch is compute-bound."""
    cache, flops = 2 * 32 * 256 * 8 * 128 * 2, 2 * 7_504_658_432 + 4 * 32 * 256 * 32 * 128
    margin = np.float64(flops) / PEAK - np.float64(cache) / BW
    bf16, int8 = critical_batch_int8(MATMULS, NORMS, cache, flops, PEAK, BW)
    unit, what = "sequences", "LLaMA-3-8B, T=256, H100"
    expect(bf16, pytest.approx(W16 / BW / margin, rel=1e-9), unit, f"{what}, bf16")
    expect(int8, pytest.approx(W8 / BW / margin, rel=1e-9), unit, f"{what}, int8")
    expect((bf16, int8), pytest.approx((846.07, 423.39), abs=0.01), unit, f"{what}, (bf16, int8)")
    # Only W moved.
    expect(int8 / bf16, pytest.approx(W8 / W16, rel=1e-9), "", f"{what}: int8's B* / bf16's")
    cache, flops = CACHE_8192, 2 * 7_504_658_432 + 4 * 32 * 8192 * 32 * 128
    got = critical_batch_int8(MATMULS, NORMS, cache, flops, PEAK, BW)
    expect(got, (None, None), unit, "LLaMA-3-8B, T=8192, H100: the cache outweighs the FLOPs")
    record_property(
        "measured", f"LLaMA-3-8B, T=256, H100: B* {bf16:.0f} in bf16, {int8:.0f} in int8"
    )


# A published model against a chip.


@pytest.mark.exercise("decode_cost.published_params")
def test_published_params_by_hand():
    expect(published_params(LLAMA3_8B), PARAMS, "params", "LLaMA-3-8B: 8.03 billion")
    # LLaMA-2-7B (its config.json: 32 layers, 4096, 11008, 32 heads, 32 KV heads,
    # vocab 32000): 32·(4·4096² + 3·4096·11008 + 2·4096) + 2·32000·4096 + 4096.
    llama2_7b = dict(LLAMA3_8B, ff=11008, kv_heads=32, vocab=32000, seq=4096)
    expect(published_params(llama2_7b), 6_738_415_616, "params", "LLaMA-2-7B: 6.74 billion")
    # Sizes that differ pairwise: per layer 2·3·4·7 + 2·3·2·7 + 3·3·5 + 2·3 = 303;
    # two layers, an embedding and an output projection of 11·3, a final norm of 3.
    toy = {
        "layers": 2,
        "embed": 3,
        "ff": 5,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 7,
        "vocab": 11,
        "seq": 9,
    }
    what = "a toy: L=2, E=3, F=5, H=4, K=2, D=7, V=11"
    expect(published_params(toy), 2 * 303 + 2 * 11 * 3 + 3, "params", what)  # 675


@pytest.mark.exercise("decode_cost.decode_fits")
def test_decode_fits_by_hand(record_property):
    """An H100's "80GB" is 80 GiB, 80·2^30 = 85,899,345,920 bytes; what is needed is
    printed in GB of 10^9 bytes. LLaMA-3-8B in bf16 holds 16,060,522,496 bytes of
    weights and 1,073,741,824 (2^30) of cache a sequence at T=8192:
      59 sequences: 16,060,522,496 + 63,350,767,616 = 79,411,290,112 bytes: fits
      60 sequences: 16,060,522,496 + 64,424,509,440 = 80,485,031,936 bytes: fits
         80 GiB, not 80e9 (the chip read as 80 GB of 10^9 bytes)
      65 sequences: 16,060,522,496 + 69,793,218,560 = 85,853,741,056 bytes: fits
      66 sequences: 16,060,522,496 + 70,866,960,384 = 86,927,482,880 bytes: does not
    Without GQA (K = H = 32) wk and wv grow by 32·2·4096·3072 = 805,306,368
    parameters, 17,671,135,232 bytes in all, and each cache is 4·2^30 bytes:
      15 sequences: 17,671,135,232 + 64,424,509,440 = 82,095,644,672 bytes: fits
      16 sequences: 17,671,135,232 + 68,719,476,736 = 86,390,611,968 bytes: does not
    """
    llama = "LLaMA-3-8B on 80 GiB"
    gb, fits = decode_fits(LLAMA3_8B, 1, 8192, 80)  # 16,060,522,496 + 2^30 bytes
    expect(gb, pytest.approx(17.134264320, rel=1e-9), "GB", f"{llama}, bf16, batch 1, T=8192")
    expect(bool(fits), True, "", f"{llama}, bf16, batch 1, T=8192: fits?")
    got = decode_fits(LLAMA3_8B, 59, 8192, 80)
    expect(got, (pytest.approx(79.411290112), True), "GB", f"{llama}, bf16, 59 at T=8192")
    got = decode_fits(LLAMA3_8B, 60, 8192, 80)
    expect(got, (pytest.approx(80.485031936), True), "GB", f"{llama}, bf16, 60 at T=8192")
    got = decode_fits(LLAMA3_8B, 65, 8192, 80)
    expect(got, (pytest.approx(85.853741056), True), "GB", f"{llama}, bf16, 65 at T=8192")
    got = decode_fits(LLAMA3_8B, 66, 8192, 80)
    expect(got, (pytest.approx(86.927482880), False), "GB", f"{llama}, bf16, 66 at T=8192")
    # int8 weights: 8.03 GB and 64 caches of 1.07 GB, 76.75 GB.
    got = decode_fits(LLAMA3_8B, 64, 8192, 80, bytes_per_param=1)
    expect(got, (pytest.approx(76.749737984), True), "GB", f"{llama}, int8 weights, 64 sequences")
    # and an int8 cache as well (its scales left out): 128 sequences in the same bytes.
    got = decode_fits(LLAMA3_8B, 128, 8192, 80, 1, 1)
    expect(got, (pytest.approx(76.749737984), True), "GB", f"{llama}, all int8, 128 sequences")
    no_gqa = dict(LLAMA3_8B, kv_heads=32)
    got = decode_fits(no_gqa, 15, 8192, 80)
    expect(got, (pytest.approx(82.095644672), True), "GB", f"{llama} without GQA, 15 sequences")
    got = decode_fits(no_gqa, 16, 8192, 80)
    expect(got, (pytest.approx(86.390611968), False), "GB", f"{llama} without GQA, 16 sequences")
    # A shorter context: batch 64 at T=2048 holds 64·268,435,456 bytes of cache.
    got = decode_fits(LLAMA3_8B, 64, 2048, 80)
    expect(got, (pytest.approx(33.240391680), True), "GB", f"{llama}, bf16, 64 at T=2048")
    # A 40 GiB A100, 42,949,672,960 bytes: 25 sequences, 42,904,068,096 bytes, fit (not in
    # 40e9); 26, 43,977,809,920 bytes, do not.
    got = decode_fits(LLAMA3_8B, 25, 8192, 40)
    expect(got, (pytest.approx(42.904068096), True), "GB", "LLaMA-3-8B on 40 GiB, bf16, 25")
    got = decode_fits(LLAMA3_8B, 26, 8192, 40)
    expect(got, (pytest.approx(43.977809920), False), "GB", "LLaMA-3-8B on 40 GiB, bf16, 26")
    record_property(
        "measured", f"LLaMA-3-8B bf16, batch 1 at T=8192: {gb:.2f} GB of an H100's 80 GiB"
    )


# RoPE.


def rope_reference(x, positions, base):
    """Rotation by complex multiplication, in float64: pair i is the complex
    number x[i] + j·x[i + D/2], turned by e^(j·pos·θ_i)."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
    z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * np.outer(positions, theta))
    return np.concatenate([z.real, z.imag], axis=-1)


@pytest.mark.exercise("rotary.rotary_angles")
def test_rotary_angles_by_hand():
    # D = 4, base 100: θ = (100^0, 100^(-2/4)) = (1, 0.1).
    got = rotary_angles(jnp.array([0, 1, 3]), 4, base=100.0)
    np.testing.assert_allclose(got, [[0, 0], [1, 0.1], [3, 0.3]], rtol=1e-6)
    # D = 8, base 10,000: θ_i = 10^(-i) for i = 0..3.
    got = rotary_angles(jnp.array([2]), 8)
    np.testing.assert_allclose(got, [[2, 0.2, 0.02, 0.002]], rtol=1e-6)


@pytest.mark.exercise("rotary.rotate")
def test_rotate_pairs_dim_i_with_dim_i_plus_half():
    """A unit vector on dim 0 turns into dims 0 and D/2 (rotate_half's pairing),
    never into dim 1 (the interleaved one's)."""
    x = jnp.array([[1.0, 0.0, 0.0, 0.0]])
    got = rotate(x, jnp.array([1]), base=100.0)
    np.testing.assert_allclose(got, [[np.cos(1), 0, np.sin(1), 0]], atol=1e-6)
    # Dim 1 (pair 1, θ = 0.1) turns by 0.3 at position 3, into dim 3.
    x = jnp.array([[0.0, 1.0, 0.0, 0.0]])
    got = rotate(x, jnp.array([3]), base=100.0)
    np.testing.assert_allclose(got, [[0, np.cos(0.3), 0, np.sin(0.3)]], atol=1e-6)


@pytest.mark.exercise("rotary.rotate")
@pytest.mark.parametrize("base", [10_000.0, 500_000.0], ids=["base 1e4", "LLaMA-3's 5e5"])
def test_rotate_against_the_complex_reference(base):
    positions = np.array([0, 1, 2, 5, 17, 100])
    x = jax.random.normal(jax.random.key(0), (6, 16))
    got = rotate(x, jnp.asarray(positions), base=base)
    expect(got.shape, (6, 16), "", "the output's shape [S, D]")
    np.testing.assert_allclose(got, rope_reference(x, positions, base), atol=2e-5)
    np.testing.assert_allclose(got[0], x[0], atol=1e-7, err_msg="position 0 turns nothing")
    np.testing.assert_allclose(
        np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5, err_msg="lengths"
    )


@pytest.mark.exercise("rotary.rotated_score")
def test_the_score_depends_only_on_the_distance(record_property):
    """q at m and k at n score Re Σ_i q_i conj(k_i) e^(j(m-n)θ_i), pairs as complex
    numbers: the same for (m + s, n + s), different for another distance."""
    q, k = jax.random.normal(jax.random.key(1), (2, 16))
    qz = np.asarray(q[:8], np.float64) + 1j * np.asarray(q[8:], np.float64)
    kz = np.asarray(k[:8], np.float64) + 1j * np.asarray(k[8:], np.float64)
    theta = 10_000.0 ** (-2.0 * np.arange(8) / 16)
    scale = float(jnp.linalg.norm(q) * jnp.linalg.norm(k))
    for m, n in [(0, 0), (5, 2), (2, 5), (7, 0), (40, 3)]:
        expected = np.real(np.sum(qz * np.conj(kz) * np.exp(1j * (m - n) * theta)))
        for shift in (0, 1, 13, 100):
            got = float(rotated_score(q, k, m + shift, n + shift))
            what = f"q at {m + shift}, k at {n + shift}"
            expect(got, pytest.approx(expected, abs=1e-4 * scale), "", what)
    got = float(rotated_score(q, k, 0, 0))
    expect(got, pytest.approx(float(q @ k), rel=1e-5), "", "q and k at 0: plain q·k")
    spread = [float(rotated_score(q, k, d, 0)) for d in range(4)]
    what = f"the spread of the score over distances 0..3 ({', '.join(f'{s:.3g}' for s in spread)})"
    expect(np.ptp(spread), above=1e-3 * scale, what=what)
    record_property("measured", "q·k at distances 0..3: " + ", ".join(f"{s:.2f}" for s in spread))


# int8 weights per output channel.

W_HAND = jnp.array([[100.0, -40.0, 2.0], [0.3, -0.2, 0.05]])  # [out=2, in=3]


@pytest.mark.exercise("quantize.quantize_per_channel")
def test_quantize_per_channel_by_hand():
    """Row 0: scale 100/127; -40·1.27 = -50.8 -> -51, 2·1.27 = 2.54 -> 3.
    Row 1: scale 0.3/127; -0.2·127/0.3 = -84.67 -> -85, 0.05·127/0.3 = 21.17 -> 21."""
    values, scale = quantize_per_channel(W_HAND)
    assert values.dtype == jnp.int8, f"values are {values.dtype}, expected int8"
    expect(values.shape, (2, 3), "", "the values' shape [out, in]")
    assert scale.dtype == jnp.float32, f"scales are {scale.dtype}, expected float32"
    expect(scale.shape, (2,), "", "the scales' shape [out]")
    np.testing.assert_array_equal(values, [[127, -51, 3], [127, -85, 21]])
    np.testing.assert_allclose(scale, [100 / 127, 0.3 / 127], rtol=1e-6)
    values, scale = quantize_per_channel(jnp.zeros((3, 2)).at[1].set(jnp.array([4.0, -1.0])))
    np.testing.assert_array_equal(values, [[0, 0], [127, -32], [0, 0]], err_msg="zero rows")
    np.testing.assert_allclose(scale, [1, 4 / 127, 1], rtol=1e-6)


def one_large_row(out=6, inputs=40, seed=0):
    """A [out, in] matrix whose row 2 is a thousand times the others."""
    w = jax.random.normal(jax.random.key(seed), (out, inputs))
    return w.at[2].multiply(1000.0)


@pytest.mark.exercise("quantize.quantize_per_channel")
def test_each_element_moves_by_at_most_half_its_rows_step():
    w = one_large_row()
    values, scale = quantize_per_channel(w)
    error = np.abs(np.asarray(w, np.float64) - np.asarray(values, np.float64) * scale[:, None])
    half_step = np.asarray(scale)[:, None] / 2 * (1 + 1e-5)
    assert np.all(error <= half_step), f"rows {np.nonzero((error > half_step).any(1))[0]} moved"
    largest = np.max(np.abs(np.asarray(values, np.int32)), axis=1)
    assert np.all(largest == 127), f"each row's largest |value|: {largest}, expected all 127"


def numpy_per_channel(w):
    """The test's own per-channel quantisation, in float64: (int8 values, scales)."""
    w = np.asarray(w, np.float64)
    scale = np.max(np.abs(w), axis=1) / 127
    return np.round(w / scale[:, None]).astype(np.int8), scale


@pytest.mark.exercise("quantize.int8_matvec")
def test_int8_matvec_against_float64():
    # By hand: rows (127, -51, 3)·(1, 1, 1) = 79 and (127, -85, 21)·(1, 1, 1) = 63, scaled.
    values = jnp.array([[127, -51, 3], [127, -85, 21]], jnp.int8)
    got = int8_matvec(values, jnp.array([0.5, 0.25]), jnp.ones(3))
    expect(got.shape, (2,), "", "the output's shape [out]")
    np.testing.assert_allclose(got, [79 * 0.5, 63 * 0.25], rtol=1e-6)
    values, scale = numpy_per_channel(one_large_row())
    x = jax.random.normal(jax.random.key(1), (40,))
    got = int8_matvec(jnp.asarray(values), jnp.asarray(scale, jnp.float32), x)
    expect(got.shape, (6,), "", "the output's shape [out]")
    assert got.dtype == x.dtype, f"the output is {got.dtype}, expected x's {x.dtype}"
    expected = (values.astype(np.float64) @ np.asarray(x, np.float64)) * scale
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.exercise("quantize.matvec_error_bound")
def test_matvec_error_bound_by_hand_and_it_holds(record_property):
    # Σ|x| = 1 + 2 + 3 = 6: bounds 0.5/2·6 and 2/2·6.
    bound = matvec_error_bound(jnp.array([0.5, 2.0]), jnp.array([1.0, -2.0, 3.0]))
    np.testing.assert_allclose(bound, [1.5, 6.0], rtol=1e-6)
    w = one_large_row()
    values, scale = numpy_per_channel(w)
    worst = 0.0
    for seed in range(3):
        x = jax.random.normal(jax.random.key(10 + seed), (40,))
        exact = np.asarray(w, np.float64) @ np.asarray(x, np.float64)
        approx = (values.astype(np.float64) @ np.asarray(x, np.float64)) * scale
        bound = np.asarray(matvec_error_bound(jnp.asarray(scale, jnp.float32), x), np.float64)
        error = np.abs(exact - approx)
        assert np.all(error <= bound * (1 + 1e-5)), (
            f"vector {seed}: errors {np.round(error, 4)} against your bounds {np.round(bound, 4)}"
        )
        worst = max(worst, float(np.max(np.abs(exact - approx) / bound)))
    record_property("measured", f"largest error / bound over 3 vectors: {worst:.2f}")


@pytest.mark.exercise("quantize.rounding_errors")
def test_rounding_errors_by_hand():
    """Per tensor (scale 100/127 for both rows) row 1 rounds to (0, 0, 0): off by
    0.3. Per channel row 1 is off by at most |-85·0.3/127 + 0.2| = 0.000787. Row 0
    has the same scale both ways: |3·100/127 - 2| = 0.362."""
    per_tensor, per_channel = rounding_errors(W_HAND)
    expect(per_tensor.shape, (2,), "", "per tensor's shape, one error a row")
    expect(per_channel.shape, (2,), "", "per channel's shape, one error a row")
    np.testing.assert_allclose(per_tensor, [0.36220472, 0.3], rtol=1e-5)
    np.testing.assert_allclose(per_channel, [0.36220472, 0.00078740], rtol=1e-3)


@pytest.mark.exercise("quantize.rounding_errors")
def test_one_large_row_spoils_the_per_tensor_scale(record_property):
    w = one_large_row()
    per_tensor, per_channel = rounding_errors(w)
    small = np.array([0, 1, 3, 4, 5])
    amax = np.max(np.abs(np.asarray(w, np.float64)), axis=1)
    # float64: per channel each row within half its own step; per tensor within half the
    # large row's step, which rounds most of a small row's weights to 0.
    per_channel, per_tensor = np.asarray(per_channel), np.asarray(per_tensor)
    assert np.all(per_channel <= amax / 127 / 2 * (1 + 1e-5)), (
        f"per channel {per_channel}: over half a row's step {amax / 127 / 2}"
    )
    assert np.all(per_tensor <= amax.max() / 127 / 2 * (1 + 1e-5)), (
        f"per tensor {per_tensor}: over half the tensor's step {amax.max() / 127 / 2}"
    )
    assert np.all(per_tensor[small] > 20 * per_channel[small]), (
        f"small rows: per tensor {per_tensor[small]}, not 20 times per channel {per_channel[small]}"
    )
    record_property(
        "measured",
        f"one row 1000x: small rows off by {float(per_tensor[small].mean()):.3f} per tensor, "
        f"{float(per_channel[small].mean()):.4f} per channel",
    )


# int8 numerics: a sum.

X = 3 * jax.random.normal(jax.random.key(0), (4096,))


@pytest.mark.exercise("int8_numerics.quantize_absmax")
def test_quantize_absmax_maps_the_largest_value_to_127():
    q, scale = quantize_absmax(X)
    assert q.dtype == jnp.int8, f"q is {q.dtype}, expected int8"
    expect(q.shape, X.shape, "", "q's shape, x's")
    absmax = float(jnp.max(jnp.abs(X)))
    expect(float(scale), pytest.approx(absmax / 127, rel=1e-6), "", "scale: max |x| / 127")
    expect(int(jnp.max(jnp.abs(q.astype(jnp.int32)))), 127, "", "the largest |q|")
    # Round to nearest: each value moves by at most half a step.
    moved = float(jnp.max(jnp.abs(q * scale - X)))
    expect(moved, at_most=float(scale) / 2 * (1 + 1e-5), what="largest |q·scale - x|, half a step")
    q0, _ = quantize_absmax(jnp.zeros(8))
    np.testing.assert_array_equal(q0, 0, err_msg="all-zero input")


@pytest.mark.exercise("int8_numerics.int8_sum")
def test_int8_sum_is_the_sum_of_the_quantised_values(record_property):
    q = jnp.round(X / (jnp.max(jnp.abs(X)) / 127))
    expected = float(jnp.sum(q.astype(jnp.int32))) * float(jnp.max(jnp.abs(X))) / 127
    got = float(int8_sum(X))
    expect(got, pytest.approx(expected, rel=1e-5), "", "the int8 values summed, times the scale")
    exact, bound = float(jnp.sum(X)), float(jnp.max(jnp.abs(X))) / 127 * X.shape[0] / 2
    expect(abs(got - exact), at_most=bound, what="|int8 sum - float32 sum|, N·scale/2 at most")
    record_property(
        "measured", f"N=4096: |int8 - float32| = {abs(got - exact):.3f}, bound {bound:.1f}"
    )


@pytest.mark.exercise("int8_numerics.int8_sum")
def test_int8_sum_accumulates_without_overflow():
    """1024 values of 127 sum to 130048: past int8's and int16's range."""
    got = float(int8_sum(jnp.full((1024,), 0.5)))
    expect(got, pytest.approx(512.0), "", "1024 values of 0.5, each 127 in int8")


@pytest.mark.exercise("int8_numerics.int8_sum_error_bound")
def test_int8_sum_error_bound_by_hand_and_holds():
    scale = float(jnp.max(jnp.abs(X))) / 127
    got = float(int8_sum_error_bound(X))
    expect(got, pytest.approx(4096 * scale / 2, rel=1e-6), "", "N=4096: N·scale/2")
    for seed in range(3):
        x = jax.random.uniform(jax.random.key(seed), (1000,), minval=-1, maxval=1)
        q = jnp.round(x / (jnp.max(jnp.abs(x)) / 127))
        quantised = float(jnp.sum(q)) * float(jnp.max(jnp.abs(x))) / 127
        error = abs(quantised - float(jnp.sum(x)))
        what = f"uniform x, seed {seed}: your bound against the int8 sum's error"
        expect(float(int8_sum_error_bound(x)), at_least=error, what=what)

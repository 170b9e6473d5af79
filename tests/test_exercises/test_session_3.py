"""Rooflines: arithmetic intensity, MFU against bandwidth utilisation, the FSDP napkin."""

import pytest
from adapters import exercise

from roofline.hardware import CHIPS

chain_flops = exercise("intensity.chain_flops")
chain_bytes = exercise("intensity.chain_bytes")
chain_intensity = exercise("intensity.chain_intensity")
bound = exercise("intensity.bound")
matmul_utilisation = exercise("mfu_vs_bandwidth.matmul_utilisation")
elementwise_utilisation = exercise("mfu_vs_bandwidth.elementwise_utilisation")
best_mfu = exercise("mfu_vs_bandwidth.best_mfu")
fsdp_flops_per_chip = exercise("sharding.fsdp_flops_per_chip")
fsdp_bytes_per_chip = exercise("sharding.fsdp_bytes_per_chip")
fsdp_comm_hidden = exercise("sharding.fsdp_comm_hidden")

H100 = CHIPS["h100-sxm"]  # bf16 989 TFLOP/s, 3.35 TB/s: ridge about 295 FLOPs per byte
S, T, D = 2048, 4096, 128  # queries, keys, head dim: attention-like, S != T


# Arithmetic intensity.


@pytest.mark.exercise("intensity.chain_flops")
def test_chain_flops_by_hand():
    assert chain_flops(S, T, D) == 4 * S * T * D
    assert chain_flops(1, 2, 3) == 2 * 2 * 3 * 1 + 2 * 3 * 2 * 1


@pytest.mark.exercise("intensity.chain_bytes")
def test_chain_bytes_by_hand():
    inputs_and_output = T * D + D * S + D * T + D * S
    assert chain_bytes(S, T, D, 2, fused=True) == 2 * inputs_and_output
    assert chain_bytes(S, T, D, 2, fused=False) == 2 * (inputs_and_output + 4 * S * T)
    assert chain_bytes(S, T, D, 4, fused=True) == 4 * inputs_and_output


@pytest.mark.exercise("intensity.chain_intensity")
def test_chain_intensity_by_hand():
    fused = 4 * S * T * D / (2 * 2 * D * (S + T))
    assert chain_intensity(S, T, D, 2, fused=True) == pytest.approx(fused)  # ~ 1365
    unfused = 4 * S * T * D / (2 * (2 * D * (S + T) + 4 * S * T))
    assert chain_intensity(S, T, D, 2, fused=False) == pytest.approx(unfused)  # ~ 61


@pytest.mark.exercise("intensity.bound")
def test_keeping_the_score_matrix_on_chip_crosses_the_ridge():
    """Op by op, attention is memory-bound on an H100; fused, compute-bound."""
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    assert bound(61.0, peak, bandwidth) == "memory"
    assert bound(1365.0, peak, bandwidth) == "compute"
    assert (
        bound(peak / bandwidth, peak, bandwidth) == "compute"
    )  # on the ridge: either, say compute


# MFU versus bandwidth.


@pytest.mark.exercise("mfu_vs_bandwidth.matmul_utilisation")
def test_matmul_utilisation_by_hand():
    M = K = N = 8192
    flops, moved = 2 * M * K * N, 2 * 3 * M * N
    seconds = 2 * flops / H100.peak("bfloat16")  # half the peak
    got = matmul_utilisation(M, K, N, seconds, H100.peak("bfloat16"), H100.hbm_bandwidth, 2)
    assert got[0] == pytest.approx(0.5)
    assert got[1] == pytest.approx(moved / seconds / H100.hbm_bandwidth)


@pytest.mark.exercise("mfu_vs_bandwidth.elementwise_utilisation")
def test_elementwise_at_full_bandwidth_has_tiny_mfu():
    """x + y over 2^28 bf16 elements at the memory roofline: MBU 1, MFU about 1/1000."""
    n, peak, bandwidth = 2**28, H100.peak("bfloat16"), H100.hbm_bandwidth
    seconds = 2 * n * 3 / bandwidth  # two inputs read, one output written
    got_mfu, got_mbu = elementwise_utilisation(n, seconds, peak, bandwidth, 2, inputs=2)
    assert got_mbu == pytest.approx(1.0)
    assert got_mfu == pytest.approx(n / seconds / peak)
    assert got_mfu < 0.001


@pytest.mark.exercise("mfu_vs_bandwidth.best_mfu")
def test_best_mfu_is_capped_by_intensity_over_ridge():
    peak, bandwidth = H100.peak("bfloat16"), H100.hbm_bandwidth
    ridge = peak / bandwidth
    assert best_mfu(ridge / 4, peak, bandwidth) == pytest.approx(0.25)
    assert best_mfu(10 * ridge, peak, bandwidth) == pytest.approx(1.0)
    assert best_mfu(1 / 6, peak, bandwidth) == pytest.approx(1 / 6 / ridge)  # an elementwise add


# FSDP.

LAYER = 12 * 4096**2  # a layer of a 4096-wide transformer: 4·E² attention + 8·E² MLP


@pytest.mark.exercise("sharding.fsdp_flops_per_chip")
def test_fsdp_flops_per_chip_by_hand():
    assert fsdp_flops_per_chip(LAYER, 1_048_576, 256) == pytest.approx(6 * 4096 * LAYER)


@pytest.mark.exercise("sharding.fsdp_bytes_per_chip")
def test_fsdp_bytes_per_chip_by_hand():
    assert fsdp_bytes_per_chip(LAYER, 256, 2) == pytest.approx(3 * LAYER * 2 * 255 / 256)
    assert fsdp_bytes_per_chip(LAYER, 1, 2) == 0  # one chip: nothing to gather


@pytest.mark.exercise("sharding.fsdp_comm_hidden")
def test_fsdp_hides_communication_above_a_batch_per_chip():
    """TPU v5e: 197 TFLOP/s, ICI 400 GB/s. Hidden when tokens per chip >=
    peak * bytes * (n - 1) / n / (2 * ICI) = 492.5 * 255 / 256, about 490."""
    v5e = CHIPS["tpu-v5e"]
    chips, peak, ici = 256, v5e.peak("bfloat16"), v5e.interconnect
    threshold = peak * 2 * (chips - 1) / chips / (2 * ici)
    assert threshold == pytest.approx(490.6, abs=0.1)
    for per_chip, hidden in [(threshold * 1.01, True), (threshold * 0.99, False), (4096, True)]:
        tokens = per_chip * chips
        assert bool(fsdp_comm_hidden(LAYER, tokens, chips, peak, ici, 2)) == hidden, (
            f"{per_chip:.0f} tokens per chip: expected hidden={hidden}"
        )

"""Every test sees 8 simulated CPU devices, so sharding runs here as on a pod.

The flag must be set before JAX starts, hence here, before any test imports it.
Tests that need one device build a one-device mesh or run a subprocess. What
tests share besides fixtures is in tests/helpers.py.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest

from sessions.config import ModelConfig


@pytest.fixture(scope="session")
def cfg():
    """Sizes that differ pairwise, so a swapped axis cannot go unnoticed:
    B=2 (in tests), S=6..16, E=24, F=40, H=3, D=8, V=256."""
    return ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=16)


@pytest.fixture(scope="session")
def key():
    return jax.random.key(0)

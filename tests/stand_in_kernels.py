"""STAND-INS, not the kernels: the decode kernels' contract (attention_layer,
mlp_layer; sessions/decode_kernels.py) written in plain JAX from the model's own
blocks, so the step, the flag and the benchmark around them are tested before
sessions/decode_attention.py and sessions/decode_mlp.py exist.

install() puts them in sys.modules under those names only where the real modules
are missing: once the kernels land, the tests that call it run the kernels.
"""

import importlib.util
import sys
import types

import jax.numpy as jnp

from sessions import inference
from sessions.decode_layout import dense_out_in
from sessions.model import attention_block, mlp_block, rms_norm


def settle(x, pending):  # the contract's x_now, written again (not decode_kernels')
    return (x.astype(jnp.float32) + pending.sum(axis=0)).astype(x.dtype)


def attention_layer(layer, cache, x, pending, pos, live, cfg, *, interpret):
    """(x_now, partials [1, B, E] f32, the cache written): XLA's attention half."""
    del interpret
    x_now = settle(x, pending)
    attend = inference._attend_with_cache(cache, pos, live)
    normed = rms_norm(x_now[:, None], layer["attn_norm"])
    out, cache = attention_block(layer, normed, cfg, attend, dense_out_in, pos)
    return x_now, out[:, 0].astype(jnp.float32)[None], cache


def mlp_layer(layer, x, pending, cfg, *, interpret):
    """(x_now, partials [1, B, E] f32): XLA's MLP half."""
    del interpret
    x_now = settle(x, pending)
    out = mlp_block(layer, rms_norm(x_now[:, None], layer["mlp_norm"]), cfg, dense_out_in)
    return x_now, out[:, 0].astype(jnp.float32)[None]


def install():
    """Stand in for each kernel module that does not exist; True if any did."""
    stood_in = False
    for name, fn in (("decode_attention", attention_layer), ("decode_mlp", mlp_layer)):
        full = f"sessions.{name}"
        if importlib.util.find_spec(full) is None:
            module = types.ModuleType(full, "STAND-IN (tests/stand_in_kernels.py)")
            setattr(module, fn.__name__, fn)
            sys.modules[full] = module
            setattr(sys.modules["sessions"], name, module)
            stood_in = True
    return stood_in

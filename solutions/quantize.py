"""int8 weights with one scale per output channel, and the bound on their error.

A decode weight W [out, in] (rows are outputs, sessions/inference/layout.py) is
stored as int8 values and one float32 scale per row, set by the row's own
largest magnitude (absmax):

    scale_o = max_i |W[o, i]| / 127      q = round(W / scale) in int8      Ŵ = q·scale

Rounding to the nearest step moves each element by at most half a step:

    |W[o, i] − Ŵ[o, i]| <= scale_o / 2

and a product y = W·x adds up `in` such errors, each weighted by |x_i|:

    |y_o − ŷ_o| <= (scale_o / 2) · Σ_i |x_i|

Why per channel: one scale for the whole matrix is set by its largest value.
A row of small weights then rounds in steps sized for the big one, most of
its weights to 0; with its own scale, each row uses all 255 levels.

The product is computed in the compute dtype without making Ŵ: the scale of
row o is the same for every i, so it factors out of the sum over in,
ŷ = (q·x) * scale, one multiply per output (sessions/model/quantize.py does this for
every matmul of the decode step).
"""

import jax.numpy as jnp


def quantize_per_channel(w):
    """w: float32 [out, in] -> (values: int8 [out, in], scale: float32 [out]).

    scale[o] = max over in of |w[o]| / 127 (1.0 for a row of zeros, to avoid
    0 / 0); values = round(w / scale[:, None]), so each row's largest |w|
    becomes ±127.
    Hint: jnp.max(jnp.abs(w), axis=1); jnp.round(...).astype(jnp.int8).
    """
    amax = jnp.max(jnp.abs(w), axis=1)
    scale = jnp.where(amax > 0, amax / 127, 1.0).astype(jnp.float32)
    values = jnp.round(w / scale[:, None]).astype(jnp.int8)
    return values, scale


def int8_matvec(values, scale, x):
    """y ≈ W·x from the int8 form: [out], in x's dtype.

    values: int8 [out, in], scale: [out], x: [in]. Convert the values to x's
    dtype, multiply by x, then scale each output once: (values @ x) * scale.
    No dequantized [out, in] copy is needed.
    """
    return (values.astype(x.dtype) @ x) * scale.astype(x.dtype)


def matvec_error_bound(scale, x):
    """The most int8_matvec can differ from W·x, per output: [out].

    Each weight is off by at most scale[o] / 2, and weight i is multiplied by
    x[i]: (scale[o] / 2) · Σ_i |x[i]|.
    """
    return scale / 2 * jnp.sum(jnp.abs(x))


def rounding_errors(w):
    """The largest |W − Ŵ| of each row, with one scale for the whole matrix
    and with one per row: (per_tensor [out], per_channel [out]).

    Per tensor: scale = max |w| over the whole matrix / 127 (w not all
    zeros). Per channel:
    quantize_per_channel. Dequantize each (values * scale) and take, per row,
    the largest absolute difference from w.
    """
    tensor_scale = jnp.max(jnp.abs(w)) / 127
    per_tensor = jnp.round(w / tensor_scale) * tensor_scale
    values, scale = quantize_per_channel(w)
    per_channel = values.astype(w.dtype) * scale[:, None]
    return jnp.max(jnp.abs(w - per_tensor), axis=1), jnp.max(jnp.abs(w - per_channel), axis=1)

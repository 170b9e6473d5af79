"""Find the bug: remat that saves everything.

broken_remat_layer() wraps a layer in jax.checkpoint, which should make the
backward recompute what the layer computed and keep only its input. It passes
the policy everything_saveable: every intermediate is saved anyway, the
activations do not shrink, and the backward recomputes nothing it needed. The
step runs, the loss is right, and memory is what it was: nothing fails, so
nothing says why.

The tool: jax.ad_checkpoint.print_saved_residuals(f, *args) lists what the
backward of f will read, one line a value with its shape and where it came from.
Read it for one layer before trusting a remat policy, and count.
"""

import contextlib
import io
import math
import re

import jax
from jax.ad_checkpoint import print_saved_residuals


def broken_remat_layer(layer_fn):
    """layer_fn(weights, x) -> x, under jax.checkpoint, saving everything."""
    return jax.checkpoint(layer_fn, policy=jax.checkpoint_policies.everything_saveable)


def remat_layer(layer_fn):
    """layer_fn(weights, x) -> x under jax.checkpoint, keeping the layer's input
    alone for the backward (the course's --remat block).
    Hint: jax.checkpoint_policies; which one lets nothing be saved?"""
    raise NotImplementedError


def saved_values(fn, *args):
    """How many values fn's backward reads (what print_saved_residuals lists), counting
    every array's elements, the arguments among them: e.g. 3 for a saved f32[3].
    Hint: capture what it prints (contextlib.redirect_stdout into io.StringIO);
    each line starts with a dtype and a shape, like f32[2,16,24]."""
    raise NotImplementedError

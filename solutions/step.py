"""Gradient accumulation, as sessions/train/step.py `accumulate` does it inside the step.

A batch of B rows too large for memory runs as N microbatches of B/N rows, one at a
time: each one's activations are freed before the next begins, so the step holds
one microbatch's. Their gradients are summed in float32 and divided by N: the mean
loss over B rows is the mean of the N microbatches' means, so the sum of their
gradients over N is the gradient of the whole batch, to summation order. One
optimizer update follows, as for the batch of B.

The course's step runs the microbatches under lax.scan, so the program holds one
microbatch's buffers, not N; here a Python loop is enough to see the arithmetic.
"""

import jax
import jax.numpy as jnp


def accumulate(loss_fn, params, batch, n):
    """(mean loss, mean gradient) of loss_fn(params, rows) over the batch's rows, as
    n microbatches of len(batch) / n consecutive rows each. batch: an array whose
    first axis is the rows; loss_fn returns the mean over the rows it is given.
    Hint: jax.value_and_grad(loss_fn); jax.tree.map to add gradients and divide."""
    rows = batch.shape[0] // n
    grad_fn = jax.value_and_grad(loss_fn)
    total_loss, total = 0.0, jax.tree.map(jnp.zeros_like, params)
    for i in range(n):
        loss, grads = grad_fn(params, batch[i * rows : (i + 1) * rows])
        total_loss = total_loss + loss
        total = jax.tree.map(jnp.add, total, grads)
    return total_loss / n, jax.tree.map(lambda g: g / n, total)

"""Find the bug: mixed precision that loses the updates of frequent bytes.

broken_embedding_grad() is the gradient of session 2's token lookup as the
course model first wrote it in bfloat16: the float32 table cast to bf16, then
looked up. A lookup's gradient is a scatter-add, each position's gradient
added into its token's row; cast first, that sum runs in bf16. In text one
byte (the space) fills near 30% of the positions, so its row takes hundreds of
updates, and once the running sum is large, an update below half its last
place (8 significant bits) is lost. On an H100 the same sum ran as bf16 atomic
adds: 4.6 ms a step at first, 58-146 ms after 600 steps, against 0.3 ms in
float32; the course run went at 0.12x a PyTorch run's speed
(docs/h100-run/README.md).

The tool: read what the compiler made. The compiled gradient's HLO text
(`jax.jit(f).lower(*args).compile().as_text()`) holds a line
`%scatter-add.0 = bf16[256,48]{1,0} scatter(...), to_apply=%region_0.1`: its
result type, and the combiner it names, say what the sum runs in. Then hold
the gradient against np.add.at in float64.
"""

import jax
import jax.numpy as jnp

from roofline.compiled.hlo import parse


def broken_embedding_grad(table, tokens, cotangent):
    """table float32 [V, E], tokens int [B, S], cotangent [B, S, E] -> the
    gradient of the lookup with respect to the table, [V, E]. Summed in bf16."""
    _, vjp = jax.vjp(lambda w: w.astype(jnp.bfloat16)[tokens], table)
    return vjp(cotangent.astype(jnp.bfloat16))[0]


def lookup(table, tokens, dtype):
    """table float32 [V, E], tokens int [B, S] -> [B, S, E] in `dtype`, the
    compute dtype, with its gradient with respect to the table summed in
    float32 whatever `dtype` is (the tests differentiate it on a skewed batch
    and hold the result against a float64 sum).
    Hint: the broken version casts, then gathers. What if it gathered first?
    """
    raise NotImplementedError


def scatter_dtypes(hlo_text):
    """The dtypes the scatters of a compiled program hold their sums in, from its
    HLO text: e.g. {"bf16"} for broken_embedding_grad's program, set() with no
    scatter.
    Hint: roofline.compiled.hlo.parse(hlo_text) reads it: module.instructions() yields
    (computation, op); a scatter's op.opcode is "scatter" and op.dtype its
    result's dtype. That is not the whole story: XLA's CPU compiler in JAX 0.10
    widens a bf16 scatter to an f32 result and rounds each sum back to bf16 in
    its combiner, module.computations[op.calls["to_apply"][0]]. Take the
    narrowest float dtype of the result and the combiner's instructions.
    """
    raise NotImplementedError

"""The loss over chunks of the tokens: the cross-entropy without the whole [B, S, V]
logits, or their gradient, ever held at once.

At a large vocabulary the output end holds the step's largest arrays: logits of
B·S x V in float32, and as many again for their gradient (softmax minus the one-hot).
At LLaMA-3's 128,256 tokens and a chip's 8,192 tokens of a step, each is
8,192 x 128,256 x 4 B = 4.2 GB, against 0.13 GB for the hidden states x [B, S, E]
they come from (E = 4,096, in float32).

Split the positions of each row into N chunks and run the output end on one chunk at
a time under lax.scan, each chunk's norm, projection and loss under jax.checkpoint:
the forward keeps only the chunk's loss, and the backward rebuilds the chunk's logits
from x, takes their gradient, and drops both before the next chunk. One chunk's
logits and one chunk's gradient are alive at a time, 1/N of each, for one more
projection's FLOPs (2·B·S·E·V, a third of the output end's 6·B·S·E·V). MaxText's
`num_vocab_tiling` does the same over tiles of the batch x sequence, with lax.scan and
a VJP of its own (src/maxtext/utils/vocabulary_tiling.py); Liger Kernel's fused linear
cross-entropy does it in a kernel.

    loss = chunked_cross_entropy(head_weights(params, cfg), x, targets, chunks=4)

Chunk i takes positions i, i+N, i+2N, ... of every row (as accumulate takes rows,
sessions/train/step.py), not a contiguous stretch of the batch's B·S tokens: each
device then works on its own rows in every chunk (the batch stays split over data
and fsdp, no chunk lives on one device alone), and a sequence split into contiguous
shards over devices is spread over every chunk evenly too. The mean over tokens
does not care about the order: every chunk holds B·S/N tokens, so the mean of the
chunks' means is the mean.
"""

import jax
import jax.numpy as jnp

from sessions.model.transformer import cross_entropy, unembed


def chunked_cross_entropy(head, x, targets, chunks):
    """Mean negative log-likelihood in nats of unembed(head, x) against targets, over
    `chunks` chunks of S/N positions each. head: the output end's weights in the
    compute dtype (sessions/model/transformer.py head_weights), x [B, S, E] (the last
    layer's output, before the final norm), targets int [B, S]; N divides S
    (ModelConfig checks loss_chunks)."""
    if chunks == 1:  # the whole [B, S, V] at once, as forward then cross_entropy
        return cross_entropy(unembed(head, x), targets)
    B, S = targets.shape

    def split(a):
        """[B, S, ...] -> [N, B, S/N, ...]: chunk i holds positions i, i+N, i+2N, ..."""
        return jnp.moveaxis(a.reshape(B, S // chunks, chunks, *a.shape[2:]), 2, 0)

    # Nothing inside is saved for the backward but the chunk's inputs: its logits
    # [B, S/N, V] are rebuilt there, one chunk at a time (jax.checkpoint's default).
    @jax.checkpoint
    def chunk_loss(head, x_chunk, targets_chunk):
        return cross_entropy(unembed(head, x_chunk), targets_chunk)

    def add(total, chunk):
        return total + chunk_loss(head, *chunk), None

    total, _ = jax.lax.scan(add, jnp.zeros((), jnp.float32), (split(x), split(targets)))
    return total / chunks

"""What fills a chip's memory in training, on a napkin (roofline/plan/training_memory.py).

Per parameter, by recipe: the stored weights (float32 4 bytes, bfloat16 2), an
optional float32 master copy (4), a gradient (4 or 2), and the optimizer's state:
AdamW keeps two moments, m and v, SGD with momentum one (each 4 or 2 bytes). Three
published conventions, each a recipe:

    the JAX scaling book   bf16 weights, float32 m and v; gradients not counted  10
    ZeRO (Rajbhandari)     fp16 weights and gradients, float32 master, m, v       16
    Megatron-LM            bf16 weights, float32 gradients, master, m, v          18

Per layer per token, what the forward saves for the backward, by remat policy
(jax.checkpoint around each layer; sessions/model/remat.py REMAT):

    block  nothing_saveable: the layer's input alone, E values
    dots   dots_with_no_batch_dims_saveable: the input and the outputs of the matmuls
           whose operands have no batch dimension: q (H·D), k and v (K·D each), the
           attention's output projection (E) and the MLP's first matrix (F). The
           attention's own products, q·k and p·v, have batch dimensions: not saved.

And the fewest chips that hold a model's state: its bytes over one chip's HBM,
rounded up. And why bf16 weights want a float32 master: a bfloat16 number keeps 8
significant bits, so an update smaller than half the gap to a weight's neighbour
rounds back to the weight (sessions/train/master_weights.py).

What big runs add (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2): a layer's activations in bytes, s sequence, b batch, h
hidden, a heads, t tensor-parallel chips, 16-bit values, with dropout:

    no parallelism                        s·b·h·(34 + 5·a·s/h)
    tensor parallel                       s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence parallel            s·b·h·(34/t + 5·a·s/(h·t))
    selective recompute (the a·s² terms)  drops the 5·a·s/h term from either
    full recompute                        s·b·h·2, the layer's input alone

And the loss over chunks of tokens: the logits [tokens, V] and their gradient are the
step's largest temporaries at a large vocabulary; computed a chunk at a time, each
chunk's logits rebuilt in the backward, only one chunk's are ever alive.
"""

import math

import jax
import jax.numpy as jnp

BYTES = {"float32": 4, "bfloat16": 2}


def bytes_per_parameter(weights, master, grads, optimizer, optimizer_dtype):
    """Bytes each parameter costs: weights ("float32" or "bfloat16"), master (True:
    a float32 copy), grads ("float32", "bfloat16", or None: not counted, as the
    scaling book does), optimizer ("adamw": m and v; "sgd": momentum alone) in
    optimizer_dtype. Hint: the book's recipe is 2 + 0 + 0 + 2·4 = 10."""
    moments = 2 if optimizer == "adamw" else 1
    return (
        BYTES[weights]
        + (4 if master else 0)
        + (BYTES[grads] if grads else 0)
        + moments * BYTES[optimizer_dtype]
    )


def saved_values(E, F, H, K, D, policy):
    """Values one layer of the course's model (pre-norm attention, then a ReLU MLP)
    saves for the backward, per token, under policy "block" or "dots".
    Hint: list the layer's matmuls and, for each, whether an operand has a batch
    dimension (a weight has none); count the values a token of each output kept."""
    if policy == "block":
        return E
    return E + H * D + 2 * K * D + E + F


def saved_by_name(E, F, H, K, D, policy):
    """Values one layer of the course's model saves a token under MaxText's
    "save_qkv_proj" (the tensors named query_proj, key_proj, value_proj) or
    "save_dot_except_mlp" (those and out_proj, wo's output), beside the layer's input,
    which jax.checkpoint always keeps. Hint: q has H heads of D, k and v K heads each;
    out_proj is a token's E."""
    qkv = H * D + 2 * K * D
    return E + qkv + (E if policy == "save_dot_except_mlp" else 0)


def fewest_chips(params, bytes_per_param, hbm_bytes):
    """The fewest chips whose HBM, together, holds params x bytes_per_param bytes.
    Hint: math.ceil; 8.3 chips' worth needs 9."""
    return math.ceil(params * bytes_per_param / hbm_bytes)


def bf16_gap(weight):
    """The distance from a positive bfloat16 value `weight` to the next bfloat16 value
    above it. bfloat16 keeps 8 significant bits (7 stored, 1 implied): the numbers in
    [2^e, 2^(e+1)) are 2^(e-7) apart. Hint: 1.0 is in [1, 2), e = 0: 2^-7 = 0.0078125;
    math.frexp or math.log2 finds e."""
    return 2.0 ** (math.floor(math.log2(weight)) - 7)


def korthikanti_bytes(s, b, h, a, t, sequence_parallel, recompute):
    """One layer's activation bytes by Korthikanti et al.'s Table 2 (above): t tensor
    chips (1: none), sequence_parallel (True: the 10 bytes outside attention and the MLP
    divide by t too), recompute "none", "selective" or "full". Hint: with t = 1 the
    tensor-parallel line is the no-parallelism line, 10 + 24 = 34."""
    if recompute == "full":
        return 2 * s * b * h
    outside = 10 / t if sequence_parallel else 10
    scores = 0 if recompute == "selective" else 5 * a * s / (h * t)
    return s * b * h * (outside + 24 / t + scores)


def chunked_cross_entropy(x, unembed, targets, chunks):
    """Mean cross-entropy in nats of logits x @ unembed, x [N, E] (N tokens), unembed
    [E, V], targets int [N], over `chunks` equal chunks of the tokens, so that the
    compiled step never holds [N, V] logits or their gradient: under jax.lax.map, each
    chunk under jax.checkpoint (its backward rebuilds its logits). Hint: reshape x to
    [chunks, N/chunks, E]; a chunk's loss is the sum of logsumexp minus the target's
    logit, in float32; divide the total by N once."""
    n, e = x.shape

    @jax.checkpoint
    def chunk_loss(chunk):
        xs, ts = chunk
        logits = (xs @ unembed).astype(jnp.float32)  # [N/chunks, V]
        picked = jnp.take_along_axis(logits, ts[:, None], axis=-1)[:, 0]
        return jnp.sum(jax.nn.logsumexp(logits, axis=-1) - picked)

    pieces = (x.reshape(chunks, n // chunks, e), targets.reshape(chunks, n // chunks))
    return jnp.sum(jax.lax.map(chunk_loss, pieces)) / n

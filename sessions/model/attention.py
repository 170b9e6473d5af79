"""Causal multi-head attention, written out with einsums.

Session 1's model had none: each output depended on one token only. Attention
lets position s read every position t <= s, weighted by how well its query
matches their keys:

    scores[b, h, s, t] = q[b, s, h, :] . k[b, t, h, :] / sqrt(D)
    out[b, s, h, :]    = sum_t softmax_t(scores)[b, h, s, t] * v[b, t, h, :]

Shapes: q [B, S, H, D]; k, v [B, T, K, D] (T = S in self-attention). K heads
of keys and values, K dividing H: each is read by G = H/K query heads, query
head h by key/value head h // G (grouped-query attention, Ainslie et al. 2023,
arxiv.org/abs/2305.13245). K = H is multi-head attention, one key per query
head; K = 1 is multi-query (Shazeer 2019, arxiv.org/abs/1911.02150). Fewer KV
heads shrink what a decoder caches by H/K; the FLOPs stay those of H heads,
as every query head still scores every key.

Five implementations compute the same thing (`IMPLEMENTATIONS`): the einsums
below, the reference; `jax.nn.dot_product_attention` (XLA's); cuDNN's flash
kernel on NVIDIA GPUs; JAX's Pallas splash-attention kernel on TPUs; and our
own Pallas flash kernel (sessions/kernels/flash.py), on either. The flash kernels never
write the [B, H, S, T] scores to memory. Which one a step runs, on which chip:
sessions/model/attention_choice.py.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from sessions.errors import UsageError
from sessions.kernels.flash import flash_attention


def attention_mask(S, T, segment_ids=None):
    """Which keys each query may see: bool [B or 1, 1, S, T].

    Causal: query s sees keys t <= s. With segment_ids ([B, S] ints; several
    documents packed in one row), a query also sees only keys of its own segment.
    """
    s = jnp.arange(S)[:, None]
    t = jnp.arange(T)[None, :]
    mask = (t <= s)[None, None, :, :]  # [1, 1, S, T]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, S, T]
        mask = mask & same[:, None, :, :]
    return mask


def einsum_attention(q, k, v, segment_ids=None):
    """Attention by hand; the reference every other implementation is checked against."""
    B, S, H, D = q.shape
    K = k.shape[2]
    mask = attention_mask(S, k.shape[1], segment_ids)
    if K == H:  # multi-head: one key/value head per query head
        scores = jnp.einsum("BSHD,BTHD->BHST", q, k, preferred_element_type=jnp.float32)
        probs = masked_softmax(scores * D**-0.5, mask).astype(v.dtype)
        return jnp.einsum("BHST,BTHD->BSHD", probs, v)
    # Grouped: the H query heads as [K, G], query head h = k·G + g reading KV head k,
    # so no key or value is copied. (Not taken at K = H: a unit G changes the order in
    # which XLA's CPU matmul sums, by an ulp, and K = H must stay today's attention.)
    q = q.reshape(B, S, K, H // K, D)
    scores = jnp.einsum("BSKGD,BTKD->BKGST", q, k, preferred_element_type=jnp.float32)
    probs = masked_softmax(scores * D**-0.5, mask[:, :, None]).astype(v.dtype)
    return jnp.einsum("BKGST,BTKD->BSKGD", probs, v).reshape(B, S, H, D)


def masked_softmax(scores, mask):
    """float32 scores [..., S, T] -> probabilities over T, zero where mask is false.

    Scores and softmax in float32 even when q, k are bfloat16: exp() of a bf16
    logit loses the small differences that decide where attention goes."""
    # A large negative number, not -inf: a fully masked row would give NaN.
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)


def cached_probs(old, new, pos):
    """A decoder's softmax, float32 [..., S, T + S]: scores old [..., S, T] over the
    cache, whose slots before pos are filled, and new [..., S, S] over the S new
    tokens themselves (causal), both already scaled, as one softmax over T + S keys."""
    S, T = new.shape[-1], old.shape[-1]
    filled = jnp.broadcast_to(jnp.arange(T) < pos, (S, T))
    causal = jnp.arange(S)[None, :] <= jnp.arange(S)[:, None]
    return masked_softmax(
        jnp.concatenate([old, new], axis=-1), jnp.concatenate([filled, causal], -1)
    )


def fused_attention(q, k, v, segment_ids=None):
    """The library call, `jax.nn.dot_product_attention`, in XLA's implementation
    (JAX's default, on every backend): the same einsums as above, with XLA free
    to fuse them; it takes K < H key/value heads itself, grouped as above. The
    flash kernels below are asked for by name."""
    mask = None if segment_ids is None else attention_mask(q.shape[1], k.shape[1], segment_ids)
    causal = segment_ids is None  # the mask, when given, already is causal
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)


def cudnn_attention(q, k, v, segment_ids=None):
    """cuDNN's fused flash attention (NVIDIA, bf16/fp16), asked for by name: no
    fallback, so a step compiled with it certainly runs it (`choose` checks the
    shapes first). Its forward and backward are the custom calls
    __cudnn$fmhaSoftmax and __cudnn$fmhaSoftmaxBackward in the compiled step.
    It takes K < H key/value heads itself, as jax.nn.dot_product_attention does."""
    mask = None if segment_ids is None else attention_mask(q.shape[1], k.shape[1], segment_ids)
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, is_causal=segment_ids is None, implementation="cudnn"
    )


def splash_kernel(q, k, v, segment_ids=None, *, interpret=False):
    """JAX's Pallas splash-attention kernel for TPUs, on one device's shard.

    The kernel works on one sequence at a time with heads first ([H, S, D]), so
    it is vmapped over B; it takes no softmax scale, so q arrives scaled. It
    skips the blocks the causal mask hides entirely. interpret=True runs the
    same kernel as plain JAX ops on any backend (slow; for checking it)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    k, v = repeat_kv(k, v, q.shape[2])
    _, S, H, D = q.shape
    T = k.shape[1]
    mask = splash.MultiHeadMask([splash.CausalMask((S, T))] * H)
    # Tiles of up to 512 queries x 512 keys, a multiple of 128 (the TPU's lanes) that
    # divides the sequence: 640 takes 128-wide tiles, not 512 (which would not divide it).
    bq, bt = (next((b for b in (512, 384, 256, 128) if n % b == 0), n) for n in (S, T))
    sizes = splash.BlockSizes(
        block_q=bq,
        block_kv=bt,
        block_kv_compute=bt,
        block_q_dkv=bq,
        block_kv_dkv=bt,
        block_kv_dkv_compute=bt,
        block_q_dq=bq,
        block_kv_dq=bt,
    )
    kernel = splash.make_splash_mha(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)  # [B,S,H,D] <-> [B,H,S,D]
    q = (q * D**-0.5).astype(k.dtype)
    if segment_ids is None:
        out = jax.vmap(kernel)(heads_first(q), heads_first(k), heads_first(v))
    else:
        ids = splash.SegmentIds(q=segment_ids, kv=segment_ids)
        out = jax.vmap(kernel)(heads_first(q), heads_first(k), heads_first(v), segment_ids=ids)
    return heads_first(out)


def repeat_kv(k, v, heads):
    """k, v [B, T, K, D] -> [B, T, H, D], KV head h // G for query head h (G = H/K).

    For the kernels that take one key head per query head (the multi-head
    splash kernel, our flash kernel): each device repeats its own K/tp heads to
    its H/tp, after the split, so nothing crosses a link. The copies cost G x
    the bytes of k and v in training, [B, T, H, D] arrays the size of q; the
    KV cache, which grouped-query attention exists to shrink, never holds them.
    With K = H: k and v as they are."""
    G = heads // k.shape[2]
    return (k, v) if G == 1 else (jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2))


def on_each_device(local, q, k, v, segment_ids):
    """local(q, k, v, segment_ids) on each device's own rows (data, fsdp) and heads (tp),
    as the activations are laid out (sessions/shard/sharding.py): a Pallas kernel is one
    device's program, which XLA's partitioner cannot split. q's H heads and k's and
    v's K heads are split alike: each device holds the KV heads its query heads read."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.are_all_axes_manual:  # one device, or already one device's part
        return local(q, k, v, segment_ids)
    qkv = P(("data", "fsdp"), None, "tp", None)
    ids = None if segment_ids is None else P(("data", "fsdp"), None)
    # check_vma=False: the Pallas call does not say how its output varies over the mesh.
    return jax.shard_map(local, in_specs=(qkv, qkv, qkv, ids), out_specs=qkv, check_vma=False)(
        q, k, v, segment_ids
    )


def splash_attention(q, k, v, segment_ids=None):
    """The splash kernel over a mesh (`on_each_device`). On a TPU the kernel is
    compiled; lowered for any other platform it runs interpreted, as the same
    arithmetic."""

    def local(q, k, v, segment_ids):
        return jax.lax.platform_dependent(
            q,
            k,
            v,
            segment_ids,
            tpu=functools.partial(splash_kernel, interpret=False),
            default=functools.partial(splash_kernel, interpret=True),
        )

    return on_each_device(local, q, k, v, segment_ids)


def pallas_attention(q, k, v, segment_ids=None):
    """Our own Pallas flash kernel (sessions/kernels/flash.py) over a mesh: Mosaic on a TPU,
    Triton on an NVIDIA GPU, interpreted on a CPU. Causal only: packed documents
    (segment_ids) are not among what it takes."""
    if segment_ids is not None:
        raise UsageError("our Pallas flash attention is causal only: no segment_ids")

    def local(q, k, v, _):
        return flash_attention(q, *repeat_kv(k, v, q.shape[2]))

    return on_each_device(local, q, k, v, None)


IMPLEMENTATIONS = {
    "einsum": einsum_attention,
    "fused": fused_attention,
    "cudnn": cudnn_attention,
    "splash": splash_attention,
    "pallas": pallas_attention,
}


def attention(q, k, v, segment_ids=None, impl="einsum"):
    """Causal attention. q: [B, S, H, D], k, v: [B, T, K, D] -> [B, S, H, D]."""
    return IMPLEMENTATIONS[impl](q, k, v, segment_ids)

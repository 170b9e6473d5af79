"""Session 5's napkin: what grouped-query attention and int8 do to decode's
bytes, to the critical batch, and to whether a published model fits a chip.

Session 3's decode step reads W + B·C bytes: the weights once (W), and each
of the B sequences' KV cache (C). Both can shrink:

- Grouped-query attention: K key/value heads, each shared by G = H/K query
  heads (K must divide H). The cache holds K heads, not H:
  C = 2·L·T·K·D·bytes per sequence. K = H is session 3's attention, K = 1
  multi-query attention.
- int8 weights: 1 byte per value, plus one float32 scale (4 bytes) per
  output channel, a row of a decode weight [out, in] (solutions/quantize.py).

Memory: a chip holds the weights once and a cache per sequence, so
B <= (HBM − W) / C sequences fit. Time: the step is compute-bound from

    B* = (W / bandwidth) / (f / peak − C / bandwidth)

(session 3's formula; f is one sequence's FLOPs per step). W is not in the
denominator: int8 weights move B* by W's ratio alone, while a smaller cache
(GQA, an int8 cache) widens the margin f / peak − C / bandwidth.

GB here are 10^9 bytes, as chips' datasheets count (a GiB is 2^30).
roofline/decode_cost.py counts the same for a ModelConfig.
"""

import math

# Meta's LLaMA-3-8B, as its config.json gives it
# (huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json): num_hidden_layers 32,
# hidden_size 4096, intermediate_size 14336, num_attention_heads 32,
# num_key_value_heads 8, vocab_size 128256, max_position_embeddings 8192,
# tie_word_embeddings false; head_dim = hidden_size / num_attention_heads = 128. Its
# feed-forward is gated (SwiGLU: three [E, F] matrices) and its norms are RMSNorm (one
# scale of E each: two per layer, one at the end).
LLAMA3_8B = {
    "layers": 32,
    "embed": 4096,
    "ff": 14336,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 128256,
    "seq": 8192,
}


def gqa_cache_bytes(layers, batch, context, heads, kv_heads, head_dim, bytes_per_value):
    """Bytes of a KV cache under grouped-query attention: an int.

    A key and a value of [kv_heads, head_dim] per layer, sequence and
    position: 2·L·B·T·K·D·bytes. The query heads H do not appear; they only
    say which K are allowed: raise ValueError when kv_heads does not divide
    heads.
    """
    raise NotImplementedError


def sequences_that_fit(hbm_bytes, weight_bytes, cache_bytes_per_sequence):
    """How many sequences' caches fit beside the weights in hbm_bytes: an int,
    0 when the weights alone do not fit.

    Hint: math.floor((HBM − W) / C).
    """
    raise NotImplementedError


def int8_weight_bytes(matmul_shapes, other_params, other_bytes=2):
    """Bytes of the weights with every matmul weight in int8: an int.

    matmul_shapes: a list of (out, in), one per matmul weight in its decode
    layout; each counts out·in bytes of int8 values and 4·out bytes of
    float32 scales. other_params (norm scales and the like) stay in the
    compute dtype, other_bytes each.
    """
    raise NotImplementedError


def critical_batch_int8(
    matmul_shapes, other_params, cache_bytes_per_sequence, flops_per_sequence, peak_flops, bandwidth
):
    """B*, the batch from which decode is compute-bound, with the weights in
    bfloat16 and in int8: (bf16, int8), two floats, or (None, None) when no
    batch is.

    W is what a step reads: the matmul weights (an untied output projection
    among them) and the others (norms); an embedding table is a lookup of B
    rows, not read whole, so it is not in matmul_shapes. W in bfloat16 is 2
    bytes per parameter; in int8, int8_weight_bytes. Both use B* = (W / bw) / (f / peak − C / bw),
    and None when f / peak − C / bw <= 0. Their ratio is W's. peak is the
    compute dtype's: int8 weights are multiplied in bfloat16 too.
    """
    raise NotImplementedError


def published_params(model):
    """The parameters of a LLaMA-style model (a dict like LLAMA3_8B): an int.

    Per layer: wq [E, H·D], wk and wv [E, K·D], wo [H·D, E], three
    feed-forward matrices of [E, F] (gated), two norm scales of E. Then the
    embedding [V, E], an output projection of its own [E, V] (untied), and
    the final norm's E. LLaMA-3-8B has about 8.03 billion.
    """
    raise NotImplementedError


def decode_fits(model, batch, context, hbm_gib, bytes_per_param=2, bytes_per_cache_value=2):
    """Whether the model's decode of `batch` sequences of `context` tokens fits
    a chip of hbm_gib GiB: (GB needed, a float; fits, a bool).

    Needed: every parameter (published_params, bytes_per_param each) plus the
    KV cache of the model's own K (gqa_cache_bytes), in GB of 10^9 bytes, as the
    planners print it. The chip's memory is in the vendor's unit: NVIDIA's "80GB"
    H100 holds 80 GiB, 80·2^30 bytes. Fits when the bytes needed <= hbm_gib·2^30.
    (int8's per-channel scales add under 0.1% to LLaMA-3-8B's weights; this
    napkin leaves them out.)
    """
    raise NotImplementedError

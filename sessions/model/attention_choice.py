"""Which attention runs where: the implementation a step takes on its chip.

sessions/model/attention.py holds five implementations of the same causal attention.
They are not all available everywhere: cuDNN's flash kernel runs on NVIDIA
GPUs in bfloat16, the splash kernel on TPUs for sequences that fill its
128-wide tiles, our Pallas kernel for the head dims it was written for.
`choose` picks one for the chip the step is compiled for, which need not be
this machine's, and says why when it falls back to XLA's; `choose_for_length`
keeps a model's kernel at inference only for the prompt lengths and the
platform it takes.
"""

import jax
import jax.numpy as jnp

from sessions.errors import UsageError
from sessions.kernels.flash import HEAD_DIMS, default_tiles
from sessions.model.attention import cudnn_attention

KERNEL_PLATFORM = {"cudnn": "gpu", "splash": "tpu"}


def kernel_refusal(impl, cfg, batch, seq=None):
    """Why `impl` cannot take `batch` sequences of `seq` tokens (None: cfg.seq;
    a prompt's length at inference) on its chip, or None if it can."""
    S = cfg.seq if seq is None else seq
    if impl == "pallas" and cfg.head_dim not in HEAD_DIMS:
        return (
            f"our Pallas flash attention takes head dims "
            f"{' and '.join(map(str, HEAD_DIMS))}, not {cfg.head_dim}"
        )
    if impl == "splash" and S % 128:
        # Its tiles are 128 keys wide (the TPU's lanes); the sequence must fill them.
        return f"splash attention needs a sequence divisible by 128, not {S}"
    if impl == "cudnn":
        if cfg.dtype != "bfloat16":
            return f"cuDNN's flash attention needs bfloat16 or float16, not {cfg.dtype}"
        shape = jax.ShapeDtypeStruct((batch, S, cfg.heads, cfg.head_dim), jnp.bfloat16)
        try:  # cuDNN's own checks (head dim, sequence, library version) run at trace time
            jax.eval_shape(cudnn_attention, shape, shape, shape)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"cuDNN's flash attention refused the shapes: {first}"
    return None


def pallas_note(platform, S):
    """The header's line for our kernel: which tiles it runs, and how."""
    how = {"tpu": "Mosaic", "gpu": "Triton", "cpu": "interpreted: slow"}[platform]
    bq, bk = default_tiles(S)
    tiles = f"tiles {bq} x {bk} (queries x keys)"
    return f"our Pallas flash kernel (sessions/kernels/flash.py, {how}), {tiles}"


def choose(requested, platform, cfg, batch, seq=None):
    """(implementation, note) for a step compiled for `platform` ("cpu", "gpu", "tpu"),
    over `batch` sequences of `seq` tokens (None: cfg.seq).

    requested None or "fused" means the fastest the chip has: cuDNN's flash
    kernel on NVIDIA in bf16, the splash kernel on TPU, where they take the
    shapes; else XLA's fused call, with a note saying why. "einsum" is always
    honoured; asking for a kernel of another chip is a usage error."""
    if requested == "einsum" or (requested is None and platform == "cpu"):
        return "einsum", None
    if requested == "pallas":  # every platform: compiled on GPU and TPU, interpreted on CPU
        refusal = kernel_refusal("pallas", cfg, batch, seq)
        if refusal:
            raise UsageError(refusal)
        return "pallas", pallas_note(platform, cfg.seq if seq is None else seq)
    if requested in KERNEL_PLATFORM and KERNEL_PLATFORM[requested] != platform:
        raise UsageError(
            f"the {requested} attention kernel runs on {KERNEL_PLATFORM[requested].upper()}s, "
            f"not on this step's {platform.upper()}"
        )
    kernel = (
        requested
        if requested in KERNEL_PLATFORM
        else {"gpu": "cudnn", "tpu": "splash"}.get(platform)
    )
    if kernel is None:
        return "fused", None
    refusal = kernel_refusal(kernel, cfg, batch, seq)
    if refusal is None:
        return kernel, None
    if requested == kernel:
        raise UsageError(refusal)
    return "fused", f"{refusal}: XLA's fused attention instead"


def xla_attention(platform):
    """XLA's own attention on `platform`: the einsums on a CPU (what every implementation
    is checked against), its fused call on a GPU or TPU."""
    return "einsum" if platform == "cpu" else "fused"


def choose_for_length(cfg, platform, batch, seq):
    """(implementation, note) for `batch` sequences of `seq` tokens on `platform`,
    in a model built for cfg.attention_impl: inference's prefill, whose prompts
    and sliding windows (kv_cache.generate) are not the training step's length.

    The configured kernel wherever it takes them: splash on any platform (off a
    TPU it runs interpreted, the same arithmetic: splash_attention), cuDNN on a
    GPU only (it has no interpreter). Else XLA's attention: "fused", as `choose`
    falls back to for the step, on GPU and TPU; on a CPU the einsums, which
    `choose` gives the CPU's step and every implementation is checked against."""
    impl = cfg.attention_impl
    if impl not in KERNEL_PLATFORM:
        return impl, None
    if impl == "cudnn" and platform != "gpu":
        refusal = f"cuDNN's flash attention runs on NVIDIA GPUs, not on a {platform.upper()}"
    else:
        refusal = kernel_refusal(impl, cfg, batch, seq)
    if refusal is None:
        return impl, None
    xla = xla_attention(platform)
    return xla, f"{refusal}: {xla} attention instead"


def platform_of(params):
    """The platform ("cpu", "gpu", "tpu") of the device holding the weights, where
    prefill runs."""
    w = jax.tree.leaves(params)[0]
    return next(iter(w.devices())).platform if isinstance(w, jax.Array) else jax.default_backend()

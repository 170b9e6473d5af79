"""The course's choices per platform: preset, dtype, corpus and attention, where no flag names them.

    run = configs_for("gpu", device, preset=None, dtype=None, ...)   # Resolved(preset, model, ...)

A CPU trains the `cpu` preset (a few minutes on two cores) in float32 with einsum
attention, over CPython's docs. A GPU or TPU trains the `course` preset in bfloat16
with its flash kernel (sessions/model/attention_choice.py), over the standard library's
source. An NVIDIA GPU below compute capability 8.0 (T4: 7.5, V100: 7.0) has no bf16
tensor cores and cannot run cuDNN's flash attention, so a run there takes float32 and
XLA's attention (`capability_defaults`). Inference serves with XLA's attention
(`serving_attention`). The flags' values come in as values: sessions/run/cli.py parses
them and calls `configs_for`.
"""

import dataclasses
from typing import NamedTuple

from sessions.errors import UsageError
from sessions.model.attention_choice import choose, xla_attention
from sessions.model.config import PRESETS, ModelConfig, TrainConfig
from sessions.train.data import DOCS, STDLIB

# Compute capability 8.0 (Ampere) is where bf16 tensor cores begin, and where cuDNN's fused
# attention begins: "cudnn SDPA operation requires SM80 (Ampere) or newer architectures"
# (docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html). JAX's own
# trace-time checks of that kernel test head dim and sequence, not this.
AMPERE = (8, 0)
ATTENTION_WORDS = {
    "fused": "XLA's attention",
    "einsum": "einsum attention",
    "pallas": "our Pallas flash attention",
}


@dataclasses.dataclass(frozen=True)
class Defaults:
    dtype: str | None  # matmul dtype; None: the platform's usual default
    attention_impl: str | None  # use as is; None: sessions.model.attention_choice.choose picks
    note: str | None  # one header line saying why the usual defaults do not hold


def compute_capability(device):
    """(major, minor) of an NVIDIA GPU, or None (a CPU, a TPU, a GPU that does not say).

    jax's CUDA devices carry it as a string attribute, "7.5": XLA's GPU client builds it
    as major "." minor (xla/pjrt/gpu/se_gpu_pjrt_client.cc, MakeComputeCapabilityString),
    and jax's cuDNN attention reads it so (jax/_src/cudnn/fused_attention_stablehlo.py,
    check_compute_capability). A ROCm GPU's ("gfx90a") is not a number: None."""
    text = getattr(device, "compute_capability", None)
    if device is None or device.platform != "gpu" or not isinstance(text, str):
        return None
    try:
        major, minor = (int(part) for part in text.split("."))
    except ValueError:
        return None
    return major, minor


def capability_defaults(device, dtype=None, attention_impl=None):
    """Defaults for a run on `device`, given the --dtype and --attention-impl asked
    for (None where not given). device None (a step compiled for a chip this machine
    lacks, --target; those are all 8.0+) keeps what was asked.

    Below compute capability 8.0: float32 and XLA's attention ("einsum" is kept if
    asked for), with a note for the header. An explicit --dtype bfloat16 is honoured
    with a warning in the note: XLA computes its matmuls in float32 there, correct
    and slower (github.com/jax-ml/jax/issues/21212), and the attention is still
    XLA's. --attention-impl cudnn cannot run there at all: a UsageError."""
    cc = compute_capability(device)
    if cc is None or cc >= AMPERE:
        return Defaults(dtype, None, None)
    chip = f"{device.device_kind} is compute capability {cc[0]}.{cc[1]}"
    if attention_impl in ("cudnn", "splash"):
        need = "8.0+" if attention_impl == "cudnn" else "a TPU"
        raise UsageError(
            f"--attention-impl {attention_impl}: {chip}; that kernel needs {need} "
            "(fused or einsum run here)"
        )
    attention = attention_impl or "fused"
    if dtype == "bfloat16":
        note = (
            f"{chip}: no bf16 tensor cores, so XLA computes the bfloat16 matmuls in "
            f"float32, slower than --dtype float32; {ATTENTION_WORDS[attention]}, as "
            "cuDNN flash attention needs 8.0+"
        )
        return Defaults("bfloat16", attention, note)
    dtype = dtype or "float32"
    note = (
        f"{chip}: cuDNN flash attention and bf16 matmuls need 8.0+; {dtype} and "
        f"{ATTENTION_WORDS[attention]}"
    )
    return Defaults(dtype, attention, note)


class Resolved(NamedTuple):
    preset: str
    model: ModelConfig
    train: TrainConfig
    attention_note: str | None  # one header line when the attention is not the usual choice
    data: str  # the corpus: "docs", "stdlib" or a path (sessions/train/data.py)


def configs_for(
    platform,
    device=None,
    *,
    preset=None,
    dtype=None,
    attention_impl=None,
    data=None,
    model_fields=None,
    train_fields=None,
):
    """Resolved for a run on `platform` ("cpu", "gpu", "tpu"). device: the device it
    runs on, whose generation may change the defaults (None: a chip compiled for, not
    this machine's). preset, dtype, attention_impl, data: the flags' values (None: not
    given). model_fields, train_fields: ModelConfig and TrainConfig fields set over the
    preset's; an `attention_impl` among model_fields is taken as it is (serving's)."""
    model_fields, train_fields = model_fields or {}, train_fields or {}
    on_cpu = platform == "cpu"
    preset = preset or ("cpu" if on_cpu else "course")
    train = dataclasses.replace(PRESETS[preset].train, **train_fields)
    caps = capability_defaults(device, dtype, attention_impl)
    stored = None if train.weights == "float32" else train.weights  # computed as stored
    if stored and caps.dtype == "float32":
        raise UsageError(f"--weights {stored} computes in {stored}, not float32: drop --dtype")
    dtype = caps.dtype or stored or ("float32" if on_cpu else "bfloat16")
    model = dataclasses.replace(PRESETS[preset].model, **{"dtype": dtype, **model_fields})
    if caps.attention_impl:  # below compute capability 8.0: XLA's attention
        impl, note = caps.attention_impl, caps.note
    elif "attention_impl" in model_fields:
        impl, note = model_fields["attention_impl"], None
    else:
        impl, note = choose(attention_impl, platform, model, train.batch)
    # The docs on a CPU, whose losses the guides quote; on a chip, whose default
    # run would pass over the docs 35 times, the standard library's source.
    corpus = data or (DOCS if on_cpu else STDLIB)
    return Resolved(preset, dataclasses.replace(model, attention_impl=impl), train, note, corpus)


def serving_attention(platform):
    """The attention inference serves with on `platform`: XLA's, never a chip's own
    kernel, because a checkpoint may name the kernel of another chip."""
    return xla_attention(platform)

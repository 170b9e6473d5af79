"""Configuration: the model's shapes and the run's knobs, as frozen dataclasses.

Frozen means hashable, so a ModelConfig can be a static argument of `jax.jit`:
changing a shape is a new program, changing a weight is not.

The dimension alphabet used everywhere in this repo (einsum letters):

    B batch   S sequence (query)   T key/value sequence   E embed
    F feed-forward   H heads   K key/value heads   G = H / K query heads per
    key/value head   D head dim   V vocab   L layers
"""

import dataclasses

from sessions.errors import UsageError
from sessions.model.remat import REMAT_POLICIES as REMAT_POLICIES  # the flags' list
from sessions.model.remat import remat_error

# Session 6's fields of ModelConfig: how the step holds and compiles the layers, never
# the weights' values, so a checkpoint continues under any of them.
LEVERS = ("remat", "scan_layers", "loss_chunks", "sequence_parallel")
# ... and its fields of TrainConfig: how the batch runs and the weights are stored.
TRAIN_LEVERS = ("accum", "weights", "master", "offload")
WEIGHTS = ("float32", "bfloat16")  # how the weights are stored (TrainConfig.weights)
OFFLOADS = ("none", "optimizer")  # what the step keeps in host memory (TrainConfig.offload)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256  # byte-level tokens: no tokenizer to install
    embed: int = 256  # E
    ff: int = 1024  # F
    heads: int = 4  # H
    head_dim: int = 64  # D
    layers: int = 4  # L
    seq: int = 128  # S, the longest context the model sees
    attention: bool = True  # False gives session 1's feed-forward-only block
    positions: bool = True  # False drops the learned positional embedding
    dtype: str = "float32"  # compute dtype of the matmuls; params stay float32
    # "einsum" writes attention out by hand; "fused" is jax.nn.dot_product_attention
    # (XLA's); "cudnn" and "splash" are the flash kernels of NVIDIA GPUs and TPUs
    # (sessions/model/attention.py; `choose` picks one for the chip the step is built for);
    # "pallas" is our own flash kernel (sessions/kernels/flash.py), on any of them.
    attention_impl: str = "einsum"
    # Session 5's levers; each default keeps sessions 1-4 as they were.
    kv_heads: int | None = None  # K: heads of keys and values (None: H, one per query head)
    rope: bool = False  # with positions: rotary positions (RoPE), not a learned table
    rope_base: float = 10_000.0  # RoPE's base wavelength (LLaMA-3: 500,000)
    gated: bool = False  # SwiGLU feed-forward: silu(x·W_gate) * (x·W_in), then W_out
    tied: bool = True  # the output projection is the embedding's transpose (False: its own)
    # Session 6's lever, which changes no arithmetic: what each layer keeps for the backward
    # (sessions/model/remat.py): everything (none), its matmuls' outputs (dots), its input
    # alone (block), MaxText's policies, or the tensors names:a,b names; the backward
    # recomputes the rest.
    remat: str = "none"
    # ... and the layers as one compiled body under lax.scan, their weights stacked on a
    # leading L axis: remat's rebuilding then runs in the backward on every compiler.
    scan_layers: bool = False
    # ... and the loss over this many chunks of each sequence, one chunk's logits [B, S/N, V]
    # alive at a time, rebuilt in the backward (sessions/train/chunked_loss.py).
    loss_chunks: int = 1
    # ... and between the blocks, the residual stream split along the sequence over the tp
    # axis (Megatron's sequence parallelism: sessions/shard/sharding.py SEQUENCE_PARALLEL_SPECS).
    sequence_parallel: bool = False

    def __post_init__(self):
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            divisors = ", ".join(str(k) for k in range(1, self.heads + 1) if self.heads % k == 0)
            raise UsageError(
                f"--kv-heads {self.kv_heads} must divide the {self.heads} query heads "
                f"(try {divisors})"
            )
        if why := remat_error(self):
            raise UsageError(why)
        if self.rope and self.head_dim % 2:  # RoPE turns the head's dims in pairs
            raise UsageError(f"--rope needs an even --head-dim, not {self.head_dim}")
        if self.loss_chunks < 1 or self.seq % self.loss_chunks:
            divisors = [n for n in range(1, min(self.seq, 64) + 1) if self.seq % n == 0]
            raise UsageError(
                f"--loss-chunks {self.loss_chunks} must divide the sequence's {self.seq} "
                f"tokens, the same chunks in every row (try {', '.join(map(str, divisors))})"
            )

    @property
    def n_kv_heads(self):
        """K, the key/value heads the cache holds: cfg.kv_heads, or H when unset."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def learned_positions(self):
        """Whether positions come from a learned table `pos` of seq rows (not rotary, not
        none): the one kind of model that cannot run past seq positions."""
        return self.positions and not self.rope


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch: int = 32  # sequences per step, across all devices
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    clip: float = 1.0  # global gradient-norm clip
    seed: int = 0
    log_every: int = 50
    eval_every: int = 200  # validation loss every this many steps
    eval_batches: int = 4
    # Session 6's lever: the batch as this many microbatches, one after another, their
    # gradients summed in float32 for one update (sessions/train/step.py accumulate).
    accum: int = 1
    # ... and how each weight is stored: float32, cast to the compute dtype inside the step
    # (the course's mixed precision); or bfloat16, the optimizer's arithmetic in float32
    # on a float32 master copy it holds (master), or on the bf16 weights themselves
    # (sessions/train/master_weights.py). bfloat16 weights compute in bfloat16.
    weights: str = "float32"
    master: bool = False
    # ... and the optimizer's state kept in host memory between steps, fetched to the chip
    # for the update and sent back (sessions/train/offload.py): "none" or "optimizer".
    offload: str = "none"

    def __post_init__(self):
        if self.accum < 1 or self.batch % self.accum:
            raise UsageError(f"--accum {self.accum} must divide --batch {self.batch}")
        if self.weights not in WEIGHTS:
            raise UsageError(f"--weights {self.weights}: float32 or bfloat16")
        if self.master and self.weights == "float32":
            raise UsageError(
                "--master keeps a float32 copy of bfloat16 weights: add --weights bfloat16"
            )
        if self.offload not in OFFLOADS:
            raise UsageError(
                f"--offload {self.offload}: none or optimizer (the step offloads the optimizer's "
                "state; activations are the planner's: roofline memory --offload)"
            )

    @property
    def stored(self):
        """How the weights are stored, in words: "bfloat16 weights + float32 master"."""
        return f"{self.weights} weights" + " + float32 master" * self.master


@dataclasses.dataclass(frozen=True)
class Preset:
    model: ModelConfig
    train: TrainConfig
    note: str


# Named shapes. Explicit command-line flags override any field.
PRESETS = {
    # Tests and smoke runs: compiles in a second, learns below the unigram
    # baseline in a few dozen steps, and divides over fsdp=8 or tp=2.
    "tiny": Preset(
        ModelConfig(embed=48, ff=96, heads=4, head_dim=12, layers=2, seq=64),
        TrainConfig(steps=60, batch=16, lr=1e-2, warmup=5, log_every=10, eval_every=30),
        "test shapes, seconds on any machine",
    ),
    # The default on a CPU: 3.1 minutes on a 2-core Zen 4, validation loss 1.31 nats/byte
    # when the docs held out their last tenth, 1.26 on a tenth of every 10 KB (Python
    # 3.11; docs/results.md, "The CPU default run"). The docs are 0.42 MB, so a run's
    # loss is bound by its tokens (600 x 4,096: 5.9 passes), hardly by its width: at
    # E=256 (3.2M params, 85 GFLOP a step) it reached 1.27 in 2.9x the time. 2 heads of
    # 64, not 4 of 32: the same FLOPs and loss (1.31), 1.1-1.2x faster, as XLA's CPU
    # matmuls contracting D=32 run further below the peak.
    "cpu": Preset(
        ModelConfig(embed=128, ff=512, heads=2, head_dim=64, layers=4, seq=128),
        TrainConfig(steps=600, batch=32, lr=5e-3, warmup=50, log_every=50, eval_every=200),
        "default on CPU: about 3 minutes on 2 cores, validation loss near 1.25",
    ),
    # The class's shapes (HighPerfLLMs2024, session 2); the default on GPU/TPU, over
    # the stdlib. 450 steps of 32,768 bytes (14.7M) are 2.1 passes over the smallest
    # stdlib seen (7.04M training bytes: the H100's 3.12.3), within data.FRESH_PASSES.
    # On that H100 the gap between validation and training loss was +0.06 after 300
    # steps and +0.22 after 1,000 (docs/results.md, "Passes over the data"): 450 is
    # where it stays under data.MAX_GAP, by interpolation; no chip has run it yet. Logged every
    # 50 steps, for 8 intervals of tokens/s after the first (the steadiness figure).
    "course": Preset(
        ModelConfig(embed=512, ff=2048, heads=4, head_dim=128, layers=4, seq=128),
        TrainConfig(steps=450, batch=256, lr=1e-3, warmup=50, log_every=50, eval_every=150),
        "the course's shapes; default on GPU/TPU",
    ),
    # GPT-2 small's shapes on bytes: 85.9M parameters, where the published GPT-2 (gpt2,
    # below: 124M with its 50,257-token vocabulary) is the planner's alone. The same
    # 32,768 tokens a step as course: 800 steps are 3.7 passes over the smallest stdlib,
    # within data.FRESH_PASSES; its data is meant to be token files (docs/data.md).
    "gpt2-bytes": Preset(
        ModelConfig(embed=768, ff=3072, heads=12, head_dim=64, layers=12, seq=1024),
        TrainConfig(steps=800, batch=32, lr=6e-4, warmup=200, log_every=50, eval_every=200),
        "GPT-2 small's shapes on bytes (V=256), seq 1024",
    ),
}


@dataclasses.dataclass(frozen=True)
class Published:
    """A published model's shapes, for the planner (python -m roofline decode, predict):
    never trained here (our vocabulary is bytes), only counted."""

    model: ModelConfig  # its own config, bfloat16, the whole context as seq
    source: str  # where each shape was read: the model's config.json, or its paper
    batch: int  # sequences per training step, as published (predict's default --batch)


# Hugging Face config.json keys -> ours: vocab_size V, hidden_size E, intermediate_size F,
# num_attention_heads H, num_key_value_heads K (absent: H), hidden_size / H = D,
# num_hidden_layers L, max_position_embeddings S, rope_theta, tie_word_embeddings.
HF_CONFIG = "https://huggingface.co/{}/blob/main/config.json"
LLAMA = {"rope": True, "gated": True, "tied": False, "dtype": "bfloat16"}
LLAMA2 = {"vocab": 32_000, "head_dim": 128, "seq": 4_096, **LLAMA}
LLAMA3 = {"vocab": 128_256, "head_dim": 128, "seq": 8_192, "rope_base": 500_000.0, **LLAMA}
# Training batches: GPT-2 paper (Radford et al. 2019, section 2.3), 512 sequences of
# 1,024; Llama 2 paper (Touvron et al. 2023, section 2.2), 4M tokens = 1,024 x 4,096;
# Llama 3 paper (Llama Team 2024, section 3.4.1) gives 405B's, 16M tokens at the end =
# 2,048 x 8,192, and no other size's: that batch stands in for theirs.
PUBLISHED = {
    # 124,337,664 parameters here: GPT-2's biases and LayerNorm shifts (102,144) are not
    # in our family, so it counts 0.08% fewer than GPT-2's own 124,439,808.
    "gpt2": Published(
        ModelConfig(
            vocab=50_257,
            embed=768,
            ff=3_072,
            heads=12,
            head_dim=64,
            layers=12,
            seq=1_024,
            dtype="bfloat16",
        ),
        HF_CONFIG.format("openai-community/gpt2"),
        512,
    ),
    "llama2-7b": Published(
        ModelConfig(embed=4_096, ff=11_008, heads=32, layers=32, **LLAMA2),
        HF_CONFIG.format("meta-llama/Llama-2-7b-hf"),
        1_024,
    ),
    "llama2-13b": Published(
        ModelConfig(embed=5_120, ff=13_824, heads=40, layers=40, **LLAMA2),
        HF_CONFIG.format("meta-llama/Llama-2-13b-hf"),
        1_024,
    ),
    "llama2-70b": Published(
        ModelConfig(embed=8_192, ff=28_672, heads=64, kv_heads=8, layers=80, **LLAMA2),
        HF_CONFIG.format("meta-llama/Llama-2-70b-hf"),
        1_024,
    ),
    "llama3-8b": Published(
        ModelConfig(embed=4_096, ff=14_336, heads=32, kv_heads=8, layers=32, **LLAMA3),
        HF_CONFIG.format("meta-llama/Meta-Llama-3-8B"),
        2_048,
    ),
    "llama3-70b": Published(
        ModelConfig(embed=8_192, ff=28_672, heads=64, kv_heads=8, layers=80, **LLAMA3),
        HF_CONFIG.format("meta-llama/Meta-Llama-3-70B"),
        2_048,
    ),
    # The smallest LLaMA: 1.24B parameters, a tied embedding, 128K positions (RoPE
    # rescaled, "rope_scaling": the counts do not see it). D = 64, its "head_dim".
    "llama3.2-1b": Published(
        ModelConfig(
            embed=2_048,
            ff=8_192,
            heads=32,
            kv_heads=8,
            layers=16,
            **{**LLAMA3, "head_dim": 64, "seq": 131_072, "tied": True},
        ),
        HF_CONFIG.format("meta-llama/Llama-3.2-1B"),
        2_048,
    ),
}

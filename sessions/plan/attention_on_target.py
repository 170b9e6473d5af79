"""Attention alone, compiled for a chip this machine lacks: what each
implementation needs in memory and how long the roofline says it takes, as
the sequence grows (session 4's table).

One attention layer's forward and backward at GPT-2's heads (H=12, D=64), in
bfloat16, with the tokens of a step held fixed (gpt2-bytes': 32 x 1,024) while S
grows, so every row does the same useful work and only the way of doing it
differs: the einsums write the [B, H, S, S] scores (and keep the probabilities
for the backward), which grows as B·S² = tokens·S; a flash kernel keeps a
[S] log-sum-exp instead. The memory is XLA's plan of the compiled program, the
time the per-op roofline of roofline/compiled/op_roofline.py; a program that does not
fit is the compiler's own out-of-memory verdict.

Beside each row, the matmul FLOPs the roofline found in the compiled program
against a count by hand: a causal flash attention does 7 matmuls of
B·H·S²·D multiply-adds over half the scores (forward: Q·Kᵀ, P·V; backward:
Q·Kᵀ again, dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q). The einsums do more (every score,
masked or not, and the softmax's backward); our kernel's backward runs in
loops whose length depends on the query block (the causal skip), which the
HLO reader cannot count, so its count falls short and its time is a floor.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from roofline.chip import chip_roofs
from roofline.compiled.op_roofline import predict_ops
from roofline.memory import planned_bytes
from roofline.units import capacity
from sessions.model.attention import attention
from sessions.plan import programs
from sessions.shard import sharding

SEQUENCES = (1024, 4096, 16384, 32768)  # the issue asks 1k, 4k, 16k; 32k shows the wall
TOKENS = 32 * 1024  # the gpt2-bytes preset's step: 32 sequences of 1,024
HEADS, HEAD_DIM = 12, 64  # GPT-2's


class AttentionRow(NamedTuple):
    impl: str
    seq: int
    batch: int
    bytes: int | None  # per device, by XLA's plan; None when it does not fit
    seconds: float | None  # the per-op roofline's prediction
    verdict: str | None  # the compiler's out-of-memory line, or why it could not compile
    counted_flops: float | None = None  # matmul FLOPs the roofline found in the program

    @property
    def flash_flops(self):
        """7 matmuls of 2·B·H·S²·D over the causal half of the scores."""
        return 7 * self.batch * HEADS * self.seq**2 * HEAD_DIM


def attention_program(impl):
    """Forward and backward of one causal attention layer: q, k, v -> (loss, grads)."""

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, impl=impl).astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def attention_on_target(impl, seq, target, devices, say=print):
    """One AttentionRow: `impl` at sequence length `seq`, compiled for one device of `target`."""
    batch = max(TOKENS // seq, 1)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tp": 1}, devices=np.array(devices[:1]))
    shape = jax.ShapeDtypeStruct((batch, seq, HEADS, HEAD_DIM), jnp.bfloat16)
    try:
        compiled, oom, _ = programs.compile_or_oom(
            attention_program(impl), (shape, shape, shape), {}, mesh, target.chip, say
        )
    except Exception as e:  # a kernel that refuses these shapes on this chip
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return AttentionRow(impl, seq, batch, None, None, first)
    if compiled is None:
        return AttentionRow(impl, seq, batch, None, None, oom)
    predicted = predict_ops(compiled.as_text(), chip_roofs(target.chip, "bfloat16"))
    held = planned_bytes(compiled.memory_analysis())
    return AttentionRow(impl, seq, batch, held, predicted.step_s, None, predicted.matmul_flops[1])


def attention_table_lines(rows, target):
    """The table s4_kernels.py prints: one line per (S, implementation)."""
    hbm = target.hbm_per_device
    lines = [
        f"attention alone on {target.name} ({capacity(hbm, decimal=False)} per device), "
        f"forward + backward, H={HEADS} D={HEAD_DIM} bf16, {TOKENS:,} tokens a step:",
        f"  {'S':>6} {'B':>3} {'implementation':<15} {'memory':>10} {'predicted':>11}"
        f"  {'matmul TFLOP counted / by hand':>31}",
    ]
    for r in rows:
        if r.bytes is None:
            shown = f"does not fit: {r.verdict}" if r.verdict else "n/a"
            lines.append(f"  {r.seq:>6} {r.batch:>3} {r.impl:<15} {shown}")
            continue
        fits = "" if r.bytes <= hbm else "  (over the HBM)"
        lines.append(
            f"  {r.seq:>6} {r.batch:>3} {r.impl:<15} {r.bytes / 1e9:>7.2f} GB "
            f"{r.seconds * 1e3:>8.2f} ms  {r.counted_flops / 1e12:>20.2f} / "
            f"{r.flash_flops / 1e12:.2f}{fits}"
        )
    if any(r.impl == "pallas" and r.counted_flops for r in rows):
        lines.append(
            "  pallas: the roofline counts its forward kernel; its backward's loops run as many "
            "key blocks as each query block needs (the causal skip), a length the HLO reader "
            "cannot read, so its count falls short and its time is a floor"
        )
    return lines

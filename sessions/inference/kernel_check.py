"""Our decode kernels beside XLA's step where they can only be interpreted: one decode each.

On a CPU, --decode-impl pallas runs the kernels (sessions/kernels/decode_attention.py and
decode_mlp.py) in Mosaic GPU's interpreter, which steps through each kernel's program on
the host: about 3 s a step at the cpu preset (16 steps in 47 s, compile included, measured
on the course's 2-core machine), where XLA's step takes a few ms; neither says what a GPU
would do. So sessions/s3_infer.py times nothing there. It decodes once with the kernels
and once with XLA's step, from the same prefilled cache with the same key, and says what
the kernels are: the same tokens as XLA's or not, how far apart the last logits are, and
where each kernel is written. What they would launch on a GPU is read off the decode
compiled for one (sessions/plan/kernels_on_target.py).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sessions.inference import kernel_step, kv_cache


class Compared(NamedTuple):
    """Our kernels' decode against XLA's, of the same prompts from the same key."""

    ours: np.ndarray  # int [B, P + n]: the prompts and the kernels' n new tokens
    xla: np.ndarray  # int [B, P + n]: the same, from XLA's step
    new: int  # n, the new tokens of each row
    parted_at: int | None  # the first new token where any row differs (0 is the first); None: none
    logit_gap: float  # largest |ours - XLA's| of the logits the last step made
    logit_top: float  # largest |XLA's| of those logits: the scale of the gap


def compare_decodes(ours, xla, ours_logits, xla_logits, start):
    """Compared from two decodes: tokens int [B, T] (the first `start` the prompt's) and
    each one's last logits float32 [B, V]."""
    ours, xla = np.asarray(ours), np.asarray(xla)
    differ = np.flatnonzero((ours != xla).any(axis=0)[start:])
    xla_logits = np.asarray(xla_logits, np.float32)
    gap = float(np.abs(np.asarray(ours_logits, np.float32) - xla_logits).max())
    parted_at = int(differ[0]) if differ.size else None
    return Compared(
        ours, xla, ours.shape[1] - start, parted_at, gap, float(np.abs(xla_logits).max())
    )


def decode_both(weights, params, prompts, n, key, temperature, cfg, impl):
    """Prefill the prompts int [B, P] once, then n decode steps from the same cache and key:
    with XLA's step, then with `impl`'s (kernel_step.IMPLS: "pallas-interpret" on a CPU)
    -> Compared. Sampled at `temperature` (0: greedy), each step's draw from the key and the
    position (kv_cache.pick), so the two pick the same token wherever their logits agree."""
    P = prompts.shape[1]
    logits, cache = kv_cache.prefill(params, prompts, cfg)
    tokens = jnp.pad(prompts, ((0, 0), (0, cfg.seq - P)))  # [B, T]: room for n more
    decoded = []
    for step in (None, impl):
        # decode_steps donates the cache and the tokens it is given: each decode gets its own.
        fresh_cache, fresh_tokens = jax.tree.map(jnp.copy, (cache, tokens))
        args = (weights, fresh_cache, fresh_tokens, logits, P, n, key, temperature, cfg)
        out_tokens, _, last_logits = kv_cache.decode_loop(*args, temperature == 0, step)
        decoded.append((out_tokens[:, : P + n], last_logits))
    (xla, xla_logits), (ours, ours_logits) = decoded
    return compare_decodes(ours, xla, ours_logits, xla_logits, P)


def compared_line(compared, temperature):
    """One line: whether our kernels' new tokens are XLA's, and the last logits' gap."""
    drawn = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}, one key"
    # Where they part, a near-tie broken the other way is enough; after it each decodes its own.
    parted = compared.parted_at
    same = "yes" if parted is None else f"NO, from new token {parted} on"
    gap = f"{compared.logit_gap:.3g} (XLA's largest {compared.logit_top:.3g})"
    return (
        f"the same {compared.new} new tokens a row as XLA's: {same} ({drawn}); "
        f"the last step's logits differ by at most {gap}"
    )


def kernel_files():
    """The files that hold our decode step and its kernels, as paths from the repository's
    root, each with what it holds: (path, what) pairs."""
    from sessions.kernels import decode_attention, decode_head, decode_mlp  # loads Mosaic GPU

    what = {
        kernel_step: "the step: two kernels a layer and the head, the embedding XLA's",
        decode_attention: "the attention half: norm, q/k/v, RoPE, the cache write, attention",
        decode_mlp: "the MLP half: norm, the MLP (gated or not)",
        decode_head: "the head: the last partials, the final norm, the logits",
    }
    return [(module.__name__.replace(".", "/") + ".py", said) for module, said in what.items()]

"""Generation with a model configured for a flash kernel: s2_train.py samples
with its training config, splash attention on a TPU, cuDNN's on a GPU. Prefill
runs the kernel only where it takes the prompt's length and the platform
(attention_choice.choose_for_length), else XLA's attention, and the tokens are those
of the einsum reference either way.

On this CPU the splash kernel runs interpreted (attention.splash_attention),
so its length rule is exercised for real: 21 tokens would fail in the kernel
itself (its key tiles must be multiples of 128), 128 run it. cuDNN cannot run
on a CPU at all: it must never be chosen here, whatever the length.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from roofline.plan.targets import missing_extras
from sessions.inference import kv_cache
from sessions.inference.sample import sample_text as generate_text
from sessions.model import attention, attention_choice, init_params
from sessions.model.config import ModelConfig

# Small and with sizes that differ pairwise; T = 256 leaves room after a
# 128-token prompt. Splash's interpreter takes the head dim as it comes.
REFERENCE = ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=256)
KERNELS = {
    "splash": dataclasses.replace(REFERENCE, attention_impl="splash"),
    # cuDNN's flash attention takes bfloat16 only (attention_choice.kernel_refusal).
    "cudnn": dataclasses.replace(REFERENCE, attention_impl="cudnn", dtype="bfloat16"),
}
N_NEW = 6


@pytest.fixture(scope="module")
def params():
    """Weights scaled up (as in test_inference.py), so greedy tokens wander and
    a wrong attention changes them."""
    return jax.tree.map(lambda w: 3 * w, init_params(REFERENCE, jax.random.key(0)))


def prompts(length, batch=2):
    return jax.random.randint(jax.random.key(length), (batch, length), 0, REFERENCE.vocab)


# Splash at s2_train's prompt, 21 tokens, a length it cannot tile (any other such length
# takes the same branch of attention_choice.kernel_refusal: XLA's attention), and at a
# tile, where it runs; cuDNN at a tile, where it would run on a GPU (it is refused on a
# CPU before any length is read, so one length shows it).
@pytest.mark.parametrize("kernel, length", [("splash", 21), ("splash", 128), ("cudnn", 128)])
def test_generate_on_a_kernel_config_gives_the_reference_tokens(params, kernel, length):
    cfg = KERNELS[kernel]
    reference = dataclasses.replace(cfg, attention_impl="einsum")
    out = kv_cache.generate(params, cfg, prompts(length), N_NEW)
    want = kv_cache.generate(params, reference, prompts(length), N_NEW)
    np.testing.assert_array_equal(out, want)
    assert len(np.unique(np.asarray(want[:, length:]))) > 2, "a degenerate continuation"


@pytest.mark.parametrize(
    "kernel, length, impl",
    [
        ("splash", 128, "splash"),  # a whole tile: the kernel itself, interpreted here
        ("splash", 21, "einsum"),
        ("splash", 64, "einsum"),
        ("cudnn", 128, "einsum"),  # any length: cuDNN has no CPU implementation
    ],
)
def test_the_kernel_is_chosen_only_where_it_takes_the_prompt(kernel, length, impl):
    chosen, note = attention_choice.choose_for_length(KERNELS[kernel], "cpu", 2, length)
    assert chosen == impl
    assert (note is None) == (impl == kernel)
    # On an accelerator the fallback is XLA's fused call, as `choose` gives the step.
    # cuDNN's own trace-time checks need its library: without the CUDA plugin and
    # cuDNN (requirements-aot.txt) they refuse every shape, and so must we.
    on_chip = "tpu" if kernel == "splash" else "gpu"
    chosen, note = attention_choice.choose_for_length(KERNELS[kernel], on_chip, 2, length)
    if kernel == "cudnn" and missing_extras("gpu"):
        assert chosen == "fused" and "cuDNN" in note
    else:
        assert chosen == (kernel if length % 128 == 0 or kernel == "cudnn" else "fused")


def test_the_sliding_sample_runs_on_a_splash_config(params):
    """s2_train's closing sample on a TPU-trained model of T = 128: past the
    context, sample.py prefills the last 64 bytes again, a length splash cannot
    tile. The text is the reference's."""
    short = dataclasses.replace(REFERENCE, seq=128)
    p = {**params, "pos": params["pos"][:128]}  # the positional table [T, E], cut to T = 128
    key = jax.random.key(1)
    text = generate_text(
        p, dataclasses.replace(short, attention_impl="splash"), "abc", 200, key, temperature=0.0
    )
    assert text == generate_text(p, short, "abc", 200, key, temperature=0.0)


@pytest.mark.parametrize("length", [128, 384, 640, 768, 1024, 21, 200])
def test_splash_takes_every_length_its_rule_accepts(length):
    """kernel_refusal's rule against the kernel itself: it builds (traced, never
    run) for every length the rule accepts, and fails for those it refuses."""
    cfg = dataclasses.replace(REFERENCE, seq=length, heads=1, head_dim=128)
    x = jax.ShapeDtypeStruct((1, length, 1, 128), jnp.float32)
    if attention_choice.kernel_refusal("splash", cfg, 1) is None:
        assert jax.eval_shape(attention.splash_kernel, x, x, x).shape == x.shape
    else:
        with pytest.raises(ValueError, match="multiple of 128"):
            jax.eval_shape(attention.splash_kernel, x, x, x)

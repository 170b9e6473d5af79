"""The transformer: its config, its params (a plain dict of arrays) and its forward pass.
Session 1 builds it without attention or positions, session 2 adds them, session 5
adds grouped-query attention, RoPE, the gated MLP, untied embeddings and int8 weights.

    config.py            the model's shapes, the run's knobs, the presets
    transformer.py       params, blocks, forward, the loss
    remat.py             the layer's tensor names, the remat policies by what they save
    attention.py         attention, five implementations of it
    attention_choice.py  which attention runs where
    positions.py         learned positions
    rotary.py            rotary positions (RoPE)
    quantize.py          int8 weights and an int8 KV cache, absmax scales
    flax_model.py        the same model in Flax NNX

    from sessions.model import ModelConfig, forward, init_params
"""

from sessions.model.config import ModelConfig
from sessions.model.transformer import forward, init_params

__all__ = ["ModelConfig", "forward", "init_params"]

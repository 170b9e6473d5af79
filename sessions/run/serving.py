"""A trained model, served: its shapes from session 2's newest checkpoint,
its weights restored onto a mesh, and the prompt in its tokens. s3_infer.py
reads its model this way, then shows prefill and decode on it; s5_serve.py too.
"""

import dataclasses
import functools

import jax

from sessions.errors import UsageError
from sessions.inference.sample import check_prompt, load_tokenizer, prompt_tokens
from sessions.model import init_params
from sessions.model.config import ModelConfig, TrainConfig
from sessions.run.checkpoint import Checkpoints, newest_meta, recipe
from sessions.run.cli import PROMPT
from sessions.shard import sharding
from sessions.train.step import abstract_state


def inference_config(serving):
    """(cfg, the checkpoint's metadata or None) for `serving` (sessions.run.cli.Serving):
    the shapes of the newest checkpoint in serving.checkpoint_dir, which the shape
    flags may only confirm, with the flags' dtype and attention; or with no
    checkpoint (--random-params, --target) the model the flags describe."""
    if serving.checkpoint_dir is None:
        return serving.model, None
    meta = newest_meta(serving.checkpoint_dir)
    if meta is None:
        raise UsageError(
            f"no checkpoint in {serving.checkpoint_dir}: train one with `python "
            "sessions/s2_train.py --checkpoint-every 200` (it also saves at the end), or pass "
            "--random-params"
        )
    try:
        trained = ModelConfig(**meta["model"])
    except TypeError:
        raise UsageError(f"{serving.checkpoint_dir}: a checkpoint of another version") from None
    flags = dict(serving.shapes)
    if flags.get("kv_heads", 0) is None:  # --preset, no --kv-heads: as many as its heads
        flags["kv_heads"] = flags["heads"]
    asked = {f: v for f, v in flags.items() if v != shape_of(trained, f)}
    if asked:  # other shapes, positions (learned or rotary) or K than the flags ask for
        theirs = ", ".join(f"{f}={shape_of(trained, f)}" for f in asked)
        ours = ", ".join(f"{f}={v}" for f, v in asked.items())
        raise UsageError(f"the checkpoint has {theirs}, not {ours}; drop the shape flags")
    cfg = serving.model
    return dataclasses.replace(trained, dtype=cfg.dtype, attention_impl=cfg.attention_impl), meta


def shape_of(cfg, name):
    """cfg's value for `name` of sessions.run.cli.SHAPES, as a checkpoint's is compared
    with the flags': K as a number (kv_heads None means H, whether given or not)."""
    return cfg.n_kv_heads if name == "kv_heads" else getattr(cfg, name)


def prompt_for(serving, cfg, meta):
    """(prompt ids, unit, tokenizer or None) for serving.prompt: bytes of text, or
    for a checkpoint of token files (its unit "token"), the ids given or those of
    serving.tokenizer."""
    unit = meta.get("unit", "byte") if meta else "byte"
    tokenizer = load_tokenizer(serving.tokenizer, unit)
    if unit == "token" and serving.prompt == PROMPT and tokenizer is None:
        raise UsageError(
            f"{serving.checkpoint_dir} was trained on token files: give --prompt as token ids, "
            "e.g. --prompt '464 1330 2643', or --tokenizer FILE to write it as text"
        )
    prompt = prompt_tokens(serving.prompt, unit, tokenizer)
    check_prompt(prompt, cfg)
    return prompt, unit, tokenizer


def load_params(checkpoint_dir, seed, cfg, meta, mesh):
    """(params, where they came from), each shard built or restored on its device:
    random ones when meta is None."""
    if meta is None:
        init = functools.partial(init_params, cfg)
        return sharding.init_sharded(init, jax.random.key(seed), mesh)[0], "random parameters"
    trained = ModelConfig(**meta["model"])  # as saved: the identity a restore checks
    tc = TrainConfig(batch=meta["batch"], seed=meta["seed"], steps=meta["steps"], **recipe(meta))
    _, _, abstract = abstract_state(trained, tc, mesh)
    with Checkpoints(checkpoint_dir, 0, trained, tc, meta.get("unit", "byte")) as checkpoints:
        step, state = checkpoints.restore_latest(abstract)
    return state["params"], f"checkpoint at step {step} of {checkpoints.directory}"

"""A trained model, served: its shapes from session 2's newest checkpoint,
its weights restored onto a mesh, and prefill and decode timed on them.

s3_infer.py reads its model this way; scripts/bench_decode.py times decode
with the same `time_decode`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from roofline.timing import time_calls
from sessions import inference, sharding
from sessions.config import PRESETS, ModelConfig, TrainConfig
from sessions.model import init_params
from sessions.run.checkpoint import Checkpoints, newest_meta
from sessions.run.cli import PROMPT, resolve
from sessions.run.errors import UsageError
from sessions.sample import check_prompt, load_tokenizer, prompt_tokens
from sessions.train import abstract_state

SHAPES = ("vocab", "embed", "ff", "heads", "head_dim", "layers", "seq", "attention", "positions")


def inference_config(args, platform=None):
    """(cfg, the checkpoint's metadata or None) for s3_infer.py's flags: the
    shapes from the newest checkpoint of an s2 run or, with --random-params or
    --target, from the flags, for `platform` (default: this machine's). The
    compute dtype is the platform's (sessions.run.cli.resolve); attention is XLA's,
    as a checkpoint may name the kernel of another chip."""
    on_cpu = (platform or jax.default_backend()) == "cpu"
    xla_attention = "einsum" if on_cpu else "fused"
    cfg = resolve(args, platform, attention_impl=xla_attention).model
    if args.random_params or args.target:
        return cfg, None
    meta = newest_meta(args.checkpoint_dir)
    if meta is None:
        raise UsageError(
            f"no checkpoint in {args.checkpoint_dir}: train one with `python sessions/s2_train.py "
            "--checkpoint-every 200` (it also saves at the end), or pass --random-params"
        )
    try:
        trained = ModelConfig(**meta["model"])
    except TypeError:
        raise UsageError(f"{args.checkpoint_dir}: a checkpoint of another version") from None
    # Shape flags (and --preset) may only confirm the checkpoint's shapes.
    flags = {f: getattr(args, f) for f in SHAPES if getattr(args, f, None) is not None}
    wanted = dataclasses.replace(PRESETS[args.preset].model if args.preset else trained, **flags)
    asked = [f for f in SHAPES if getattr(wanted, f) != getattr(trained, f)]
    if asked:
        theirs = ", ".join(f"{f}={getattr(trained, f)}" for f in asked)
        ours = ", ".join(f"{f}={getattr(wanted, f)}" for f in asked)
        raise UsageError(f"the checkpoint has {theirs}, not {ours}; drop the shape flags")
    return dataclasses.replace(trained, dtype=cfg.dtype, attention_impl=xla_attention), meta


def prompt_for(args, cfg, meta):
    """(prompt ids, unit, tokenizer or None) for s3_infer.py's --prompt: bytes of
    text, or for a checkpoint of token files (its unit "token"), the ids given or
    those of --tokenizer."""
    unit = meta.get("unit", "byte") if meta else "byte"
    tokenizer = load_tokenizer(args.tokenizer, unit)
    if unit == "token" and args.prompt == PROMPT and tokenizer is None:
        raise UsageError(
            f"{args.checkpoint_dir} was trained on token files: give --prompt as token ids, "
            "e.g. --prompt '464 1330 2643', or --tokenizer FILE to write it as text"
        )
    prompt = prompt_tokens(args.prompt, unit, tokenizer)
    check_prompt(prompt, cfg)
    return prompt, unit, tokenizer


def load_params(checkpoint_dir, seed, cfg, meta, mesh):
    """(params, where they came from), each shard built or restored on its device:
    random ones when meta is None."""
    if meta is None:
        init = functools.partial(init_params, cfg)
        return sharding.init_sharded(init, jax.random.key(seed), mesh)[0], "random parameters"
    trained = ModelConfig(**meta["model"])  # as saved: the identity a restore checks
    tc = TrainConfig(batch=meta["batch"], seed=meta["seed"], steps=meta["steps"])
    _, _, abstract = abstract_state(trained, tc, mesh)
    with Checkpoints(checkpoint_dir, 0, trained, tc, meta.get("unit", "byte")) as checkpoints:
        step, state = checkpoints.restore_latest(abstract)
    return state["params"], f"checkpoint at step {step} of {checkpoints.directory}"


def time_decode(params, cfg, prompt, batch, n, mesh, repeats=3, best=False):
    """(prefill seconds, decode seconds per step) for `batch` copies of the prompt:
    the median of `repeats` timed calls, or the fastest (best)."""
    tokens = jax.device_put(np.tile(prompt, (batch, 1)), sharding.batch_sharding(mesh))
    prefill = time_calls(lambda: inference.prefill(params, tokens, cfg), repeats=repeats)
    logits, cache = inference.prefill(params, tokens, cfg)
    state = [jnp.pad(tokens, ((0, 0), (0, cfg.seq - len(prompt)))), cache, logits]
    key, weights = jax.random.key(0), inference.decode_weights(params, cfg)

    def steps():  # n steps from the prompt's end, each call rewriting the same slots
        tokens, cache, logits = state
        state[:] = inference.decode_loop(
            weights, cache, tokens, logits, len(prompt), n, key, 1.0, cfg=cfg, greedy=False
        )
        return state

    decode = time_calls(steps, repeats=repeats)
    if best:
        return prefill.best, decode.best / n
    return prefill.median, decode.median / n

"""Session 1, as it was taught: the simplest thing that learns.

An embedding, a stack of feed-forward blocks and the tied output projection.
No attention (each output depends on its own token only: a bigram model), no
positions, no jit (every jnp op is dispatched from Python, one at a time), one
device, and each batch loaded only when the step asks for it. Then
sessions/s2_train.py adds the five things that make it a transformer that is
fast.

    python sessions/s1_train.py
    python sessions/s1_train.py --preset tiny --steps 3
"""

import dataclasses
import sys
import time

import jax

from sessions.errors import run_main
from sessions.model.config import LEVERS, TRAIN_LEVERS
from sessions.run.cli import ArgumentParser, add_shape_flags, resolve
from sessions.train import data
from sessions.train.step import init_state, make_optimizer, make_train_step


def main(argv=None):
    parser = ArgumentParser(prog="s1_train.py", description=__doc__.split("\n\n")[0])
    add_shape_flags(parser)
    # Session 1's model, not flags: no attention, no positions, float32 einsums.
    parser.set_defaults(no_attention=True, no_positions=True, dtype="float32")
    parser.set_defaults(attention_impl="einsum", eval_every=None)
    parser.set_defaults(**dict.fromkeys((*LEVERS, *TRAIN_LEVERS)))  # session 6's
    args = parser.parse_args(argv)
    run = resolve(args, platform="cpu")  # a CPU's shapes, wherever it runs
    cfg, tc = run.model, run.train
    if args.steps is None and args.preset is None:
        tc = dataclasses.replace(tc, steps=120, log_every=20)  # about a minute on 2 cores

    corpus = data.open_corpus(run.data, cfg.seq)
    data.check_vocab(corpus, cfg.vocab)
    train_tokens = corpus.train
    unigram = data.unigram_entropy(train_tokens)
    device = jax.devices()[0]  # one device

    optimizer = make_optimizer(tc, tc.steps)
    state = init_state(jax.random.key(tc.seed), cfg=cfg, optimizer=optimizer)
    step_fn = make_train_step(cfg, optimizer, jit=False)  # op by op
    print(
        f"session 1 | {device.device_kind} | feed-forward only, eager | "
        f"batch {tc.batch} x seq {cfg.seq} | unigram baseline {unigram:.3f} nats/{corpus.unit}"
    )
    print(f"data: {corpus.name}")
    for line in data.passes_lines(corpus, tc.steps * tc.batch * cfg.seq, tc.steps):
        print(line)

    start = time.perf_counter()
    for step in range(tc.steps):
        # Blocking load: the device waits while the host cuts the batch.
        batch = data.get_batch(train_tokens, step, batch=tc.batch, seq=cfg.seq, seed=tc.seed)
        batch = jax.device_put(batch, device)
        state, metrics = step_fn(state, batch)
        if (step + 1) % tc.log_every == 0 or step + 1 == tc.steps:
            elapsed = time.perf_counter() - start
            tokens = (step + 1) * tc.batch * cfg.seq
            print(
                f"step {step + 1:>5} | loss {float(metrics['loss']):.3f} | "
                f"{tokens / elapsed:,.0f} tok/s"
            )
    print(
        f"done in {time.perf_counter() - start:.1f} s; a model that sees one byte at a "
        f"time cannot go much below a bigram model's loss: attention is next (s2_train.py)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))

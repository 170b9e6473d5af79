"""Training: the step (loss, gradient and update, jitted whole), the data it eats, batches
loaded while the chip works, and the clock that turns step times into MFU. Session 1
runs the step op by op, session 2 jits it, overlaps its loading and measures it,
session 4 writes FSDP's collectives by hand, session 6 stores the weights in bf16.

    step.py         the jitted training step, its state, born sharded as shapes
    data.py         bytes as tokens, batches as a function of (seed, step)
    token_files.py  token files of other tools, memory-mapped
    prefetch.py     overlapped data loading
    meter.py        the loop's clock: step time, MFU
    manual_fsdp.py  FSDP's collectives by hand, under jax.shard_map
    master_weights.py  bf16 weights, the optimizer in float32 on a master copy
"""

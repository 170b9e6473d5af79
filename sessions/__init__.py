"""The course's story: one script a session at this folder's top, over five concept packages.

    s1_train.py .. s5_serve.py   what a student runs, one a session
    errors.py                    how a run stops on purpose (every layer may raise it)
    shard/      meshes, partition rules, params born sharded; the collective matmul  (2, 4)
    kernels/    Pallas: flash attention, the decode kernels, checking them          (4)
    model/      the transformer: config, attention, positions, int8 weights         (1, 2, 5)
    train/      the jitted step, data, overlapped loading, the meter, FSDP by hand  (1, 2, 4)
    inference/  prefill, the KV cache, decode, sampling, decode's quality           (3, 5)
    run/        plumbing a script needs: flags, defaults, printing, checkpoints
    plan/       compiling for a chip this machine lacks (--target)

Each package may import only those listed above it, and none imports run/ or plan/
(docs/layout.md, held by tests/test_layers.py).
"""

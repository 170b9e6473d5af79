"""Compiling for a chip this machine lacks (`--target CHIP[:SHAPE]`): training,
inference, attention and the collective matmul, planned on compile-only devices."""

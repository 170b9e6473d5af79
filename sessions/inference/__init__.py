"""Inference: prefill a prompt, keep every token's keys and values (the KV cache), and
decode one token a step, each step reading every weight. Session 3 builds it; session 5
serves more users from the same memory (int8, grouped-query attention) and measures
what that costs in quality; session 4's kernels can run its step.

    kv_cache.py     the KV cache, prefill and decode; generate
    layout.py       the weights as decode reads them, bf16 or int8
    kernel_step.py  the decode step in kernels, two Mosaic GPU launches a layer
    kernel_check.py the kernels interpreted (a CPU): one decode each, theirs and XLA's, compared
    step_times.py   a timed step's floor and estimate: the kernels its program launches (a GPU)
    shapes.py       every array prefill and decode take, as shapes with their shardings
    quality.py      what a cheaper decode costs: loss through the decode path, agreement
    sample.py       sampling text

    from sessions.inference import generate
"""

from sessions.inference.kv_cache import generate

__all__ = ["generate"]

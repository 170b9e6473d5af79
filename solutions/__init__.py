"""Finished exercises: the same modules, signatures and docstrings as exercises/.

Read one after trying it yourself. `python -m pytest` grades these by default;
`HPLLM_EXERCISES=1 python -m pytest tests/test_exercises` grades yours.
"""

"""Exercises: one module per topic, each function a task to fill in.

exercises/README.md lists them by session; `python scripts/homework.py SESSION`
grades yours and prints a report to paste into Discord.
"""

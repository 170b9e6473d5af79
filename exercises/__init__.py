"""Exercises, each module named after the module of the repository it practises
(or a topic: scripts/harness/grading.py's TOPIC_EXERCISES); each function a task to fill in.

exercises/README.md lists them by session; `python scripts/homework.py SESSION`
grades yours and prints a report to paste into Discord.
"""

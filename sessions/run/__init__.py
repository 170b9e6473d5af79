"""Plumbing a session script needs and a student can read later: flags, errors,
what a run prints, checkpoints, signals, many processes, accelerator checks, serving."""

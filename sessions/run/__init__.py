"""Plumbing a session script needs and a student can read later: flags, what a run
prints, checkpoints, signals, many processes, accelerator checks, serving."""

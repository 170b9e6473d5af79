"""Reading a profile: the trace's ops and steps, and the three columns compared
(napkin, XLA's count, trace)."""

"""Planning on a chip this machine lacks: compile-only devices, and a training
step or decode put on that chip's roofline."""

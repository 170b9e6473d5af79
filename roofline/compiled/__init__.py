"""Reading a compiled program: its HLO, what the compiler did, and the per-op
model that puts each op on a chip's roofs."""

"""Our own kernels, in Pallas: flash attention (Triton, and Mosaic GPU on Hopper) with its
own backward, and a decode layer in two Mosaic GPU kernels and the step's head in one; each
checked against a float32 reference to the rounding its chip allows. Session 4 writes them;
the model (attention's `pallas`) and decode (`--decode-impl pallas`) call them.

    flash.py             causal flash attention, forward and backward
    flash_mosaic.py      its forward in Mosaic GPU, for Hopper and later
    mosaic.py            Mosaic GPU across JAX versions: its kernels, its interpreter, a ring
    decode_residual.py   how each decode kernel starts: x + the pending partials, merged, normed
    decode_attention.py  the attention half of a decode layer, one kernel, its cache split
    decode_grid.py       that kernel's grid and ring depths, by Little's law
    decode_mlp.py        the MLP half of a decode layer, one kernel
    decode_head.py       the decode step's head: the last partials, final norm, logits, one kernel
    precision.py         checking against a float32 reference on any chip
"""

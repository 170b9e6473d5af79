"""The link between a chip and its host's memory (PCIe), bytes a second one way, with
its source: what host offload pays a step (python -m roofline memory --offload)."""

GB = 1e9

# chip name (roofline/hardware.py CHIPS) -> (bytes/s one way, source)
HOST_LINKS = {
    # NVIDIA H100 datasheet: "PCIe Gen5: 128GB/s" (both directions) for the SXM and PCIe
    # parts; the H200's page the same. 64 GB/s each way.
    "h100-sxm": (64 * GB, "NVIDIA H100 datasheet: PCIe Gen5 x16, 128 GB/s both ways"),
    "h100-pcie": (64 * GB, "NVIDIA H100 datasheet: PCIe Gen5 x16, 128 GB/s both ways"),
    "h200": (64 * GB, "NVIDIA H200 page: PCIe Gen5 x16, 128 GB/s both ways"),
    # A100 datasheet: "PCIe Gen4: 64GB/s" (both directions).
    "a100-80gb": (32 * GB, "NVIDIA A100 datasheet: PCIe Gen4 x16, 64 GB/s both ways"),
    "a100-40gb": (32 * GB, "NVIDIA A100 datasheet: PCIe Gen4 x16, 64 GB/s both ways"),
    # The JAX scaling book ("How to Scale Your Model", "How to Think About TPUs", at
    # jax-ml/scaling-book 0819a7d): "PCIe bandwidth is typically around 1.5e10 bytes /
    # second per chip", with the footnote "Trillium (TPU v6e) has 32GB/s, about 2x higher
    # than v5"; and "PCIe bandwidth for TPU v4 is 16GB / second each way".
    "tpu-v5p": (1.5e10, "the scaling book, 'How to Think About TPUs': about 1.5e10 B/s a chip"),
    "tpu-v5e": (1.5e10, "the scaling book, 'How to Think About TPUs': about 1.5e10 B/s a chip"),
    "tpu-v6e": (3.2e10, "the scaling book, 'How to Think About TPUs': Trillium's 32 GB/s"),
}


def host_link(chip):
    """(bytes/s one way, source) between the chip and its host, or None if the table
    has no figure (a CPU has no separate host memory at all)."""
    return HOST_LINKS.get(chip.name)

"""The chip table: peak dense FLOP/s per dtype, memory bandwidth and size,
interconnect bandwidth, and the names the runtimes give each chip; every
entry names its public source. The TPUs are in roofline/tpus.py, the NVIDIA
GPUs in roofline/gpus.py; `python -m roofline chips` prints them.

Matched to a device by `roofline.hardware.chip_for_kind`, by whole product
name (`kinds`): the strings jax reports as `device.device_kind`. On NVIDIA
that is the CUDA device name; on a TPU, libtpu's own.
"""

from roofline.gpus import GPUS
from roofline.tpus import TPUS

CHIPS = {chip.name: chip for chip in [*TPUS, *GPUS]}
# "h100" alone means the SXM part, the one in most clusters; "a100" the 80 GB one;
# "v100" the 16 GB SXM2 (AWS p3's).
CHIPS["h100"] = CHIPS["h100-sxm"]
CHIPS["a100"] = CHIPS["a100-80gb"]
CHIPS["v100"] = CHIPS["v100-sxm2-16gb"]

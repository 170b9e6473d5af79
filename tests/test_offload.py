"""The optimizer's state in host memory (sessions/train/offload.py, s2_train.py
--offload optimizer): refused on this CPU, on one line; compiled deviceless for an
H100 and a TPU slice, where XLA's plan moves the state's bytes from the chip's
arguments to the host's.

The AOT tests skip without the chip compilers (pip install -r requirements-aot.txt);
CI sets HPLLM_REQUIRE_AOT=1, which turns those skips into failures."""

import pytest
from helpers import need, s2_in_process

from roofline.flops import param_count
from roofline.memory import planned_bytes
from sessions.plan import programs
from sessions.plan.train_on_target import plan_target
from sessions.run.cli import resolve, train_flags
from sessions.train.offload import planned_host_bytes


def test_offload_on_this_cpu_is_refused_in_one_line_that_says_why(capsys):
    argv = ["--preset", "tiny", "--offload", "optimizer", "--steps", "1", "--sample-bytes", "0"]
    code, err = s2_in_process(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and "no memory apart from the host" in err


def test_an_offload_the_step_does_not_do_is_one_line(capsys):
    code, err = s2_in_process(["--preset", "tiny", "--offload", "activations"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "--offload activations: none or optimizer" in err


# The course's width, one layer, four sequences (one a TPU chip): the optimizer's state (8 B a
# parameter: AdamW's two float32 moments) is most of the step's bytes, as in a large
# model, where the activations of a short batch are not.
SHAPES = ["--preset", "course", "--layers", "1", "--batch", "4"]


def compiled_pair(target_text):
    """{offload: (memory_analysis, ModelConfig)} of the step compiled for target_text, with the
    optimizer's state on the chip ("none") and in host memory ("optimizer")."""
    target, devices = programs.devices_for(target_text)
    found = {}
    for offload in ("none", "optimizer"):
        argv = [*SHAPES, "--target", target_text, "--offload", offload]
        run = resolve(train_flags(argv), platform=target.chip.platform)
        planned = plan_target(None, run, target, devices, lambda *a: None)
        found[offload] = planned.compiled.memory_analysis(), run.model
    return found


@pytest.fixture(scope="module")
def h100():
    need("gpu")
    return compiled_pair("h100:1")


@pytest.fixture(scope="module")
def tpu():
    need("tpu")
    return compiled_pair("tpu-v5e:2x2")  # four chips, the state split over fsdp=4


@pytest.mark.parametrize("chip, devices", [("h100", 1), ("tpu", 4)])
def test_the_optimizers_bytes_move_from_the_chips_plan_to_the_hosts(chip, devices, request):
    """By hand: AdamW's two float32 moments, 2 x 4 B x P, split over the devices, plus
    its step counts (4 B each; a TPU pads small arrays to its tiles: under 1%). They
    leave the chip's arguments (donated, so its outputs too) and appear as host memory."""
    plans = request.getfixturevalue(chip)
    (on_chip, cfg), (offloaded, _) = plans["none"], plans["optimizer"]
    moments = 2 * 4 * param_count(cfg) / devices
    host = planned_host_bytes(offloaded)
    assert planned_host_bytes(on_chip) == 0
    assert moments <= host <= 1.01 * moments
    assert offloaded.host_argument_size_in_bytes == host  # donated: counted once
    left = on_chip.argument_size_in_bytes - offloaded.argument_size_in_bytes
    assert left == offloaded.host_argument_size_in_bytes


def test_the_h100_plan_falls_by_the_optimizers_bytes(h100):
    """On the H100, XLA fetches the moments weight by weight for their update and sends
    them back: its HBM plan falls by the state's bytes, less what is in flight, by hand
    at most the largest weight's two moments (w_in's, E x F x 8 B: 8.4 MB of 26.8).
    (The TPU compiler, far from its HBM's limit, fetches the whole state at the step's
    start, to hide the copies behind the compute: there the temporaries grow by as much
    as the arguments fall, until the HBM runs short.)"""
    (on_chip, cfg), (offloaded, _) = h100["none"], h100["optimizer"]
    in_flight = 2 * 4 * cfg.embed * cfg.ff
    assert planned_bytes(on_chip) - planned_bytes(offloaded) >= 2 * 4 * param_count(cfg) - in_flight

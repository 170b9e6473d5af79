"""The memory planner's answers hold, and the levers practitioners add, each held to a
hand count (roofline/plan/training_memory.py, memory_layout.py, memory_advice.py): the
fewest chips and the largest batch are counts the command accepts, judged against what
JAX may use; the scaling book's layout plans; FSDP's gathered layer; sequence
parallelism's divisor; the chunked loss's transient; offload's host bytes and PCIe
time; a pipeline's 1F1B in-flight activations; bad input is one line and exit 2."""

import dataclasses
import json
import os

import pytest
from helpers import REPO, roofline_command

from roofline.hardware import find_chip
from roofline.plan.training_memory import Recipe, plan_memory
from roofline.units import flop
from sessions.model.config import PUBLISHED, ModelConfig

# E=24, F=40, H=4, K=2, D=6, S=16, V=256, L=3 (tests/test_training_memory.py counts its
# 17,640 parameters: a layer's matrices 3,648, two norm scales of 24).
CFG = ModelConfig(embed=24, ff=40, heads=4, kv_heads=2, head_dim=6, layers=3, seq=16)
P = 17_640
H100, V5P = find_chip("h100"), find_chip("tpu-v5p")
# What CFG's layer keeps a token without remat, in float32 (tests/test_training_memory.py
# saved_by_hand): the values tp copies (the layer's input, the two norms' statistics,
# x·rsqrt and output, the stream into the MLP's norm: 148 values) and those it splits.
REPLICATED, WHOLE = 148 * 4, 1_944


def test_fsdp_counts_one_layer_gathered_and_its_gradient():
    """Under --shard params a chip holds one layer's weights whole (its tp share) in the
    compute dtype, and their gradient before the reduce-scatter: 2 x (3,648 / 2 + 48)."""
    plan = plan_memory(CFG, H100, chips=4, tp=2, batch_tokens=32, shard="params")
    assert plan.per_chip["gathered"] == 2 * (3_648 / 2 + 48) * 4
    assert plan_memory(CFG, H100, chips=4, batch_tokens=64).per_chip["gathered"] == 0


def test_llama3_70b_on_256_v5p_no_longer_fits_with_its_gathered_layer():
    """A layer of LLaMA-3-70B: q, k, v, o 2·8192·(64 + 8)·128 and the gated MLP
    3·8192·28,672, 855,638,016 weights, and two norms of 8,192; twice, in bf16: 3.42 GB,
    which takes the 4M-token step from fitting a v5p's 102.01 GB to not."""
    cfg = dataclasses.replace(PUBLISHED["llama3-70b"].model, attention_impl="splash")
    levers = {"remat": 4, "shard": "params", "batch_tokens": 4_194_304, "chips": 256}
    plan = plan_memory(cfg, V5P, recipe=Recipe("bfloat16", grads="bfloat16"), **levers)
    assert plan.per_chip["gathered"] == 2 * (855_638_016 + 2 * 8192) * 2
    assert not plan.fits and plan.per_chip["total"] - plan.per_chip["gathered"] <= V5P.hbm_bytes


def test_sequence_parallel_divides_what_tp_copies():
    """Korthikanti et al. 2022, 4.2.2: with SP every saved byte is divided by tp. dots
    keeps 24 + 24 (input, wo's output: copied) + 24 + 24 + 40 (q, k and v, w_in's:
    split) a layer; the final norm's 48 after the layers. Without remat and V=16 (logits
    128 bytes a token), the transient is a layer's backward: 592 copied + 1,352 split."""
    tp = {"chips": 2, "tp": 2, "batch_tokens": 64}
    plain = plan_memory(CFG, H100, remat="dots", **tp)
    sp = plan_memory(CFG, H100, remat="dots", sequence_parallel=True, **tp)
    assert plain.per_chip["activations"] == (3 * (48 + 88 / 2) + 48) * 64 * 4
    assert sp.per_chip["activations"] == (3 * 136 / 2 + 48 / 2) * 64 * 4
    small_v = dataclasses.replace(CFG, vocab=16)
    plain = plan_memory(small_v, H100, **tp).per_chip["transients"]
    sp = plan_memory(small_v, H100, sequence_parallel=True, **tp).per_chip["transients"]
    assert (plain, sp) == ((REPLICATED + (WHOLE - REPLICATED) / 2) * 64, WHOLE / 2 * 64)


def test_loss_chunks_divide_the_logits_transient():
    """V=4,096: the logits and their gradient are 2 x 4,096 x 4 = 32,768 bytes a token,
    above a layer's backward (1,944); over 4 chunks, 8,192 a token."""
    big_v = dataclasses.replace(CFG, vocab=4096)
    whole = plan_memory(big_v, H100, batch_tokens=64).per_chip["transients"]
    chunked = plan_memory(big_v, H100, batch_tokens=64, loss_chunks=4).per_chip["transients"]
    assert (whole, chunked) == (32_768 * 64, 8_192 * 64)


def test_offload_moves_bytes_to_the_host_and_prices_the_link():
    """AdamW's m and v, 8 bytes a parameter, leave HBM; each step they cross the H100's
    PCIe Gen5 x16 (64 GB/s one way) there and back. Offloaded activations cross once out
    and once in for each of --accum 2 microbatches."""
    opt = plan_memory(CFG, H100, batch_tokens=64, offload="optimizer")
    assert opt.host_per_chip == {"optimizer": 8 * P} and opt.per_chip["optimizer"] == 0
    assert opt.pcie_seconds == 2 * 8 * P / 64e9
    assert opt.compute_seconds == opt.flops_per_step / 494.5e12  # float32: the TF32 peak
    act = plan_memory(CFG, H100, batch_tokens=64, offload="activations", accum=2)
    saved = (3 * WHOLE + 2 * 24 * 4) * 32  # a microbatch of 32 tokens
    assert act.host_per_chip == {"activations": saved} and act.per_chip["activations"] == 0
    assert act.pcie_seconds == 2 * saved * 2 / 64e9


@pytest.mark.parametrize("microbatches, in_flight", [(6, 3), (2, 2)])
def test_a_pipeline_s_stage_0_holds_p_microbatches_under_1f1b(microbatches, in_flight):
    """3 stages of one layer, 6 sequences: each microbatch is 6 / M sequences of 16;
    block keeps the layer's input, 24 x 4 bytes a token; stage 0 holds min(P, M)
    microbatches of it, and a third of the state."""
    plan = plan_memory(CFG, H100, chips=3, batch_tokens=96, remat="block", stages=3,
                       microbatches=microbatches)  # fmt: skip
    assert plan.per_chip["activations"] == in_flight * 96 / microbatches * 24 * 4
    assert plan.per_chip["params"] == 4 * P / 3


def test_gpt2_s_example_is_judged_against_what_jax_may_use():
    """GPT-2 at 32 x 1,024 tokens on an H100 in bf16: 124,439,808 parameters less its
    102,144 biases (ours has none), 16 bytes each; 1,995,072 bytes a token of activations
    (12 layers x 166,000, and the final norm's 3,072) and 201,028 of logits and their
    gradient (2 x 50,257 x 2). JAX may use 75% of 80 GiB: (64,424,509,440 -
    1,989,402,624) / 2,196,100 = 28,430.0 tokens: 27 sequences. A layer's 166,000: in
    bf16 each norm keeps its input as float32 alone (tests/test_remat.py holds the layer's
    bytes to JAX's residuals)."""
    cfg = PUBLISHED["gpt2"].model
    plan = plan_memory(cfg, H100, batch_tokens=32_768)
    assert plan.usable_bytes == 0.75 * 80 * 2**30
    assert plan.per_chip["total"] == 16 * (124_439_808 - 102_144) + 2_196_100 * 32_768
    assert not plan.fits and plan.max_batch_tokens == 27 * 1024


def test_the_fewest_chips_is_a_count_the_command_accepts(tmp_path, capsys):
    """LLaMA-3-8B, 8 sequences of 8,192, ZeRO-2: the fewest chips, given back as --chips
    with nothing else changed, plans (the planner picking the sequence sharding) and fits."""
    out = tmp_path / "plan.json"
    argv = ["memory", "--preset", "llama3-8b", "--chip", "h100", "--batch-tokens", "65536"]
    argv += ["--shard", "gradients", "--summary-out", str(out)]
    assert roofline_command([*argv, "--chips", "8"]) == 0
    least = json.loads(out.read_text())["min_chips"]
    assert least and roofline_command([*argv, "--chips", str(least)]) == 0
    again = json.loads(out.read_text())
    assert again["fits"] and again["replicas"] * again["seq_shards"] == least
    assert again["seq_shards_picked"] and "picked by the planner" in capsys.readouterr().out


BOOK = ["memory", "--preset", "llama3-70b", "--chip", "tpu-v5p", "--seq", "4096", "--tp", "4"]
BOOK += ["--shard", "params", "--remat", "4", "--weights", "bfloat16", "--grads", "bfloat16"]


def test_the_scaling_book_s_layout_plans(tmp_path):
    """4M tokens of 4,096 on 1,024 data x 2 sequence x 4 tensor: each chip holds half of
    one sequence, 2,048 tokens, of 4 bf16 [tokens, E] tensors a layer: 80 x 4 x 8,192 x
    2 x 2,048 bytes, and the final norm's input and output, 2 x 8,192 x 2 x 2,048 (tp
    copies them)."""
    out = tmp_path / "book.json"
    argv = [*BOOK, "--chips", "8192", "--seq-shards", "2", "--batch-tokens", "4194304"]
    assert roofline_command([*argv, "--summary-out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert (plan["replicas"], plan["seq_shards"], plan["tp"]) == (1024, 2, 4)
    assert plan["per_chip"]["activations"] == (80 * 4 + 2) * 8192 * 2 * 2048


def test_flops_print_in_the_unit_that_fits():
    assert flop(2_683_564_835.8e9) == "2.68 EFLOP" and flop(27_998.2e9) == "28.00 TFLOP"


GPT2 = ["memory", "--preset", "gpt2", "--chip", "h100", "--batch-tokens", "32768"]


def test_a_step_that_does_not_fit_names_the_levers_that_would(capsys):
    assert roofline_command(GPT2) == 0
    out = capsys.readouterr().out
    assert "does NOT fit in the 64.42 GB usable" in out and "XLA_PYTHON_CLIENT_MEM_FRACTION" in out
    advice = next(line for line in out.splitlines() if "predicted to fit with" in line)
    assert "--remat block" in advice and "--batch-tokens 27,648" in advice
    assert "--shard params" not in advice  # one chip: ZeRO divides over nothing
    assert all("predicted" in line or line.startswith("  ") or ":" in line
               for line in out.splitlines())  # fmt: skip
    assert roofline_command([*GPT2, "--remat", "block"]) == 0
    assert "predicted: fits" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, says",
    [
        ([*BOOK, "--chips", "8960", "--batch-tokens", "4096000"],
         "nearest that divide it: --chips 8,192"),
        ([*BOOK, "--chips", "8", "--seq-shards", "3", "--batch-tokens", "4096000"],
         "--seq-shards 3: does not divide the sequence of 4,096"),
        (["memory", "--preset", "tiny", "--heads", "2", "--chips", "8", "--tp", "8",
          "--batch-tokens", "1024"], "heads 2 does not divide over tp = 8"),
        (["memory", "--preset", "llama3-8b", "--chips", "16", "--tp", "16", "--batch-tokens",
          "8192"], "kv_heads 8 does not divide over tp = 16"),
        ([*GPT2, "--sequence-parallel"], "--sequence-parallel shards what tp copies"),
        ([*GPT2, "--loss-chunks", "3"], "--loss-chunks 3: must divide each chip's 32,768"),
        (["memory", "--preset", "tiny", "--chip", "local", "--batch-tokens", "1024",
          "--offload", "optimizer"], "no separate device memory"),
        ([*GPT2, "--microbatches", "4"], "--microbatches 4: a pipeline's"),
        ([*GPT2, "--pipeline-stages", "5"], "12 layers do not divide over 5"),
        ([*GPT2, "--pipeline-stages", "2", "--accum", "2", "--chips", "2"], "--accum with"),
    ],
)  # fmt: skip
def test_bad_levers_are_one_line_and_exit_2(argv, says, capsys):
    assert roofline_command(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_the_smaller_slips_are_fixed(capsys):
    """--accum against --batch-tokens' sequences; --chip local; --batch out of --help;
    --dtype sets the compute dtype."""
    assert roofline_command([*GPT2[:-1], "24576", "--accum", "3"]) == 0
    assert roofline_command(["memory", "--preset", "tiny", "--chip", "local",
                             "--batch-tokens", "1024"]) == 0  # fmt: skip
    assert roofline_command([*GPT2, "--dtype", "float32"]) == 0
    assert "compute in float32" in capsys.readouterr().out
    assert roofline_command(["memory", "--help"]) == 0
    assert "--batch " not in capsys.readouterr().out


def test_fits_is_against_the_share_jax_takes_and_says_how_to_raise_it(capsys, monkeypatch):
    """75% of an H100's 80 GiB by default, 64.42 GB; at XLA_PYTHON_CLIENT_MEM_FRACTION=.9,
    77.31 GB; a TPU's HBM is all JAX's, and no variable is named."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    command = ["memory", "--batch-tokens", "8192"]
    assert roofline_command(command) == 0
    out = capsys.readouterr().out
    assert "predicted: fits in the 64.42 GB usable of one h100-sxm's 80 GiB (85.90 GB)" in out
    assert "(75%: XLA_PYTHON_CLIENT_MEM_FRACTION's default; raise it to use more)" in out
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert roofline_command(command) == 0
    assert "77.31 GB usable" in capsys.readouterr().out
    assert roofline_command([*command, "--chip", "tpu-v5p"]) == 0
    out = capsys.readouterr().out
    assert "102.01 GB usable" in out and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in out


def test_the_readme_s_memory_examples_are_what_it_prints(capsys):
    """roofline/README.md's GPT-2 lines are the command's, and its first memory command
    ends in the levers that would make it fit, not in a dead end."""
    with open(os.path.join(REPO, "roofline", "README.md")) as f:
        readme = f.read()
    quoted = readme.split("(the lines under the table):\n\n```\n")[1].split("```")[0]
    assert roofline_command(GPT2) == 0
    out = capsys.readouterr().out
    assert quoted.strip() and all(line in out for line in quoted.strip().splitlines())
    first = readme.split("python -m roofline memory --preset llama3-8b")[1].split("#")[0]
    argv = ["memory", "--preset", "llama3-8b", *first.replace("\\", " ").split()]
    assert roofline_command(argv) == 0
    advice = capsys.readouterr().out.split("predicted to fit with, each re-planned: ")[1]
    assert "--chips 16" in advice

"""s3_infer.py --decode-impl pallas on a CPU: our kernels decoded once beside XLA's step,
untimed (sessions/inference/kernel_check.py), what a token of theirs launches compiled for
h100:1 (sessions/plan/kernels_on_target.py), and the sample from the decode asked for.

Most of these stand a marked step in for the kernels: XLA's step with every logit but
one token's pushed down, so that its tokens are known ("Z" each) and differ from XLA's,
and no interpreter is needed: they run on every JAX. The kernels themselves, interpreted,
run once (JAX 0.12 on), in the smallest model they take; their launches are compiled
where the chip compilers are installed.
"""

import os
import re
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, need, run_script, s3_in_process

from sessions.inference import kernel_check, kernel_step, kv_cache
from sessions.kernels import mosaic
from sessions.model.config import ModelConfig

SHAPE = ["--embed", "64", "--ff", "128", "--heads", "2", "--head-dim", "64", "--layers", "1"]
FLAGS = ["--random-params", "--seq", "64", "--dtype", "bfloat16", "--batches", "1"]
MARK = ord("Z")  # the marked step's every token (the first new one is prefill's pick)


def marked_step(w, cache, token, pos, cfg, live=True, held=None, loop=None, *, interpret):
    """XLA's step, its logits pushed down everywhere but MARK: the tokens of 'our' decode
    (held, where given: the logits a step that is not live keeps, as our head does)."""
    logits, cache = kv_cache.decode_step(w, cache, token, pos, cfg, live)
    logits = logits - 1e4 * (jnp.arange(cfg.vocab) != MARK)
    return (logits if held is None else jnp.where(live, logits, held)), cache


@pytest.fixture
def marked(monkeypatch):
    """Our step replaced by the marked one, in this JAX whatever its interpreter; not
    compiled for h100:1 (it is no kernel: what ours launch is counted below)."""
    from sessions.plan import kernels_on_target

    jax.clear_caches()  # a decode program of the same shapes, cached, would skip the marked step
    monkeypatch.setattr(kernel_step, "kernel_decode_step", marked_step)
    monkeypatch.setattr(mosaic, "OLD_INTERPRETER", False)
    monkeypatch.setattr(kernels_on_target, "target_devices", lambda target: (None, "a stand-in"))


def read_lines(out):
    return [line for line in out.splitlines() if line.strip()]


def test_interpreted_kernels_decode_once_beside_xla_s_and_their_tokens_are_the_sample(
    marked, tmp_path, capsys
):
    """On a CPU: no timing table; the launches line; the two decodes compared (here they
    differ from the second new token, the first being prefill's pick); the kernels' files; the sample is theirs."""
    argv = [*FLAGS, *SHAPE, "--new-tokens", "3", "--temperature", "0", "--decode-impl", "pallas"]
    code, out, err = s3_in_process([*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 0, err
    assert "MBU" not in out and "ms/step" not in out and "plot:" not in out  # nothing timed
    assert "decode pallas-interpret" in out
    launches = [line for line in read_lines(out) if line.strip().startswith("kernels a token")]
    assert len(launches) == 1, out
    same = [line for line in read_lines(out) if "new tokens a row as XLA's" in line]
    assert (
        len(same) == 1 and "the same 3 new tokens a row as XLA's: NO, from new token 1" in same[0]
    )
    for path, _ in kernel_check.kernel_files():
        assert f"  {path}  " in out and os.path.exists(os.path.join(REPO, path)), path
    sample = out.split("sample:\n")[1].split("\n")[0]
    assert sample.startswith("The import statement ") and sample.endswith("ZZ"), out


def test_the_sample_comes_from_the_decode_asked_for_where_it_is_timed(
    marked, monkeypatch, tmp_path, capsys
):
    """Where our kernels are compiled (a GPU; here impl_for says so, the marked step in
    their place), s3 times them, and its sample is theirs too, not XLA's."""

    def compiled_on_any_platform(decode_impl, platform):
        return None if decode_impl == "xla" else "pallas"

    monkeypatch.setattr(kernel_step, "impl_for", compiled_on_any_platform)
    monkeypatch.setattr(kv_cache, "impl_for", compiled_on_any_platform)  # generate's
    argv = [*FLAGS, *SHAPE, "--new-tokens", "3", "--temperature", "0", "--decode-impl", "pallas"]
    code, out, err = s3_in_process([*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 0, err
    assert "| decode pallas\n" in out and "MBU" in out  # timed: a compiled step's time counts
    sample = out.split("sample:\n")[1].split("\n")[0]
    assert sample.startswith("The import statement ") and sample.endswith("ZZ"), out


def test_the_comparison_says_where_the_tokens_part_and_the_logits_gap():
    P = 2
    xla = np.array([[1, 2, 5, 6, 7], [1, 2, 5, 6, 7]])
    ours = xla.copy()
    logits = np.array([[0.0, 3.0], [-4.0, 1.0]], np.float32)
    same = kernel_check.compare_decodes(ours, xla, logits + 0.25, logits, P)
    assert (same.new, same.parted_at, same.logit_gap, same.logit_top) == (3, None, 0.25, 4.0)
    assert "the same 3 new tokens a row as XLA's: yes (greedy)" in kernel_check.compared_line(
        same, 0
    )
    ours[1, 3] = 9  # row 1 parts at its second new token
    parted = kernel_check.compare_decodes(ours, xla, logits, logits, P)
    assert parted.parted_at == 1 and parted.logit_gap == 0
    assert "NO, from new token 1 on (sampled at temperature 0.8" in kernel_check.compared_line(
        parted, 0.8
    )


def test_the_launches_line_without_the_chip_compilers_names_what_to_install(monkeypatch):
    from sessions.plan import kernels_on_target

    monkeypatch.setattr(kernels_on_target, "missing_extras", lambda p: "the NVIDIA compiler (x)")
    line = kernels_on_target.decode_launches(None, 1)
    assert line.startswith("kernels a token: not counted, compiling for h100:1 needs")
    assert "the NVIDIA compiler (x)" in line and "requirements-aot.txt" in line
    assert "\n" not in line


class Launches(NamedTuple):
    per_token: int


TINY = ModelConfig(
    vocab=256, embed=64, ff=128, heads=2, head_dim=64, layers=2, seq=64, dtype="bfloat16"
)


def test_the_launches_line_counts_ours_and_xla_s_compiled_for_the_chip():
    """Two layers compiled for h100:1: ours launch 2 Mosaic GPU kernels a layer, 1 for the head
    (sessions/kernels/decode_head.py), and at most
    the planner's count besides (roofline/launch_bound.py: GPT-2's; XLA fuses one more at
    these shapes), fewer in all than XLA's step."""
    need("gpu")
    from roofline.launch_bound import OUR_KERNELS_OUTSIDE
    from sessions.plan import kernels_on_target

    line = kernels_on_target.decode_launches(TINY, 1)
    said = r"compiled \(h100:1\): ours (\d+) \((\d+) of them our Mosaic GPU kernels\), XLA's step (\d+)"
    ours, pallas, xla = map(int, re.search(said, line).groups())
    assert pallas == 2 * TINY.layers + 1 and ours <= pallas + OUR_KERNELS_OUTSIDE < xla, line


def test_the_script_compiles_each_kernel_or_says_what_it_lacks(monkeypatch, capsys):
    """scripts/kernels_across_jax.py: a line a kernel (attention, MLP, head) and one for the
    whole decode; a kernel this JAX cannot build (here the MLP kernel, made to lack an API)
    is refused in one line, the others still compile."""
    need("gpu")
    from sessions.kernels import decode_mlp

    def lacking(*args, **kwargs):
        raise AttributeError("module 'mosaic_gpu' has no attribute 'load'\n  more detail")

    monkeypatch.setattr(decode_mlp, "mlp_layer", lacking)
    code, out, err = run_script("scripts/kernels_across_jax.py", ["--preset", "cpu"], capsys)
    lines = read_lines(out)
    assert code == 1 and len(lines) == 7, out + err
    assert lines[0].startswith(f"JAX {jax.__version__}, cpu's shapes in bfloat16, batch 1")
    assert "compiled (h100:1" in lines[0]
    compiled_in = r"compiled in \d+\.\d s: 1 Mosaic GPU "
    assert re.match(r"  sessions/kernels/decode_attention.py: " + compiled_in, lines[1]), lines[1]
    assert lines[2] == (
        "  sessions/kernels/decode_mlp.py: REFUSED: AttributeError: module 'mosaic_gpu' "
        "has no attribute 'load'"
    )
    assert re.match(r"  sessions/kernels/decode_head.py: " + compiled_in, lines[3]), lines[3]
    assert re.match(r"  XLA's decode .*: compiled in \d+\.\d s: \d+ kernels a token$", lines[4])
    assert lines[5].startswith("  the whole decode") and "NOT TRIED" in lines[5]
    assert re.match(
        r"compiled for h100:1 in \d+\.\d s \(XLA's decode\) and ours: not tried", lines[6]
    )


def attempts(xla_s, ours_s, **alone):
    """compile_kernels' answer, its seconds given: each kernel alone, XLA's decode, ours."""
    from sessions.plan.kernels_on_target import Attempt

    rows = [Attempt(name, f"{name}.py", "compiled", "1 kernel", s) for name, s in alone.items()]
    rows.append(Attempt("XLA's", "XLA's decode", "compiled", "57 kernels a token", xla_s))
    return [*rows, Attempt("ours", "the whole decode", "compiled", "13 kernels a token", ours_s)]


def test_the_script_says_each_compile_time_and_ours_over_xla_s(monkeypatch, capsys):
    """The compile times kernels_across_jax.py prints are compile_kernels' seconds (stood
    in for: 3 s for the attention kernel alone, 4 s for XLA's decode, 10 s for ours), and
    the ratio is ours over XLA's: 10 / 4 = 2.5x, labelled measured with this machine."""
    from sessions.plan import kernels_on_target

    monkeypatch.setattr(kernels_on_target, "target_devices", lambda target: (("h100", []), None))
    found = attempts(4.0, 10.0, attention=3.0)
    monkeypatch.setattr(kernels_on_target, "compile_kernels", lambda *a, **k: found)
    code, out, err = run_script("scripts/kernels_across_jax.py", [], capsys)
    lines = read_lines(out)
    assert code == 0 and len(lines) == 5, out + err
    assert lines[1] == "  attention.py: compiled in 3.0 s: 1 kernel"
    assert lines[2] == "  XLA's decode: compiled in 4.0 s: 57 kernels a token"
    assert lines[4].startswith(
        "compiled for h100:1 in 4.0 s (XLA's decode) and 10.0 s (ours, 2.5x); measured on "
    )
    assert lines[4].endswith(f" cores, JAX {jax.__version__}") and "\n" not in lines[4]


def test_a_compile_is_timed_from_the_clock_around_it(monkeypatch):
    """kernels_on_target.timed: the clock read before and after (a stand-in: 10.0, then
    13.5), the difference its seconds."""
    from sessions.plan import kernels_on_target

    clock = iter([10.0, 13.5])
    monkeypatch.setattr(kernels_on_target.time, "perf_counter", lambda: next(clock))
    assert kernels_on_target.timed(lambda: "compiled") == ("compiled", 3.5)


def test_the_machine_is_this_cpu_its_cores_and_jax(monkeypatch):
    from sessions.plan import compile_times

    monkeypatch.setattr(compile_times.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    said = compile_times.machine()
    assert said.endswith(f", 3 cores, JAX {jax.__version__}") and len(said.split(", ")) >= 3


def test_a_compile_that_does_not_answer_is_given_up_and_said_so(monkeypatch):
    """JAX 0.12's Mosaic GPU may search its layouts for minutes: ours are given up at the
    time limit, XLA's count still said (a sleep stands in for the search)."""
    from sessions.plan import kernels_on_target

    class Program:
        def as_text(self):
            return "stand-in"

    def decode_program(cfg, batch, impl, *target):
        if impl == "pallas":
            time.sleep(5)
        return Program()

    monkeypatch.setattr(kernels_on_target, "target_devices", lambda target: (("h100", []), None))
    monkeypatch.setattr(kernels_on_target, "decode_program", decode_program)
    monkeypatch.setattr(kernels_on_target, "kernel_launches", lambda text: Launches(58))
    started = time.perf_counter()
    line = kernels_on_target.decode_launches(None, 1, seconds=0.2)
    assert time.perf_counter() - started < 2
    assert line.startswith("kernels a token, compiled (h100:1): XLA's step 58; ours not counted:")
    assert "given up after 0.2 s, still in" in line and "\n" not in line


def test_the_script_without_the_chip_compilers_says_so_in_one_line(monkeypatch, capsys):
    from sessions.plan import kernels_on_target

    monkeypatch.setattr(kernels_on_target, "missing_extras", lambda p: "the NVIDIA compiler (x)")
    code, out, err = run_script("scripts/kernels_across_jax.py", [], capsys)
    assert code == 1 and len(read_lines(out)) == 1 and not err.strip(), out + err
    assert f"JAX {jax.__version__}" in out and "cannot compile for h100:1 here" in out
    assert "requirements-aot.txt" in out

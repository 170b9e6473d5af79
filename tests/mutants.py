"""A curated mutation check: plant known bugs one at a time, each in a fresh
copy of the repository, and run the tests that must catch it. A bug that
every named test lets through is a hole in the suite.

    python tests/mutants.py                     # every mutant (about 16 minutes on 2 cores)
    python tests/mutants.py --list
    python tests/mutants.py --check             # only: does every mutant still fit the tree?
    python tests/mutants.py clip decay-mask     # only these

Each mutant names a file, a text in it and its replacement, and the tests
that must fail, every one of them: a test named here that passes with the
bug planted is a test that does not check what it is listed for. The copy is
the working tree (tracked files and untracked ones git does not ignore). A
mutant whose text is no longer in its file is reported as stale: the code
moved, and the list must follow it. Before any mutant, the named tests must
pass on an untouched copy, or a failure would prove nothing.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutant(NamedTuple):
    name: str
    why: str  # the bug, in words
    path: str
    edits: tuple  # (text, replacement) pairs, each text found exactly once
    tests: tuple  # pytest node ids (a prefix: a test's every parametrization)


CHECKPOINT = "tests/test_checkpoint.py"
LAUNCHES = "tests/test_launches.py"
LAUNCH_BOUND = "tests/test_launch_bound.py"
INFERENCE = "tests/test_inference.py"
INT8 = "tests/test_int8.py"
INT8_TARGETS = "tests/test_int8_targets.py"
OP_ROOFLINE = "tests/test_op_roofline.py"
POD_ORDER = "tests/test_pod_order.py"
SESSION_4 = "tests/test_exercises/test_session_4.py"
SESSION_5 = "tests/test_exercises/test_session_5.py"
SESSION_7 = "tests/test_exercises/test_session_7.py"
NAMES_TEST = "tests/test_exercises/test_exercise_names.py"
HOMEWORK_TEST = "tests/test_exercises/test_homework.py"
DISCORD_TEST = f"{HOMEWORK_TEST}::test_every_part_fits_discord_at_the_boundary"
WRONG_ANSWER_TEST = f"{HOMEWORK_TEST}::test_a_wrong_answer_says_whose_number_its_unit_and_the_hint"
EXPECT = "tests/test_exercises/expect.py"
EXPECT_TEST = "tests/test_exercises/test_expect.py"
WRITE = "                meter.write(record)\n"
CMATMUL = "sessions/shard/collective_matmul.py"
CMATMUL_TEST = "tests/test_collective_matmul.py"
RESIDUAL = "sessions/kernels/decode_residual.py"
ATTENTION = "sessions/kernels/decode_attention.py"
GRID = "sessions/kernels/decode_grid.py"
DECODE_KERNELS = "tests/test_decode_kernels.py"
ATTENTION_TEST = "tests/test_decode_attention.py"
GRID_TEST = "tests/test_decode_grid.py"
TRUTH = "tests/test_trace_truth.py"
PLANS = "tests/test_step_plans.py"
MEMORY_PLAN = "roofline/plan/training_memory.py"
SAVED_ACTIVATIONS = "roofline/plan/saved_activations.py"
TRAINING_STATE = "roofline/plan/training_state.py"
PLAN_LEVERS_TEST = "tests/test_memory_plan_levers.py"
MEMORY_TEST = "tests/test_training_memory.py"
REMAT_TEST = "tests/test_memory_levers.py"
MASTER_TEST = "tests/test_master_weights.py"
S4 = "tests/test_s4_kernels.py"
EMBED_GRAD = "tests/test_embedding_gradient.py"
HLO_READING = "tests/test_hlo_reading.py"
LAYERS = "tests/test_layers.py"
PLANNER = "tests/test_planner.py"
NAPKIN = "tests/test_serving_napkin.py"
BATCHING = "roofline/plan/batching.py"
SERVE_PLAN = "roofline/plan/serve_plan.py"
SEQPAR = "tests/test_sequence_parallel.py"
ESTIMATE = "roofline/plan/decode_estimate.py"
ESTIMATE_TEST = "tests/test_decode_estimate.py"
WITHIN_25 = "test_the_estimate_is_within_25_percent_of_every_h100_step_and_the_floor_under"
FAMILY = "tests/test_model_family.py"
KERNEL_CHECK = "tests/test_s3_kernel_check.py"
SCRIPTS = "tests/test_scripts.py"
FIRST_CALL_TABLE = "test_the_first_call_s_table_holds_each_measured_figure_against_its_prediction"
S4_STEP_6 = (
    "tests/test_s4_kernels.py::test_step_6_says_the_decode_kernels_compile_times_beside_xla_s"
)
HTTP_TEST = "tests/test_serve_http.py"
S7 = "tests/test_s7_engine.py"
S7_BAD = f"{S7}::test_bad_input_is_one_line_and_exit_2"
BAD_REQUEST = "test_a_bad_request_gets_400_in_openai_s_shape_and_costs_the_engine_nothing"
ONCE_TEST = f"{KERNEL_CHECK}::test_interpreted_kernels_decode_once_beside_xla_s_and_their_tokens_are_the_sample"
SAMPLE_TEST = f"{KERNEL_CHECK}::test_the_sample_comes_from_the_decode_asked_for_where_it_is_timed"
LOAD = "tests/test_serve_load.py"
LOAD_HAND = f"{LOAD}::test_latencies_throughput_and_goodput_by_hand"
WORKLOAD = "sessions/serve/workload.py"
REPLAY = "sessions/serve/replay.py"
LATENCY = "sessions/serve/latency.py"
SERVE_PAGES = "tests/test_serve_pages.py"
SERVE = "tests/test_serve_engine.py"
SAME_TOKENS = (
    f"{SERVE}::test_greedy_tokens_are_generate_s_alone_under_staggered_arrivals_and_preemption"
)
PAGED_STEP = (
    f"{SERVE}::test_the_paged_step_equals_a_full_forward_pass_and_rows_not_live_write_nothing"
)

MUTANTS = [
    Mutant(
        "clip",
        "gradient clipping removed from the optimizer",
        "sessions/train/step.py",
        (("        optax.clip_by_global_norm(tc.clip),\n", ""),),
        ("tests/test_train.py::test_clipping_bounds_a_huge_gradient",),
    ),
    Mutant(
        "decay-mask",
        "weight decay on norm scales instead of matrices",
        "sessions/train/step.py",
        (("lambda w: w.ndim >= 2", "lambda w: w.ndim < 2"),),
        ("tests/test_train.py::test_weight_decay_shrinks_matrices_and_spares_norm_scales",),
    ),
    Mutant(
        "w_in-rule",
        "w_in split as P('tp', 'fsdp'), a legal but wrong layout",
        "sessions/shard/sharding.py",
        (('"w_in": P("fsdp", "tp")', '"w_in": P("tp", "fsdp")'),),
        ("tests/test_multichip.py::test_the_layout_by_hand[fsdp=4,tp=2]",),
    ),
    Mutant(
        "napkin-4",
        "the napkin's 6·B·P printed as 4·B·P",
        "roofline/flops.py",
        (
            (
                "return 6 * batch * cfg.seq * param_count(cfg)",
                "return 4 * batch * cfg.seq * param_count(cfg)",
            ),
        ),
        ("tests/test_roofline.py::test_parameter_and_flop_counts_equal_hand_counts",),
    ),
    Mutant(
        "fingerprint",
        "the fingerprint check skipped on restore",
        "sessions/run/checkpoint.py",
        (
            (
                'if not np.allclose(_fingerprint_list(restored), meta["fingerprint"], rtol=1e-5):',
                "if False:",
            ),
        ),
        (f"{CHECKPOINT}::test_a_checkpoint_changed_on_disk_fails_its_fingerprint",),
    ),
    Mutant(
        "discord-2100",
        "Discord parts of up to 2,100 characters",
        "scripts/harness/grading.py",
        (("DISCORD_LIMIT = 2000", "DISCORD_LIMIT = 2100"),),
        (DISCORD_TEST,),
    ),
    Mutant(
        "discord-code-points",
        "message length counted in code points, not UTF-16 units",
        "scripts/harness/grading.py",
        (('return len(text.encode("utf-16-le")) // 2', "return len(text)"),),
        (DISCORD_TEST,),
    ),
    Mutant(
        "exercise-topic-undeclared",
        "an exercise named after no module and not declared a topic",
        "scripts/harness/grading.py",
        (('    "jit_fusion": ', '    "jit_fusions": '),),
        (f"{NAMES_TEST}::test_each_exercise_is_named_after_a_module_or_a_declared_topic",),
    ),
    Mutant(
        "homework-drops-session",
        "homework.py's session list loses session 3: its exercises are graded by none",
        "scripts/harness/grading.py",
        (
            (
                '    "3": ("test_session_3.py", '
                '"inference, the KV cache, decode and inference rooflines"),\n',
                "",
            ),
        ),
        (
            f"{NAMES_TEST}::test_every_exercise_is_graded_by_a_session_of_homework_py",
            f"{HOMEWORK_TEST}::test_homework_n_is_session_n",
        ),
    ),
    Mutant(
        "homework-title-unnumbered",
        "the Discord report's title names the session's concept but not its number",
        "scripts/harness/grading.py",
        (('return f"session {session}: {what}" if session.isdigit() else what', "return what"),),
        (f"{HOMEWORK_TEST}::test_homework_n_is_session_n",),
    ),
    Mutant(
        "expect-below-inclusive",
        "expect's `below` lets the bound itself pass: looser than the assert it replaced",
        EXPECT,
        (('("below", below, lambda: got < below)', '("below", below, lambda: got <= below)'),),
        (f"{EXPECT_TEST}::test_expect_is_exactly_as_strict_as_the_bare_assert",),
    ),
    Mutant(
        "expect-no-unit",
        "a wrong answer's message gives its numbers without their unit",
        EXPECT,
        (('    text += unit if unit == "x" else f" {unit}"  # a speed-up: 1.9x\n', ""),),
        (
            f"{EXPECT_TEST}::test_the_message_says_what_whose_number_and_the_unit",
            WRONG_ANSWER_TEST,
        ),
    ),
    Mutant(
        "session-bare-assert",
        "a session test back to a bare assert: 'assert 2.3 == 1.6 ± 1.6e-09', whose is which?",
        "tests/test_exercises/test_session_1.py",
        (
            (
                'expect(bigram_entropy(tokens), pytest.approx(expected, rel=1e-9), nats, "400 bytes'
                ' of 0..4")',
                "assert bigram_entropy(tokens) == pytest.approx(expected, rel=1e-9)",
            ),
        ),
        (
            f"{EXPECT_TEST}::test_session_tests_compare_through_expect_or_say_why[test_session_1.py]",
            WRONG_ANSWER_TEST,
        ),
    ),
    Mutant(
        "homework-no-hint",
        "a failed exercise's line in the report without the hint from its docstring",
        "scripts/harness/grading.py",
        (("            line += f\" · Hint: {entry['hint']}\"\n", "            pass\n"),),
        (
            f"{HOMEWORK_TEST}::test_a_failure_line_ends_with_the_hint_and_only_the_hint_is_cut",
            WRONG_ANSWER_TEST,
        ),
    ),
    Mutant(
        "hint-ignores-hint-line",
        "the hint is always the docstring's last paragraph, not the text after 'Hint:'",
        "scripts/harness/grading.py",
        (("return hinted[0] if hinted else paragraphs[-1]", "return paragraphs[-1]"),),
        (f"{HOMEWORK_TEST}::test_every_exercise_has_a_hint_from_its_docstring",),
    ),
    Mutant(
        "machine-cpu-x8",
        "the report's machine line says 'cpu x8', as if 8 chips, not 8 simulated devices",
        "scripts/harness/grading.py",
        (
            (
                'devices = f"{count} simulated devices" if count != "1" else "1 device"',
                'devices = f"cpu x{count}"',
            ),
        ),
        (
            f"{HOMEWORK_TEST}::test_the_machine_line_says_which_devices_are_simulated",
            f"{HOMEWORK_TEST}::test_solutions_pass_in_one_message",
        ),
    ),
    Mutant(
        "stub-lacks-import",
        "an exercise stub without an import its solution's body needs (jnp in one_query)",
        "exercises/attention.py",
        (("import jax.numpy as jnp\n", ""),),
        (
            "tests/test_exercises/test_exercise_tree.py::test_each_stub_imports_what_its_solution_imports",
        ),
    ),
    Mutant(
        "positions-reversed",
        "position s gets pos[S-1-s]",
        "sessions/model/positions.py",
        (("jnp.ones((B,), x.dtype), pos)", "jnp.ones((B,), x.dtype), pos[::-1])"),),
        (
            "tests/test_model.py::test_zero_blocks_are_the_identity_and_position_s_gets_pos_s",
            "tests/test_model.py::test_forward_equals_the_plain_reference",
        ),
    ),
    Mutant(
        "mlp-residual",
        "the MLP's residual connection dropped",
        "sessions/model/transformer.py",
        (("x + mlp_block(", "mlp_block("),),
        (
            "tests/test_model.py::test_zero_blocks_are_the_identity_and_position_s_gets_pos_s",
            "tests/test_model.py::test_forward_equals_the_plain_reference",
        ),
    ),
    Mutant(
        "metrics-after-save",
        "a log step's metrics line written after its checkpoint (the flaky resume test's cause)",
        "sessions/s2_train.py",
        (
            (WRITE, "                pending = record\n"),
            (
                "            if logged:  # after logging",
                "            if logged:\n                meter.write(pending)\n"
                "            if logged:  # after",
            ),
        ),
        (
            "tests/test_train.py::test_a_log_line_is_in_the_file_before_its_step_is_saved",
            f"{CHECKPOINT}::test_killed_right_after_a_checkpoint_resumes_with_every_line",
        ),
    ),
    Mutant(
        "loss-read-every-step",
        "the loop reads the loss after every step: a sync that stalls the device each step",
        "sessions/s2_train.py",
        (
            (
                "            logged = meter.is_log_step(done)\n",
                '            logged = meter.is_log_step(done) + 0 * float(metrics["loss"])\n',
            ),
        ),
        ("tests/test_train.py::test_the_loop_reads_the_loss_only_on_log_steps",),
    ),
    Mutant(
        "cache-not-for-children",
        "the suite's compile cache kept from the child processes: each compiles afresh",
        "tests/conftest.py",
        (("        os.environ[name.upper()] = str(value)\n", "        pass\n"),),
        ("tests/test_compile_cache.py::test_a_child_reads_back_what_this_process_compiled",),
    ),
    Mutant(
        "step-time",
        "a log interval's step time divided by one step too many",
        "sessions/train/meter.py",
        (("seconds / (done - self.last_step)", "seconds / (done - self.last_step + 1)"),),
        ("tests/test_train.py::test_the_meter_s_numbers_by_hand",),
    ),
    Mutant(
        "mfu-one-device",
        "MFU against one device's peak on several devices",
        "sessions/train/meter.py",
        (("datasheet_peak=peak_flops, chips=n_devices)", "datasheet_peak=peak_flops)"),),
        ("tests/test_train.py::test_the_meter_s_numbers_by_hand",),
    ),
    Mutant(
        "summary-steps",
        "the summary's step count one too many",
        "sessions/run/report.py",
        (('["step"] - first_step', '["step"] - first_step + 1'),),
        ("tests/test_train.py::test_the_summary_by_hand",),
    ),
    Mutant(
        "bench-tokens",
        "bench.py's tokens/s counts sequences, not tokens",
        "scripts/bench.py",
        (("{B * S / ours.median:,.0f}", "{B / ours.median:,.0f}"),),
        ("tests/test_scripts.py::test_bench_compares_with_naive_on_equal_numbers",),
    ),
    Mutant(
        "s1-tokens",
        "s1_train.py's tokens/s one step short",
        "sessions/s1_train.py",
        (("tokens = (step + 1) * tc.batch * cfg.seq", "tokens = step * tc.batch * cfg.seq"),),
        ("tests/test_cli.py::test_s1_runs_end_to_end_and_counts_its_tokens",),
    ),
    Mutant(
        "sparse-peak",
        "the TPU v5e's bf16 peak doubled",
        "roofline/tpus.py",
        (('"tpu-v5e",\n        197 * T,', '"tpu-v5e",\n        394 * T,'),),
        ("tests/test_roofline.py::test_chip_figures_are_the_datasheet_s[tpu-v5e]",),
    ),
    Mutant(
        "memory-alias",
        "donated buffers counted twice in the memory plan",
        "roofline/memory.py",
        (("- m.alias_size_in_bytes", ""),),
        ("tests/test_roofline.py::test_step_memory_by_hand",),
    ),
    Mutant(
        "comm-both-ways",
        "the communication bound sends over both directions of a link the datasheet sums",
        "roofline/chip.py",
        (
            (
                "return self.interconnect / 2 if self.interconnect else None",
                "return self.interconnect if self.interconnect else None",
            ),
        ),
        ("tests/test_roofline.py::test_the_communication_bound_by_hand",),
    ),
    Mutant(
        "state-bytes",
        "bytes per device counted as if every device held everything",
        "sessions/shard/sharding.py",
        (("math.prod(s.shard_shape(x.shape))", "math.prod(x.shape)"),),
        ("tests/test_cli.py::test_s2_runs_end_to_end_and_every_number_it_prints_is_right",),
    ),
    Mutant(
        "cache-copy",
        "the cache written before it is read: XLA copies it every step",
        "sessions/inference/kv_cache.py",
        (("after = 0 * out[:, :1, :1, :1]", "after = 0"),),
        (f"{INFERENCE}::test_the_decode_loop_copies_no_weight_and_no_cache",),
    ),
    Mutant(
        "decode-weight-rule",
        "decode's transposed weights split by the untransposed rule",
        "sessions/inference/layout.py",
        (("return P(*(spec[i] for i in order))", "return P(*spec)"),),
        (f"{INFERENCE}::test_sharded_equals_one_device",),
    ),
    Mutant(
        "int8-widened",
        "each int8 weight converted to bf16 in a buffer of its own before its matmul",
        "sessions/inference/layout.py",
        (
            (
                "w = w if scale is None else w.values.astype(x.dtype)",
                "w = w if scale is None else jax.lax.optimization_barrier(w.values.astype(x.dtype))",
            ),
        ),
        (
            f"{INT8_TARGETS}::test_the_h100_decode_makes_no_float_copy_of_an_int8_array",
            f"{INT8_TARGETS}::test_the_h100_decode_reads_the_roofline_s_int8_bytes",
        ),
    ),
    Mutant(
        "int8-v-scale",
        "the int8 cache's value scales left out of attention",
        "sessions/model/quantize.py",
        (('probs[..., :T] * cache["v_scale"][:, :, None, None]', "probs[..., :T]"),),
        (f"{INT8}::test_int8_cache_attention_equals_attention_over_the_dequantized_cache",),
    ),
    Mutant(
        "chip-substring",
        "a chip found by a part of its name (GH200 read as H200)",
        "roofline/hardware.py",
        (
            (
                "if any(product_name(kind) == name for kind in chip.kinds):",
                "if any(product_name(kind) in name for kind in chip.kinds):",
            ),
        ),
        ("tests/test_hardware.py::test_the_gh200_is_not_read_as_an_h200_nor_the_a1000_as_an_a100",),
    ),
    Mutant(
        "calibration-unlocked",
        "processes sharing the calibration file measure and write it at once",
        "roofline/calibrate.py",
        (("fcntl.flock(lock, fcntl.LOCK_EX)", "pass"),),
        ("tests/test_hardware.py::test_processes_sharing_the_calibration_measure_one_at_a_time",),
    ),
    Mutant(
        "bucket-abspath",
        "a gs:// checkpoint folder made a local path",
        "sessions/run/checkpoint.py",
        (("    if is_uri(directory):\n        try:", "    if False:\n        try:"),),
        (
            "tests/test_checkpoint_hosts.py::test_a_bucket_stays_a_bucket_and_a_local_folder_becomes_absolute",
        ),
    ),
    Mutant(
        "run-dir-unmade",
        "a --run-dir that cannot be a folder found after the last step, when the plot is written",
        "sessions/s2_train.py",
        (('    make_folder(args.run_dir, "--run-dir")', "    pass"),),
        ("tests/test_cli.py::test_a_run_dir_that_cannot_be_made_stops_the_run_before_it_trains",),
    ),
    Mutant(
        "checkpoint-folder-unmade",
        "a checkpoint folder that cannot be one found at the first save, after training",
        "sessions/run/checkpoint.py",
        (("        make_local(directory)\n", ""),),
        (
            f"{CHECKPOINT}::test_a_checkpoint_folder_that_cannot_be_one_stops_the_run_before_its_first_step",
        ),
    ),
    Mutant(
        "unshared-folder",
        "hosts that see different checkpoint folders go on",
        "sessions/run/checkpoint.py",
        (("            check_shared(checkpoint_path(directory))", "            pass"),),
        (
            "tests/test_checkpoint_hosts.py::test_hosts_that_see_different_folders_are_refused_on_every_host",
        ),
    ),
    Mutant(
        "decode-trip",
        "decode's loop over a traced count (a GPU waits on the host each token)",
        "sessions/inference/kv_cache.py",
        (
            (
                "return jax.lax.fori_loop(0, STEPS, step, (tokens, cache, logits))",
                "return jax.lax.fori_loop(0, n, step, (tokens, cache, logits))",
            ),
        ),
        ("tests/test_decode_targets.py::test_the_gpu_decode_programs_never_wait_on_the_host",),
    ),
    Mutant(
        "trip-step",
        "a loop's counter read as stepping by 1 (an unrolled loop's body counted twice)",
        "roofline/compiled/loops.py",
        (("step = next((s for s in steps if s), 1)", "step = 1"),),
        (f"{OP_ROOFLINE}::test_a_loop_body_counts_once_a_trip_with_the_counters_step",),
    ),
    Mutant(
        "vmem-bytes",
        "arrays in a TPU's on-chip memory counted as HBM traffic",
        "roofline/compiled/op_work.py",
        (('    in_hbm = not space or space.group(1) == "0"\n', "    in_hbm = True\n"),),
        (f"{OP_ROOFLINE}::test_bytes_follow_the_layout_tiles_and_leave_out_on_chip_memory",),
    ),
    Mutant(
        "sync-collectives",
        "asynchronous collectives waited for at once (nothing overlaps)",
        "roofline/compiled/op_roofline.py",
        (("if t.asynchronous:  # runs on its engine", "if False:  # runs on its engine"),),
        (f"{OP_ROOFLINE}::test_an_asynchronous_collective_hides_behind_the_ops_before_its_use",),
    ),
    Mutant(
        "stdlib-skips",
        "the stdlib corpus keeps the generated codec tables and the docs",
        "sessions/train/data.py",
        (('STDLIB_SKIPPED |= {"encodings", "pydoc_data", "__pycache__"}', "pass"),),
        (
            "tests/test_data.py::test_stdlib_holds_out_whole_files_the_same_way_every_time",
            "tests/test_data.py::test_this_python_s_stdlib_is_split_by_file",
        ),
    ),
    Mutant(
        "stdlib-order",
        "the stdlib's files in the order the file system lists them",
        "sessions/train/data.py",
        (("    return sorted(found)", "    return found[::-1]"),),
        ("tests/test_data.py::test_stdlib_holds_out_whole_files_the_same_way_every_time",),
    ),
    Mutant(
        "split-last-tenth",
        "text's validation is its own last tenth (the docs' last topics, types* to yield), "
        "so the gap reads a change of topic as memorizing",
        "sessions/train/data.py",
        (
            (
                "    chunks = max(1, n // SPLIT_CHUNK) if n <= IN_MEMORY_LIMIT else 1",
                "    chunks = 1",
            ),
        ),
        (
            "tests/test_data.py::test_split_holds_out_the_last_tenth_of_every_chunk",
            "tests/test_data.py::test_the_docs_hold_out_a_tenth_of_every_part",
        ),
    ),
    Mutant(
        "split-copies-mapped",
        "a mapped corpus past IN_MEMORY_LIMIT split in chunks: copied whole into memory",
        "sessions/train/data.py",
        (
            (
                "    chunks = max(1, n // SPLIT_CHUNK) if n <= IN_MEMORY_LIMIT else 1",
                "    chunks = max(1, n // SPLIT_CHUNK)",
            ),
        ),
        ("tests/test_data.py::test_split_holds_out_the_last_tenth_of_every_chunk",),
    ),
    Mutant(
        "passes-warning",
        "the warning at exactly the threshold, not past it",
        "sessions/train/data.py",
        (("    if passes > MAX_PASSES:", "    if passes >= MAX_PASSES:"),),
        ("tests/test_data.py::test_passes_in_the_header_and_a_warning_past_the_threshold",),
    ),
    Mutant(
        "vocab-edge",
        "a token equal to the vocabulary let through (an embedding lookup past the table)",
        "sessions/train/data.py",
        (("        if largest >= vocab:", "        if largest > vocab:"),),
        ("tests/test_token_runs.py::test_bad_token_input_is_one_line_before_any_step",),
    ),
    Mutant(
        "chip-corpus",
        "a GPU or TPU defaults to the docs, which its default run passes over 35 times",
        "sessions/run/defaults.py",
        (("(DOCS if on_cpu else STDLIB)", "DOCS"),),
        ("tests/test_data.py::test_every_preset_s_default_run_stays_below_the_threshold",),
    ),
    Mutant(
        "args-below-scripts",
        "a library function takes the flags (argparse's args) again, not the values it needs",
        "sessions/run/multihost.py",
        (
            (
                "def initialize(coordinator, num_processes, process_id):",
                "def initialize(coordinator, num_processes, process_id, args=None):",
            ),
        ),
        ("tests/test_cli.py::test_library_code_takes_configs_not_the_flags",),
    ),
    Mutant(
        "flag-quietly-not-given",
        "resolve takes a flag its command lacks as not given (getattr with a default)",
        "sessions/run/cli.py",
        (
            (
                "name: getattr(args, name) for name in names if getattr(args, name) is not None",
                "name: getattr(args, name, None) for name in names "
                "if getattr(args, name, None) is not None",
            ),
            ('        raise TypeError(f"resolve reads', '        print(f"resolve reads'),
        ),
        ("tests/test_cli.py::test_resolve_reads_each_flag_by_name_and_a_missing_one_is_loud",),
    ),
    Mutant(
        "best-val",
        "the summary's best validation loss is the last one",
        "sessions/run/report.py",
        (
            (
                '"best_val_loss": min(val)[0] if val else None',
                '"best_val_loss": val[-1][0] if val else None',
            ),
        ),
        ("tests/test_train.py::test_the_summary_by_hand",),
    ),
    Mutant(
        "gap-one-batch",
        "the final gap against the one noisy batch logged at the evaluation's step",
        "sessions/run/report.py",
        (
            (
                "    logged = history[max(last - 1, 0) : last + 1]",
                "    logged = history[last : last + 1]",
            ),
        ),
        ("tests/test_train.py::test_the_final_gap_by_hand",),
    ),
    Mutant(
        "gap-first-val",
        "the final gap taken at the first validation, not the last",
        "sessions/run/report.py",
        (("    last = evaluated[-1]", "    last = evaluated[0]"),),
        ("tests/test_train.py::test_the_final_gap_by_hand",),
    ),
    Mutant(
        "gap-warning",
        "a run whose validation is within noise of its training loss told it memorized",
        "sessions/run/report.py",
        (("gap <= data.MAX_GAP or (passes", "gap <= 0 or (passes"),),
        (
            "tests/test_train.py::test_the_final_gap_by_hand",
            "tests/test_train.py::test_memorizing_is_a_gap_outgrowing_validation_by_hand",
        ),
    ),
    Mutant(
        "gap-alone",
        "any gap past 0.1 told memorizing: a change of text between the splits, or a model "
        "still learning fast, warned as one",
        "sessions/run/report.py",
        (
            (
                '    return gap - earlier["val_gap"] > earlier["val_loss"] - val_loss',
                "    return True",
            ),
        ),
        ("tests/test_train.py::test_memorizing_is_a_gap_outgrowing_validation_by_hand",),
    ),
    Mutant(
        "gap-val-only",
        "memorizing told only once validation turns up: a gap growing three times faster than "
        "validation falls goes unwarned",
        "sessions/run/report.py",
        (
            (
                '    return gap - earlier["val_gap"] > earlier["val_loss"] - val_loss',
                '    return val_loss > earlier["val_loss"]',
            ),
        ),
        ("tests/test_train.py::test_memorizing_is_a_gap_outgrowing_validation_by_hand",),
    ),
    Mutant(
        "gap-once",
        "a run that met its data less than once told it memorized: a gap of noise warned",
        "sessions/run/report.py",
        (("gap <= data.MAX_GAP or (passes is not None and passes <= 1)", "gap <= data.MAX_GAP"),),
        ("tests/test_train.py::test_memorizing_is_a_gap_outgrowing_validation_by_hand",),
    ),
    Mutant(
        "gap-trend-short",
        "the gap's trend taken since the evaluation just before: over 100 steps, batch noise",
        "sessions/run/report.py",
        (('if history[i]["step"] <= final * 2 / 3]', 'if history[i]["step"] < final]'),),
        ("tests/test_train.py::test_memorizing_is_a_gap_outgrowing_validation_by_hand",),
    ),
    Mutant(
        "readme-table",
        "the accelerator table's rows renamed, the results page's H100 table left as it was",
        "scripts/accelerator_check.py",
        (('                "s2 training run",', '                "s2 run",'),),
        (
            "tests/test_accelerator_check.py::test_the_results_page_shows_the_table_the_h100_check_printed",
        ),
    ),
    Mutant(
        "chip-passes",
        "the course preset's 2,000 steps again: 9.3 passes over the smallest stdlib seen",
        "sessions/model/config.py",
        (("TrainConfig(steps=450, batch=256,", "TrainConfig(steps=2000, batch=256,"),),
        ("tests/test_data.py::test_every_preset_s_default_run_stays_below_the_threshold",),
    ),
    Mutant(
        "token-unit",
        "the header counts token files' tokens as bytes",
        "sessions/run/report.py",
        (("{len(corpus.val):,} val {corpus.unit}s", "{len(corpus.val):,} val bytes"),),
        ("tests/test_token_runs.py::test_a_run_on_llm_c_shards_learns_their_pattern",),
    ),
    Mutant(
        "pod-rows",
        "a process loads one range from its first block to its last (a pod's are scattered)",
        "sessions/shard/sharding.py",
        (
            (
                "return np.concatenate([np.arange(start, stop) for start, stop in sorted(blocks)])",
                "return np.arange(min(blocks)[0], max(blocks)[1])",
            ),
        ),
        (
            f"{POD_ORDER}::test_each_process_loads_the_blocks_its_devices_hold",
            f"{POD_ORDER}::test_interleaved_processes_train_and_evaluate_like_one",
        ),
    ),
    Mutant(
        "lone-stop",
        "a signalled host stops and saves alone, without the others agreeing",
        "sessions/run/preemption.py",
        (
            (
                "signals = multihost.every_process(self.signal)",
                "signals = [self.signal * (p == jax.process_index()) "
                "for p in range(jax.process_count())]",
            ),
        ),
        (f"{POD_ORDER}::test_sigterm_to_one_host_stops_both_after_the_same_step",),
    ),
    Mutant(
        "flash-rescale",
        "the running sums are not rescaled when a key block raises the maximum",
        "solutions/flash.py",
        (("new_sum = row_sum * shrink + ", "new_sum = row_sum + "),),
        (
            f"{SESSION_4}::test_online_softmax_equals_softmax",
            f"{SESSION_4}::test_two_causal_tiles_equal_causal_attention",
        ),
    ),
    Mutant(
        "flash-hidden-row",
        "a row with every key hidden so far turns NaN",
        "solutions/flash.py",
        (
            (
                "shrink = jnp.where(hidden, 0.0, jnp.exp(row_max - new_max))",
                "shrink = jnp.exp(row_max - new_max)",
            ),
        ),
        (f"{SESSION_4}::test_a_tile_with_every_key_hidden_changes_nothing",),
    ),
    Mutant(
        "causal-blocks-floor",
        "the causal block count rounds down: the diagonal's last keys are skipped",
        "solutions/flash.py",
        (
            (
                "return -(-(query_block + 1) * block_q // block_k)",
                "return (query_block + 1) * block_q // block_k",
            ),
        ),
        (f"{SESSION_4}::test_causal_key_blocks_against_the_mask",),
    ),
    Mutant(
        "ring-direction",
        "the ring passes shards the wrong way round",
        "solutions/manual_fsdp.py",
        (
            (
                "to_previous = [(d, (d - 1) % n) for d in range(n)]",
                "to_previous = [(d, (d + 1) % n) for d in range(n)]",
            ),
        ),
        (f"{SESSION_4}::test_ring_matmul_equals_the_product_with_permutes_only",),
    ),
    Mutant(
        "rope-interleaved",
        "RoPE pairs dims 2i and 2i + 1 (Meta's original layout), not i and i + D/2 (rotate_half)",
        "solutions/rotary.py",
        (
            (
                "angles = jnp.concatenate([angles, angles], axis=-1)",
                "angles = jnp.repeat(angles, 2, axis=-1)",
            ),
            (
                "x1, x2 = x[..., : D // 2], x[..., D // 2 :]",
                "x1, x2 = x[..., ::2], x[..., 1::2]",
            ),
            (
                "rotated_half = jnp.concatenate([-x2, x1], axis=-1)",
                "rotated_half = jnp.stack([-x2, x1], axis=-1).reshape(x.shape)",
            ),
        ),
        (
            f"{SESSION_5}::test_rotate_pairs_dim_i_with_dim_i_plus_half",
            f"{SESSION_5}::test_rotate_against_the_complex_reference",
            f"{SESSION_5}::test_the_score_depends_only_on_the_distance",
        ),
    ),
    Mutant(
        "rope-theta",
        "RoPE's frequencies base^(-i/D) for pair i, not base^(-2i/D)",
        "solutions/rotary.py",
        (
            (
                "base ** (-jnp.arange(0, head_dim, 2) / head_dim)",
                "base ** (-jnp.arange(0, head_dim // 2) / head_dim)",
            ),
        ),
        (
            f"{SESSION_5}::test_rotary_angles_by_hand",
            f"{SESSION_5}::test_rotate_against_the_complex_reference",
        ),
    ),
    Mutant(
        "rope-same-position",
        "the key turned to the query's position: the score no longer sees the distance",
        "solutions/rotary.py",
        (("rotate(k[None, :], jnp.array([n]), base)", "rotate(k[None, :], jnp.array([m]), base)"),),
        (f"{SESSION_5}::test_the_score_depends_only_on_the_distance",),
    ),
    Mutant(
        "int8-per-input-channel",
        "int8 scales taken per input column, not per output row",
        "solutions/quantize.py",
        (
            ("amax = jnp.max(jnp.abs(w), axis=1)", "amax = jnp.max(jnp.abs(w), axis=0)"),
            ("values = jnp.round(w / scale[:, None])", "values = jnp.round(w / scale[None, :])"),
        ),
        (f"{SESSION_5}::test_quantize_per_channel_by_hand",),
    ),
    Mutant(
        "int8-floor",
        "int8 values truncated toward -inf: an element can move by a whole step",
        "solutions/quantize.py",
        (("values = jnp.round(w / scale[:, None])", "values = jnp.floor(w / scale[:, None])"),),
        (
            f"{SESSION_5}::test_quantize_per_channel_by_hand",
            f"{SESSION_5}::test_each_element_moves_by_at_most_half_its_rows_step",
        ),
    ),
    Mutant(
        "matvec-bound-max",
        "the product's error bound from the largest |x| rather than the sum over in",
        "solutions/quantize.py",
        (("return scale / 2 * jnp.sum(jnp.abs(x))", "return scale / 2 * jnp.max(jnp.abs(x))"),),
        (f"{SESSION_5}::test_matvec_error_bound_by_hand_and_it_holds",),
    ),
    Mutant(
        "per-tensor-per-row",
        "the 'per-tensor' error computed with a scale per row: both columns the same",
        "solutions/quantize.py",
        (
            (
                "tensor_scale = jnp.max(jnp.abs(w)) / 127",
                "tensor_scale = jnp.max(jnp.abs(w), axis=1, keepdims=True) / 127",
            ),
        ),
        (
            f"{SESSION_5}::test_rounding_errors_by_hand",
            f"{SESSION_5}::test_one_large_row_spoils_the_per_tensor_scale",
        ),
    ),
    Mutant(
        "gqa-counts-h",
        "the GQA cache counted with the H query heads, not the K key/value heads",
        "solutions/decode_cost.py",
        (
            (
                "return 2 * layers * batch * context * kv_heads * head_dim * bytes_per_value",
                "return 2 * layers * batch * context * heads * head_dim * bytes_per_value",
            ),
        ),
        (
            f"{SESSION_5}::test_gqa_cache_bytes_by_hand",
            f"{SESSION_5}::test_decode_fits_by_hand",
        ),
    ),
    Mutant(
        "fits-ceil",
        "sequences that fit rounded up: the last one overflows HBM",
        "solutions/decode_cost.py",
        (
            (
                "return math.floor((hbm_bytes - weight_bytes) / cache_bytes_per_sequence)",
                "return math.ceil((hbm_bytes - weight_bytes) / cache_bytes_per_sequence)",
            ),
        ),
        (f"{SESSION_5}::test_sequences_that_fit_by_hand",),
    ),
    Mutant(
        "int8-scales-per-input",
        "int8 weights' scales counted per input column, not per output row",
        "solutions/decode_cost.py",
        (("out * inputs + 4 * out for out, inputs", "out * inputs + 4 * inputs for out, inputs"),),
        (
            f"{SESSION_5}::test_int8_weight_bytes_by_hand",
            f"{SESSION_5}::test_critical_batch_of_llama3_8b_on_an_h100",
        ),
    ),
    Mutant(
        "critical-int8-no-scales",
        "the int8 critical batch from half bf16's bytes: the scales and the norms' bytes lost",
        "solutions/decode_cost.py",
        (
            (
                "int8 = int8_weight_bytes(matmul_shapes, other_params)",
                "int8 = sum(out * inputs for out, inputs in matmul_shapes) + other_params",
            ),
        ),
        (
            f"{SESSION_5}::test_critical_batch_int8_by_hand",
            f"{SESSION_5}::test_critical_batch_of_llama3_8b_on_an_h100",
        ),
    ),
    Mutant(
        "critical-cache-ignored",
        "the critical batch without the cache's share of each step: the weights-only napkin",
        "solutions/decode_cost.py",
        (
            (
                "margin = flops_per_sequence / peak_flops - cache_bytes_per_sequence / bandwidth",
                "margin = flops_per_sequence / peak_flops",
            ),
        ),
        (
            f"{SESSION_5}::test_critical_batch_int8_by_hand",
            f"{SESSION_5}::test_critical_batch_of_llama3_8b_on_an_h100",
        ),
    ),
    Mutant(
        "published-tied",
        "a published model counted with its embedding tied: LLaMA's own output projection lost",
        "solutions/decode_cost.py",
        (('+ 2 * model["vocab"] * E + E', '+ model["vocab"] * E + E'),),
        (
            f"{SESSION_5}::test_published_params_by_hand",
            f"{SESSION_5}::test_decode_fits_by_hand",
        ),
    ),
    Mutant(
        "fits-in-gb",
        "an H100's \"80GB\" read as 80e9 bytes, not NVIDIA's 80 GiB",
        "solutions/decode_cost.py",
        (("needed <= hbm_gib * 2**30", "needed <= hbm_gib * 1e9"),),
        (f"{SESSION_5}::test_decode_fits_by_hand",),
    ),
    Mutant(
        "usable-line-dropped",
        "the decode planner says what fits an H100 without what JAX may use of it",
        "roofline/plan/serving_report.py",
        (("        *filter(None, [usable_line(chip)]),\n", ""),),
        (f"{PLANNER}::test_the_planners_say_what_jax_may_use_of_an_h100_beside_fits",),
    ),
    Mutant(
        "usable-folded-into-fits",
        "JAX's 75% folded silently into the decode planner's 'fits'",
        "roofline/plan/serving.py",
        (
            (
                "chip.hbm_bandwidth, chips * chip.hbm_bytes\n",
                "chip.hbm_bandwidth, chips * chip.hbm_bytes * 0.75\n",
            ),
        ),
        (
            f"{PLANNER}::test_fits_and_does_not_fit_on_an_h100",
            f"{PLANNER}::test_the_planners_say_what_jax_may_use_of_an_h100_beside_fits",
        ),
    ),
    Mutant(
        "needed-in-gib",
        "decode's bytes printed in GiB where the planners print GB",
        "solutions/decode_cost.py",
        (("return needed / 1e9, needed", "return needed / 2**30, needed"),),
        (f"{SESSION_5}::test_decode_fits_by_hand",),
    ),
    Mutant(
        "nvidia-hbm-decimal",
        "the H100's HBM in decimal GB (80e9 bytes), not the 80 GiB NVIDIA means",
        "roofline/gpus.py",
        (
            (
                "        3350 * G,\n        80 * GiB,\n",
                "        3350 * G,\n        80 * G,\n",
            ),
        ),
        (
            "tests/test_hardware.py::test_every_nvidia_row_holds_the_vendor_s_gib",
            f"{PLANNER}::test_fits_and_does_not_fit_on_an_h100",
            f"{PLANNER}::test_the_planners_say_what_jax_may_use_of_an_h100_beside_fits",
        ),
    ),
    Mutant(
        "ring-backwards",
        "the weight shards sent the other way round the ring than the slices of x assume",
        CMATMUL,
        (
            (
                "ring = [(i, (i + 1) % n) for i in range(n)]",
                "ring = [(i, (i - 1) % n) for i in range(n)]",
            ),
        ),
        (f"{CMATMUL_TEST}::test_the_ring_computes_what_the_gathered_weight_does",),
    ),
    Mutant(
        "shard-off-by-one",
        "each shard multiplied by the columns of x of the shard one hop further on",
        CMATMUL,
        (("(me - k) % n * e", "(me - k - 1) % n * e"),),
        (
            f"{CMATMUL_TEST}::test_the_ring_computes_what_the_gathered_weight_does",
            f"{CMATMUL_TEST}::test_gradients_through_the_ring_equal_the_gathered_ones",
        ),
    ),
    Mutant(
        "own-columns",
        "every arriving shard multiplied by the device's own columns of x",
        CMATMUL,
        (("(me - k) % n * e", "me * e"),),
        (f"{CMATMUL_TEST}::test_the_ring_computes_what_the_gathered_weight_does",),
    ),
    Mutant(
        "last-shard-dropped",
        "the ring stops one shard short: the last arrival is never multiplied",
        CMATMUL,
        (("return out + times(n - 1, w)", "return out"),),
        (f"{CMATMUL_TEST}::test_the_ring_computes_what_the_gathered_weight_does",),
    ),
    Mutant(
        "gather-after-all",
        "collective_matmul gathers the weight whole: right numbers, nothing overlapped",
        CMATMUL,
        (("    n = mesh.shape[RING]\n", "    return allgather_matmul(x, w, mesh)\n"),),
        (
            f"{CMATMUL_TEST}::test_each_device_receives_the_shards_it_lacks_one_hop_each",
            f"{CMATMUL_TEST}::test_on_a_tpu_each_permute_flies_while_a_shard_is_multiplied",
        ),
    ),
    Mutant(
        "send-after-multiply",
        "each shard sent on only once its matmul is done: right numbers, the permutes exposed",
        CMATMUL,
        (
            (
                "            w_next = jax.lax.ppermute(w, RING, ring)  # in flight while ...\n"
                "            out = out + times(k, w)  # ... the shard in hand is multiplied\n",
                "            out, w = jax.lax.optimization_barrier((out + times(k, w), w))\n"
                "            w_next = jax.lax.ppermute(w, RING, ring)\n",
            ),
        ),
        (f"{CMATMUL_TEST}::test_on_a_tpu_each_permute_flies_while_a_shard_is_multiplied",),
    ),
    Mutant(
        "hidden-any-order",
        "a permute counted as hidden whatever runs between its start and its done",
        "roofline/compiled/schedule.py",
        (('"matmul" in roles[started[op.operands[0]] : at]', "True"),),
        (f"{CMATMUL_TEST}::test_a_permute_is_hidden_only_if_a_matmul_runs_while_it_flies",),
    ),
    Mutant(
        "channel-once",
        "collectives sharing a channel counted once even outside fusions: a ring of 7 hops reads 1",
        "roofline/compiled/program.py",
        (("        if channel and computation.name in fused:\n", "        if channel:\n"),),
        (f"{CMATMUL_TEST}::test_a_chain_of_permutes_on_one_channel_is_every_hop",),
    ),
    Mutant(
        "bf16-scatter",
        "the token embedding looked up in the bf16 table: its gradient summed in bf16 "
        "(the H100's atomics, 0.12x PyTorch)",
        "sessions/model/transformer.py",
        (
            (
                'x = lookup(p["embed"], tokens).astype(cfg.dtype)',
                'x = lookup(p["embed"].astype(cfg.dtype), tokens)',
            ),
        ),
        (
            f"{EMBED_GRAD}::test_the_step_s_lookup_gradient_is_the_float64_sum",
            f"{EMBED_GRAD}::test_a_bf16_step_compiled_here_sums_every_scatter_in_float32",
            f"{PLANS}::test_gradients_sum_in_float32_on_a_gpu_and_a_tpu",
        ),
    ),
    Mutant(
        "bf16-scatter-forward",
        "forward hands the lookup the params it cast to bf16: the embedding's gradient "
        "summed in bf16 again, whatever embed does",
        "sessions/model/transformer.py",
        (
            (
                "    x = embed(float32_tables(params), tokens, cfg)\n",
                "    x = embed(p, tokens, cfg)\n",
            ),
        ),
        (
            f"{EMBED_GRAD}::test_the_step_s_lookup_gradient_is_the_float64_sum",
            f"{EMBED_GRAD}::test_a_bf16_step_compiled_here_sums_every_scatter_in_float32",
            f"{PLANS}::test_gradients_sum_in_float32_on_a_gpu_and_a_tpu",
        ),
    ),
    Mutant(
        "flax-embed-dtype",
        "Flax's Embed given the compute dtype: it casts its table before the lookup",
        "sessions/model/flax_model.py",
        (
            (
                "nnx.Embed(V, E, embedding_init=",
                "nnx.Embed(V, E, dtype=jnp.dtype(cfg.dtype), embedding_init=",
            ),
        ),
        ("tests/test_flax_model.py::test_the_flax_lookup_sums_its_gradient_in_float32",),
    ),
    Mutant(
        "fsdp-ends-cast",
        "manual FSDP gathers the embedding in bf16 for its lookup",
        "sessions/train/manual_fsdp.py",
        (
            (
                'gather_weights({name: w for name, w in params.items() if name != "layers"})',
                'gather_weights({name: w for name, w in p.items() if name != "layers"})',
            ),
        ),
        (
            "tests/test_manual_fsdp.py::"
            "test_the_manual_step_in_bf16_sums_the_lookup_s_gradient_in_float32",
        ),
    ),
    Mutant(
        "scatter-result-only",
        "a scatter's sum read from its result type alone: the CPU's widened bf16 sum passes",
        "roofline/compiled/scatters.py",
        (
            (
                "    held = [scatter.dtype]\n    for name",
                "    held = [scatter.dtype]\n    for name in ():  #",
            ),
        ),
        (f"{HLO_READING}::test_each_scatter_with_its_kernel_and_the_dtype_its_sums_are_held_in",),
    ),
    Mutant(
        "scatter-kernel-own-name",
        "a fused scatter named by itself, not by the kernel a trace shows",
        "roofline/compiled/scatters.py",
        (("            while where in caller:", "            while False:"),),
        (
            f"{HLO_READING}::test_each_scatter_with_its_kernel_and_the_dtype_its_sums_are_held_in",
            f"{HLO_READING}::test_the_h100_step_summed_its_embedding_gradient_in_bf16",
        ),
    ),
    Mutant(
        "exercise-scatter-result-only",
        "the exercise's solution reads a scatter's result type alone",
        "solutions/bug_bf16_scatter.py",
        (
            (
                "            held = {op.dtype} | {i.dtype for i in combiner}\n",
                "            held = {op.dtype}\n",
            ),
        ),
        (
            "tests/test_exercises/test_session_bugs.py::test_scatter_dtypes_reads_what_the_compiler_made",
        ),
    ),
    Mutant(
        "lookup-cast-first",
        "the exercise's solution casts the table before the lookup",
        "solutions/bug_bf16_scatter.py",
        (("    return table[tokens].astype(dtype)\n", "    return table.astype(dtype)[tokens]\n"),),
        (
            "tests/test_exercises/test_session_bugs.py::test_the_lookup_sums_its_gradient_in_float32",
        ),
    ),
    Mutant(
        "positions-reduce",
        "the positions' gradient a reduction over the batch: the H100 step transposes its "
        "residual stream at every norm",
        "sessions/model/positions.py",
        (
            (
                '    return x + jnp.einsum("B,SE->BSE", jnp.ones((B,), x.dtype), pos)\n',
                "    return x + pos[None]\n",
            ),
        ),
        (f"{PLANS}::test_the_course_step_on_h100_moves_no_residual_stream_around",),
    ),
    Mutant(
        "picked-by-index",
        "the target's logit picked by take_along_axis: a scatter into [B, S, V] in the backward",
        "sessions/model/transformer.py",
        (
            (
                "jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)",
                "jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]",
            ),
        ),
        (f"{PLANS}::test_no_scatter_writes_the_logits",),
    ),
    Mutant(
        "f32-logits",
        "the logits written in float32 (preferred_element_type): twice the bytes of the "
        "step's largest array",
        "sessions/model/quantize.py",
        (
            (
                'return jnp.einsum("BSE,VE->BSV", x, table)\n',
                'return jnp.einsum("BSE,VE->BSV", x, table, preferred_element_type=jnp.float32)\n',
            ),
        ),
        (
            "tests/test_model.py::test_bfloat16_forward_is_close_to_float32",
            f"{PLANS}::test_bf16_step_runs_its_matmuls_in_bf16",
        ),
    ),
    Mutant(
        "reference-at-default",
        "the float32 reference compiled at the chip's default precision (TF32 on a GPU)",
        "sessions/kernels/precision.py",
        (('    with jax.default_matmul_precision("highest"):\n', "    if True:\n"),),
        (f"{S4}::test_the_references_are_compiled_at_precision_highest",),
    ),
    Mutant(
        "reference-not-exact",
        "session 4's kernel checked against a reference at the chip's default precision",
        "sessions/s4_kernels.py",
        (
            (
                "exact = precision.exact(functools.partial(attention_and_grads, einsum_attention)",
                "exact = jax.jit(functools.partial(attention_and_grads, einsum_attention))(",
            ),
            (", q, k, v, dout)\n    # The kernel's", "q, k, v, dout)\n    # The kernel's"),
        ),
        (f"{S4}::test_every_check_holds_and_is_printed",),
    ),
    Mutant(
        "cpu-tolerance-everywhere",
        "float32's tolerance on every chip: session 4 fails on a GPU with no bug",
        "sessions/kernels/precision.py",
        (
            (
                "    return FLOAT32 if major.isdigit() and int(major) < 8 else TF32\n",
                "    return FLOAT32\n",
            ),
        ),
        (
            f"{S4}::test_each_chip_s_matmul_precision_and_tolerances_by_hand",
            f"{S4}::test_every_kernel_check_holds_at_a_chips_rounding[h100-tf32]",
        ),
    ),
    Mutant(
        "tolerance-ignores-scores",
        "the tolerance blind to how large the scores are that the chip rounds",
        "sessions/kernels/precision.py",
        (
            (
                "    return floor + 2 * u * (1 + max_score) * scale",
                "    return floor + 2 * u * scale",
            ),
        ),
        (f"{S4}::test_each_chip_s_matmul_precision_and_tolerances_by_hand",),
    ),
    Mutant(
        "gpu-sums-like-cpu",
        "a GPU's float32 sums taken to round as the reference's: its online softmax held to "
        "1e-5, below float32's own error there (5e-5)",
        "sessions/kernels/precision.py",
        (('    order = 0.0 if device.platform == "cpu" else', "    order = 0.0 if True else"),),
        (f"{S4}::test_each_chip_s_matmul_precision_and_tolerances_by_hand",),
    ),
    Mutant(
        "flash-acc-not-rescaled",
        "the kernel's running output not rescaled when a key block raises the max: caught "
        "within a TPU's bf16 tolerance too",
        "sessions/kernels/flash.py",
        (
            (
                "        return m_new, total, acc * rescale + pv\n",
                "        return m_new, total, acc + pv\n",
            ),
        ),
        (
            f"{S4}::test_every_kernel_check_holds_at_a_chips_rounding[tpu-bf16]",
            f"{S4}::test_every_kernel_check_holds_at_a_chips_rounding[h100-tf32]",
        ),
    ),
    Mutant(
        "target-needs-compilers",
        "step 5 asks for the chip compilers on the very chip it targets",
        "sessions/plan/programs.py",
        (("        if here is not None:\n", "        if False:\n"),),
        (f"{S4}::test_a_chip_compiles_its_own_tables_without_the_chip_compilers",),
    ),
    Mutant(
        "target-any-local-device",
        "step 5 takes this machine's devices for the target without an accelerator here",
        "sessions/plan/programs.py",
        (("    if unseen_accelerator() is not None:  # a GPU", "    if True:  # a GPU"),),
        (f"{S4}::test_a_chip_compiles_its_own_tables_without_the_chip_compilers",),
    ),
    Mutant(
        "overlap-nests",
        "a kernel that starts before the last one ends is taken as nested in it (the H100's "
        "negative times)",
        "roofline/measured/trace.py",
        (
            (
                "            while stack and ops[stack[-1]].end_ps < ops[i].end_ps:\n",
                "            while stack and ops[stack[-1]].end_ps <= ops[i].start_ps:\n",
            ),
        ),
        (
            f"{TRUTH}::test_random_nested_and_overlapping_events_keep_the_invariants",
            f"{TRUTH}::test_a_kernel_that_starts_before_the_last_one_ends_is_not_nested_in_it",
        ),
    ),
    Mutant(
        "children-summed",
        "nested ops subtracted one by one, not as their union: overlapping children count twice",
        "roofline/measured/trace.py",
        (
            (
                "        own[parent] -= _busy(children)\n",
                "        own[parent] -= sum(o.end_ps - o.start_ps for o in children)\n",
            ),
        ),
        (f"{TRUTH}::test_random_nested_and_overlapping_events_keep_the_invariants",),
    ),
    Mutant(
        "any-library",
        "a library's kernel fits any library call: cuBLAS's kernels go to cuDNN's calls",
        "roofline/measured/kernel_ops.py",
        (("    return WRONG if op_family in", "    return FAMILY if op_family in"),),
        (f"{TRUTH}::test_a_library_s_kernels_go_to_a_call_of_that_library",),
    ),
    Mutant(
        "buffer-lumped",
        "kernels of a command buffer left under command_buffer_1",
        "roofline/measured/trace.py",
        (("    if buffered:\n", "    if False:\n"),),
        (f"{TRUTH}::test_command_buffer_kernels_go_to_their_ops_and_agree_with_the_early_trace",),
    ),
    Mutant(
        "silent-10x",
        "an op measured at 1,000x its prediction is not called out",
        "roofline/measured/op_table.py",
        (("        flag = ratio is not None and ratio >= BROKEN\n", "        flag = False\n"),),
        (f"{TRUTH}::test_compare_names_the_scatter_as_the_slowest_op_and_says_why",),
    ),
    Mutant(
        "concept-imports-cli",
        "a concept module reaches into the scripts' flags (sessions/run/cli.py)",
        "sessions/inference/sample.py",
        (("import jax\n", "import jax\n\nfrom sessions.run.cli import PROMPT  # noqa: F401\n"),),
        (f"{LAYERS}::test_every_import_in_sessions_follows_the_package_order",),
    ),
    Mutant(
        "concept-errors-from-run",
        "a concept takes its UsageError from the plumbing again (sessions/run/cli.py has it)",
        "sessions/inference/kernel_step.py",
        (("from sessions.errors import UsageError", "from sessions.run.cli import UsageError"),),
        (f"{LAYERS}::test_every_import_in_sessions_follows_the_package_order",),
    ),
    Mutant(
        "stale-path",
        "a docstring names a file that is gone (generate.py, in sessions/)",
        "sessions/inference/sample.py",
        (
            (
                "with the cached decoder of sessions/inference/kv_cache.py",
                "with " + os.path.join("sessions", "generate.py"),
            ),
        ),
        (f"{LAYERS}::test_every_path_named_in_the_code_and_docs_exists",),
    ),
    Mutant(
        "concept-unlisted",
        "docs/layout.md's table of sessions/inference/ loses a module",
        "docs/layout.md",
        (("| `sample.py` | sampling text |\n", ""),),
        (f"{LAYERS}::test_the_layout_tables_name_exactly_each_folder_s_modules",),
    ),
    Mutant(
        "model-imports-train",
        "the model reaches up into training for a batch (a package later in the order)",
        "sessions/model/transformer.py",
        (
            (
                "import jax\n",
                "import jax\n\nfrom sessions.train.data import get_batch  # noqa: F401\n",
            ),
        ),
        (f"{LAYERS}::test_every_import_in_sessions_follows_the_package_order",),
    ),
    Mutant(
        "face-circle",
        "a module of sessions/model/ takes ModelConfig through its own package's face",
        "sessions/model/attention.py",
        (("import jax\n", "import jax\n\nfrom sessions.model import ModelConfig  # noqa: F401\n"),),
        (f"{LAYERS}::test_no_import_circle_in_sessions_counting_the_packages_faces",),
    ),
    Mutant(
        "order-loses-a-package",
        "docs/layout.md's package order forgets a package",
        "docs/layout.md",
        (("errors < shard < kernels < model <", "errors < shard < model <"),),
        (f"{LAYERS}::test_the_order_names_errors_every_package_and_the_scripts_once",),
    ),
    Mutant(
        "tpu-v3-whole-peak",
        "a TensorCore of a TPU v3 held to the whole chip's peak",
        "roofline/chip.py",
        (
            (
                "    matmul = chip.peak(dtype, precision) / devices_per_chip",
                "    matmul = chip.peak(dtype, precision)",
            ),
        ),
        (f"{OP_ROOFLINE}::test_a_chip_of_two_devices_gives_each_half_its_figures",),
    ),
    Mutant(
        "kv-cache-h-heads",
        "the KV cache counted with H heads, not the K a grouped-query model caches",
        "roofline/decode_cost.py",
        (("batch * cfg.seq * cfg.n_kv_heads", "batch * cfg.seq * cfg.heads"),),
        (f"{PLANNER}::test_kv_cache_bytes_under_gqa_and_int8_for_llama3_8b",),
    ),
    Mutant(
        "decode-cache-one-sequence",
        "a decode step's cache counted for one sequence, whatever the batch",
        "roofline/decode_cost.py",
        (
            (
                "    c = kv_cache_bytes(cfg, batch, dtype, cache=cache)\n    flops",
                "    c = kv_cache_bytes(cfg, 1, dtype, cache=cache)\n    flops",
            ),
        ),
        ("tests/test_s5_serve.py::test_s5_levers_bytes_quality_and_ladder",),
    ),
    Mutant(
        "decode-tokens-one-sequence",
        "a measured decode step's tokens/s counted for one sequence, whatever the batch",
        "roofline/decode_cost.py",
        (("tokens_per_s=step.batch / step_s,", "tokens_per_s=1 / step_s,"),),
        ("tests/test_s5_serve.py::test_s5_levers_bytes_quality_and_ladder",),
    ),
    Mutant(
        "int8-weights-no-scales",
        "int8 weights counted without their float32 scale per output channel",
        "roofline/decode_cost.py",
        (
            (
                "matmul_params(cfg) + embedding_row + SCALE_BYTES * scales",
                "matmul_params(cfg) + embedding_row",
            ),
        ),
        (f"{PLANNER}::test_weight_bytes_bf16_and_int8_for_llama3_8b",),
    ),
    Mutant(
        "fits-on-bytes-read",
        "whether a batch fits judged by the bytes a step reads, not every weight held whole",
        "roofline/plan/serving.py",
        (("total = held + step.cache_bytes", "total = step.bytes"),),
        (f"{PLANNER}::test_fits_and_does_not_fit_on_an_h100",),
    ),
    Mutant(
        "training-run-napkin",
        "a training run's FLOPs as 6·T·P, not the exact count MFU is defined against",
        "roofline/predict.py",
        (
            (
                "flops = tokens * ledger(cfg, 1).exact // cfg.seq",
                "flops = 6 * tokens * ledger(cfg, 1).params",
            ),
        ),
        (f"{PLANNER}::test_predict_a_training_run_of_llama2_7b",),
    ),
    Mutant(
        "rope-neighbours",
        "RoPE pairing neighbours (2i, 2i + 1), not the halves (i, i + D/2) it documents",
        "sessions/model/rotary.py",
        (
            (
                "x1, x2 = x32[..., : D // 2], x32[..., D // 2 :]",
                "x1, x2 = x32[..., 0::2], x32[..., 1::2]",
            ),
        ),
        (
            f"{FAMILY}::test_rope_equals_a_float64_rotation",
            f"{FAMILY}::test_forward_equals_a_plain_llama_block",
        ),
    ),
    Mutant(
        "rope-not-a-rotation",
        "RoPE's second half turned the wrong way: q·k then depends on more than m - n",
        "sessions/model/rotary.py",
        (("x2 * cos + x1 * sin", "x2 * cos - x1 * sin"),),
        (f"{FAMILY}::test_rope_scores_depend_only_on_the_distance",),
    ),
    Mutant(
        "rope-decode-at-zero",
        "the decode step turns its token's q and k as if at position 0",
        "sessions/inference/kv_cache.py",
        (
            (
                "x, new = block(layer, x, cfg, attend, dense=dense_out_in, start=pos)",
                "x, new = block(layer, x, cfg, attend, dense=dense_out_in)",
            ),
        ),
        (
            f"{FAMILY}::test_the_cached_decode_gives_the_model_s_logits[rope]",
            f"{FAMILY}::test_the_llama_block_decodes_alike_on_a_mesh",
        ),
    ),
    Mutant(
        "gqa-heads-interleaved",
        "query head h reads KV head h % K, not h // G",
        "sessions/model/attention.py",
        (
            (
                "    q = q.reshape(B, S, K, H // K, D)\n",
                "    q = q.reshape(B, S, H // K, K, D).swapaxes(2, 3)\n",
            ),
        ),
        (
            f"{FAMILY}::test_one_kv_head_is_hand_written_multi_query_attention[einsum]",
            f"{FAMILY}::test_forward_equals_a_plain_llama_block",
        ),
    ),
    Mutant(
        "gqa-cache-interleaved",
        "the cached decode's query head h reads cached head h % K",
        "sessions/inference/kv_cache.py",
        (
            (
                "q = q.reshape(B, S, K, H // K, D).transpose(0, 2, 3, 1, 4)",
                "q = q.reshape(B, S, H // K, K, D).transpose(0, 3, 2, 1, 4)",
            ),
        ),
        (f"{FAMILY}::test_the_llama_block_decodes_alike_on_a_mesh",),
    ),
    Mutant(
        "kv-heads-over-tp",
        "the KV heads' split over tp left unchecked",
        "sessions/shard/sharding.py",
        (('        ("kv_heads", model_cfg.n_kv_heads, sizes["tp"], "tp"),\n', ""),),
        (
            f"{FAMILY}::test_kv_heads_split_over_tp",
            "tests/test_cli.py::test_bad_input_is_one_line_and_exit_2[kv heads vs mesh]",
        ),
    ),
    Mutant(
        "count-no-gate",
        "the gated MLP counted with two matrices",
        "roofline/flops.py",
        (
            (
                "return (3 if cfg.gated else 2) * cfg.embed * cfg.ff",
                "return 2 * cfg.embed * cfg.ff",
            ),
        ),
        (
            f"{FAMILY}::test_the_roofline_counts_every_parameter[gated]",
            f"{FAMILY}::test_xla_counts_the_llama_step_as_the_roofline_does",
        ),
    ),
    Mutant(
        "launch-buffers-skipped",
        "the kernels inside a command buffer are not counted",
        "roofline/compiled/launches.py",
        (('elif op.opcode in ("call", "async-start"):', 'elif op.opcode == "async-start":'),),
        (f"{LAUNCHES}::test_a_token_counts_the_body_and_the_command_buffer_inside",),
    ),
    Mutant(
        "launch-condition-twice",
        "the loop's condition counted twice a token",
        "roofline/compiled/launches.py",
        (
            (
                '        _count(module, loop.calls["condition"][0], found, buffers)\n',
                '        _count(module, loop.calls["condition"][0], found, buffers, 2)\n',
            ),
        ),
        (f"{LAUNCHES}::test_a_loop_of_unknown_trips_runs_its_condition_each_trip",),
    ),
    Mutant(
        "launch-condition-of-known-trips",
        "the condition of a loop whose trips XLA knows counted, though a GPU never runs it",
        "roofline/compiled/launches.py",
        (("""    return '"known_trip_count"' in loop""", "    return False and loop"),),
        (
            f"{LAUNCHES}::test_a_token_counts_the_body_and_the_command_buffer_inside",
            f"{LAUNCHES}::test_the_count_is_xla_s_own_list_of_kernels",
        ),
    ),
    Mutant(
        "launch-bitcast-counted",
        "a bitcast (a view of the same buffer) counted as a kernel",
        "roofline/compiled/launches.py",
        (('"tuple", "bitcast",', '"tuple",'),),
        (f"{LAUNCHES}::test_a_token_counts_the_body_and_the_command_buffer_inside",),
    ),
    Mutant(
        "launch-min",
        "the smallest of the three bounds taken for the step",
        "roofline/launch_bound.py",
        (("bound = max(times, key=times.get)", "bound = min(times, key=times.get)"),),
        (f"{LAUNCH_BOUND}::test_the_largest_of_three_binds",),
    ),
    Mutant(
        "launch-cost-not-floor",
        "a launch's cost taken as the larger measured step over its kernels, not the least",
        "roofline/gpus.py",
        (("GPU_LAUNCH_S = min(", "GPU_LAUNCH_S = max("),),
        (f"{LAUNCH_BOUND}::test_the_roof_sits_under_every_step_measured_on_the_h100",),
    ),
    Mutant(
        "launch-table-bound",
        "the planner's table names the bytes-or-FLOPs bound, blind to the launches",
        "roofline/plan/serving_report.py",
        (("{t.floor_bound:<9}", "{r.step.bound:<9}"),),
        (f"{LAUNCH_BOUND}::test_the_planner_names_the_bound_of_each_batch",),
    ),
    Mutant(
        "master-costs-nothing",
        "the float32 master copy counted at 0 bytes: ZeRO's 16 and Megatron's 18 fall short",
        TRAINING_STATE,
        (('"master": 4 if self.master else 0,', '"master": 0,'),),
        (f"{MEMORY_TEST}::test_the_three_conventions_count_10_16_and_18_bytes_a_parameter",),
    ),
    Mutant(
        "zero2-leaves-the-gradients-whole",
        "ZeRO's stage 2 divides the optimizer and master but keeps each gradient whole",
        TRAINING_STATE,
        (
            (
                '"gradients": ("optimizer", "master", "grads"),',
                '"gradients": ("optimizer", "master"),',
            ),
        ),
        (f"{MEMORY_TEST}::test_zero_s_stages_divide_the_state_as_its_paper_writes[8]",),
    ),
    Mutant(
        "tp-splits-the-norms",
        "tensor parallelism divides every parameter, the copied norm scales too",
        MEMORY_PLAN,
        (
            (
                "per_chip[part] = size * (matrices / tp + rest) / divide / stages",
                "per_chip[part] = size * (matrices + rest) / tp / divide / stages",
            ),
        ),
        (f"{MEMORY_TEST}::test_tensor_parallelism_splits_the_matrices_and_the_split_activations",),
    ),
    Mutant(
        "dots-saves-the-mlp-output",
        "the dots policy counted as saving w_out's output, which no backward reads",
        SAVED_ACTIVATIONS,
        (
            (
                "    wanted = [name for outputs, inputs, _, reads in ops if reads for name in inputs]\n",
                "    wanted = [name for outputs, inputs, _, reads in ops if reads for name in inputs]\n"
                '    wanted.append("mlpwo")\n',
            ),
        ),
        (
            f"{MEMORY_TEST}::test_the_saved_tensors_are_what_jax_saves_for_our_layer",
            f"{MEMORY_TEST}::test_activations_by_policy_and_accumulation",
        ),
    ),
    Mutant(
        "accum-keeps-every-microbatch",
        "gradient accumulation's activations counted for the whole batch, not one microbatch",
        MEMORY_PLAN,
        (("micro = tokens / lv.accum", "micro = tokens"),),
        (f"{MEMORY_TEST}::test_activations_by_policy_and_accumulation",),
    ),
    Mutant(
        "block-remat-is-free",
        "block remat's recompute left out of the step's FLOPs: 6·B·P, not about 8",
        SAVED_ACTIVATIONS,
        (
            (
                "    _, rebuilt = kept_and_rebuilt(cfg, chosen(remat))\n",
                "    _, rebuilt = kept_and_rebuilt(cfg, chosen(remat))\n"
                '    rebuilt = rebuilt if remat != "block" else rebuilt[-2:]\n',
            ),
        ),
        (f"{MEMORY_TEST}::test_remat_s_recompute_is_priced_in_flops",),
    ),
    Mutant(
        "none-forgets-the-scores",
        "no remat counted as keeping only the probabilities, not the scores and exponentials",
        SAVED_ACTIVATIONS,
        (("(2 * H * S, True, 4)", "(0, True, 4)"),),
        (
            f"{MEMORY_TEST}::test_activations_by_policy_and_accumulation[none]",
            f"{MEMORY_TEST}::test_the_napkin_is_within_15_percent_above_xla_s_plan_of_our_step",
        ),
    ),
    Mutant(
        "backward-holds-nothing",
        "the transients leave out one layer's backward: the napkin falls short of XLA's plan",
        MEMORY_PLAN,
        (
            (
                'whole["transients"] = max(logits, saved_bytes(full, act_bytes)) * micro',
                'whole["transients"] = logits * micro',
            ),
            (
                'per_chip["transients"] = max(logits / tp, _a_token(full, act_bytes, tp, sp)) * here',
                'per_chip["transients"] = logits / tp * here',
            ),
        ),
        (f"{MEMORY_TEST}::test_the_napkin_is_within_15_percent_above_xla_s_plan_of_our_step",),
    ),
    Mutant(
        "s6-levers-not-pulled",
        "session 6 compiles every lever's row with the run's own remat policy",
        "sessions/plan/memory_levers.py",
        (("remat=lever.remat, scan_layers", 'remat="none", scan_layers'),),
        ("tests/test_s6_memory.py::test_the_levers_change_the_bytes_and_never_the_loss",),
    ),
    Mutant(
        "rebuilt-ops-taken-for-the-backward",
        "the schedule's first backward op found among the rebuilt ones, which JAX names "
        "transpose(...) too: an early rebuild never seen",
        "sessions/plan/memory_levers.py",
        (('if "transpose(" in name and not rebuilt[i]', 'if "transpose(" in name'),),
        (f"{REMAT_TEST}::test_remat_saves_memory_where_the_schedule_rebuilds_in_the_backward",),
    ),
    Mutant(
        "norm-in-compute-dtype",
        "a norm's x·rsqrt counted in the compute dtype, though rms_norm keeps it in float32",
        SAVED_ACTIVATIONS,
        (('"x·rsqrt": (E, False, 4)', '"x·rsqrt": (E, False, None)'),),
        (f"{MEMORY_TEST}::test_in_bf16_the_napkin_s_float32_buffers_are_jax_s",),
    ),
    Mutant(
        "scan-stack-uncounted",
        "the scanned step's stacked weights and their gradient left out of the napkin",
        MEMORY_PLAN,
        (("    if lv.scan:  # the stacked copy", "    if False:  # the stacked copy"),),
        (f"{MEMORY_TEST}::test_scanned_layers_add_their_stacked_weights_and_its_gradient",),
    ),
    Mutant(
        "scan-ignored",
        "--scan-layers reaches the config, and the forward runs the layers unrolled",
        "sessions/model/transformer.py",
        (("    if cfg.scan_layers:\n", "    if False:\n"),),
        (f"{MEMORY_TEST}::test_the_napkin_is_within_15_percent_of_xla_s_plan_of_the_scanned_step",),
    ),
    Mutant(
        "remat-ignored",
        "--remat reaches the config, and the forward leaves every layer as it is",
        "sessions/model/transformer.py",
        (
            (
                "layer_fn = remat(lambda layer, x: block(layer, x, cfg, causal, matmul)[0], cfg.remat)",
                'layer_fn = remat(lambda layer, x: block(layer, x, cfg, causal, matmul)[0], "none")',
            ),
        ),
        (f"{REMAT_TEST}::test_remat_saves_memory_where_the_schedule_rebuilds_in_the_backward",),
    ),
    Mutant(
        "remat-dots-saves-everything",
        "the dots lever saves every value, not the matmuls' outputs alone",
        "sessions/model/remat.py",
        (
            (
                "jax.checkpoint_policies.dots_with_no_batch_dims_saveable,",
                "jax.checkpoint_policies.everything_saveable,",
            ),
        ),
        (f"{REMAT_TEST}::test_the_model_s_own_lever_keeps_what_the_napkin_counts[dots]",),
    ),
    Mutant(
        "checkpoint-holds-remat",
        "a checkpoint trained under one remat policy refused by a run under another",
        "sessions/run/checkpoint.py",
        (
            (
                '"model": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in LEVERS},',
                '"model": dataclasses.asdict(cfg),',
            ),
        ),
        (f"{REMAT_TEST}::test_a_checkpoint_resumes_under_another_policy",),
    ),
    Mutant(
        "accum-sums-not-means",
        "accumulated gradients summed over the microbatches and never divided",
        "sessions/train/step.py",
        (
            (
                "return jax.tree.map(lambda total: total / accum, (loss, grads))",
                "return loss / accum, grads",
            ),
        ),
        (f"{REMAT_TEST}::test_four_microbatches_give_one_batch_s_loss_and_gradient",),
    ),
    Mutant(
        "accum-not-passed-on",
        "s2_train.py takes --accum and compiles a step of one whole batch",
        "sessions/s2_train.py",
        (("            accum=tc.accum,\n", ""),),
        (f"{REMAT_TEST}::test_s2_with_accum_logs_the_losses_of_one_batch",),
    ),
    Mutant(
        "our-kernels-counted-as-xla-s",
        "--kernels-per-layer 2 planned with XLA's 8 kernels outside the layers, not our 7",
        "roofline/launch_bound.py",
        (("(OUR_KERNELS_OUTSIDE if ours else XLA_KERNELS_OUTSIDE)", "XLA_KERNELS_OUTSIDE"),),
        ("tests/test_launch_bound.py::test_kernels_a_token_by_estimate",),
    ),
    Mutant(
        "uneven-heads-planned",
        "decode over a chip count that splits no head evenly planned, exit 0",
        "roofline/__main__.py",
        (("if (n := args.chips) > 1 and not splits_heads(cfg, n):", "if False:"),),
        ("tests/test_planner.py::test_bad_input_is_one_line_and_exit_2",),
    ),
    Mutant(
        "fewest-chips-on-double-hbm",
        "the fewest chips for a model counted against twice each chip's HBM",
        "roofline/plan/serving.py",
        (("if held <= n * chip.hbm_bytes), None)", "if held <= 2 * n * chip.hbm_bytes), None)"),),
        ("tests/test_planner.py::test_a_model_too_big_for_one_chip_says_how_many_it_needs",),
    ),
    Mutant(
        "what-if-refused",
        "a context past the published one refused for a rotary model too",
        "roofline/__main__.py",
        (("if context > model.seq and model.learned_positions:", "if context > model.seq:"),),
        (
            "tests/test_planner.py::"
            "test_a_rope_model_is_planned_past_its_published_context_as_a_what_if",
        ),
    ),
    Mutant(
        "learned-table-outgrown",
        "a context past a learned position table's rows planned as if it had more",
        "roofline/__main__.py",
        (("if context > model.seq and model.learned_positions:", "if False:"),),
        ("tests/test_planner.py::test_bad_input_is_one_line_and_exit_2",),
    ),
    Mutant(
        "master-ignored",
        "--master asked, and the update added to the bf16 weights alone, small ones lost",
        "sessions/train/master_weights.py",
        (("        if not master:\n", "        if True:\n"),),
        (
            f"{MASTER_TEST}::test_an_update_below_half_a_bf16_place_is_lost_without_a_master",
            f"{MASTER_TEST}::test_the_master_recipe_follows_the_float32_weights_run",
        ),
    ),
    Mutant(
        "master-from-the-rounded-draw",
        "the master copy taken from the weights after their rounding to bf16, not the draw",
        "sessions/train/step.py",
        (
            (
                "    opt = optimizer.init(params)\n"
                '    return {"params": jax.tree.map(lambda w: w.astype(weights), params), "opt": opt}',
                "    params = jax.tree.map(lambda w: w.astype(weights), params)\n"
                '    return {"params": params, "opt": optimizer.init(params)}',
            ),
        ),
        (f"{MASTER_TEST}::test_the_master_recipe_follows_the_float32_weights_run",),
    ),
    Mutant(
        "accum-sums-in-the-weights-dtype",
        "the microbatches' gradients of bf16 weights summed in bf16",
        "sessions/train/step.py",
        (
            (
                "jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), (jnp.zeros(()), params))",
                "jax.tree.map(jnp.zeros_like, (jnp.zeros(()), params))",
            ),
        ),
        (f"{MASTER_TEST}::test_accumulation_sums_bf16_weights_gradients_in_float32",),
    ),
    Mutant(
        "bf16-table-looked-up-as-stored",
        "bf16 weights' embedding looked up in bf16: its gradient's scatter sums in bf16",
        "sessions/model/transformer.py",
        (
            (
                "    x = embed(float32_tables(params), tokens, cfg)",
                "    x = embed(params, tokens, cfg)",
            ),
        ),
        (
            "tests/test_embedding_gradient.py::"
            "test_a_bf16_step_compiled_here_sums_every_scatter_in_float32[bf16 weights]",
        ),
    ),
    Mutant(
        "checkpoint-forgets-the-recipe",
        "a checkpoint of bf16 weights and a master restored into a float32 run's state",
        "sessions/run/checkpoint.py",
        (('        "weights": tc.weights,\n        "master": tc.master,\n', ""),),
        (
            f"{MASTER_TEST}::test_a_checkpoint_of_bf16_weights_restores_serves_and_refuses_another_recipe",
        ),
    ),
    Mutant(
        "recipe-grads-as-autodiff-gives-them",
        "the napkin counts bf16 weights' gradients in bf16, where the step makes them float32",
        "sessions/plan/memory_levers.py",
        (
            (
                "Recipe(lever.weights, lever.master)",
                "Recipe(lever.weights, lever.master, lever.weights)",
            ),
        ),
        (f"{MASTER_TEST}::test_xla_holds_the_state_the_napkin_counts_for_each_recipe",),
    ),
    Mutant(
        "max-batch-napkin-unsharded",
        "max_batch.py's napkin keeps the whole state on each device of an fsdp mesh",
        "roofline/plan/memory_report.py",
        (('shard="params" if sizes["fsdp"] > 1 else "none"', 'shard="none"'),),
        (f"{MEMORY_TEST}::test_max_batch_s_napkin_line_plans_the_mesh_it_is_given",),
    ),
    Mutant(
        "min-chips-one-short",
        "the fewest chips rounded down: a count that does not hold the step",
        MEMORY_PLAN,
        (
            (
                "least = lv.tp * lv.stages * max(1, math.ceil(divided / (usable - kept)))",
                "least = lv.tp * lv.stages * max(1, math.floor(divided / (usable - kept)) - 1)",
            ),
            (
                "return good and total(there.copies, batch_tokens) <= usable",
                "return good",
            ),
        ),
        (f"{MEMORY_TEST}::test_the_fewest_chips_and_the_largest_batch_are_the_edges_of_fitting",),
    ),
    Mutant(
        "estimate-takes-the-max",
        "the decode estimate lets the largest cost hide the others, as the floor does",
        ESTIMATE,
        (("sum(terms.values()), binds", "max(terms.values()), binds"),),
        (
            f"{ESTIMATE_TEST}::{WITHIN_25}",
            f"{ESTIMATE_TEST}::test_launches_and_bytes_add_where_the_floor_takes_the_larger",
        ),
    ),
    Mutant(
        "littles-law-ignored",
        "our kernels' bytes stream at the roof whatever they keep in flight",
        ESTIMATE,
        (
            (
                "achievable = achievable_bandwidth(bandwidth, in_flight)",
                "achievable = bandwidth",
            ),
        ),
        (f"{ESTIMATE_TEST}::test_a_kernel_with_too_little_in_flight_is_estimated_slower_than_xla",),
    ),
    Mutant(
        "xla-at-the-roof",
        "XLA's fusions estimated at the full bandwidth, not the fitted share of it",
        ESTIMATE,
        (("achievable = XLA_FRACTION * bandwidth", "achievable = bandwidth"),),
        (f"{ESTIMATE_TEST}::test_launches_and_bytes_add_where_the_floor_takes_the_larger",),
    ),
    Mutant(
        "floor-at-the-fitted-launch",
        "the floor charges the fitted 1.65 us a launch, above the least a measured step allows",
        ESTIMATE,
        (
            (
                "floor = launch_bound(step, kernels, launch_cost(chip).seconds)",
                "floor = launch_bound(step, kernels, LAUNCH_S)",
            ),
        ),
        (f"{ESTIMATE_TEST}::{WITHIN_25}",),
    ),
    Mutant(
        "ring-steps-halved",
        "an all-reduce ring charged n-1 steps, not a reduce-scatter's and an all-gather's 2(n-1)",
        ESTIMATE,
        (("steps = 2 * (chips - 1)", "steps = chips - 1"),),
        (f"{ESTIMATE_TEST}::test_an_all_reduce_costs_nccl_s_ring_latency_and_its_bytes",),
    ),
    Mutant(
        "planner-all-reduces-dropped",
        "the planner's estimate on 8 chips leaves tensor parallelism's all-reduces out",
        "roofline/plan/serving.py",
        (("all_reduces=2 * cfg.layers", "all_reduces=0"),),
        (f"{ESTIMATE_TEST}::test_the_planner_gives_the_floor_and_the_estimate_of_each_batch",),
    ),
    Mutant(
        "s3-sample-from-xla",
        "s3's sample decoded by XLA's step whatever --decode-impl asked for",
        "sessions/s3_infer.py",
        (("args.temperature, args.decode_impl)", "args.temperature)"),),
        (SAMPLE_TEST,),
    ),
    Mutant(
        "sample-drops-impl",
        "sample_tokens takes decode_impl and never hands it to generate",
        "sessions/inference/sample.py",
        (("            decode_impl=decode_impl,\n", ""),),
        (SAMPLE_TEST,),
    ),
    Mutant(
        "interpreted-timed",
        "the kernels, interpreted on a CPU, timed again in session 3's table",
        "sessions/s3_infer.py",
        (('    once = impl == "pallas-interpret"\n', "    once = False\n"),),
        (ONCE_TEST,),
    ),
    Mutant(
        "once-sample-from-xla",
        "the untimed form's sample is XLA's row, not the kernels'",
        "sessions/s3_infer.py",
        (("sampled = both.ours[0] if", "sampled = both.xla[0] if"),),
        (ONCE_TEST,),
    ),
    Mutant(
        "check-xla-twice",
        "the kernels' decode compared is XLA's step again: the tokens always agree",
        "sessions/inference/kernel_check.py",
        (("    for step in (None, impl):\n", "    for step in (None, None):\n"),),
        (ONCE_TEST,),
    ),
    Mutant(
        "tokens-never-part",
        "the comparison never finds where the tokens part: always the same tokens",
        "sessions/inference/kernel_check.py",
        (("parted_at = int(differ[0]) if differ.size else None", "parted_at = None"),),
        (
            ONCE_TEST,
            f"{KERNEL_CHECK}::test_the_comparison_says_where_the_tokens_part_and_the_logits_gap",
        ),
    ),
    Mutant(
        "launches-unsaid",
        "the untimed form no longer says what a token launches, ours against XLA's",
        "sessions/s3_infer.py",
        (
            (
                '        print("  " + kernels_on_target.decode_launches(cfg, B, seconds=LAUNCH_SECONDS))\n',
                "",
            ),
        ),
        (ONCE_TEST,),
    ),
    Mutant(
        "launches-swapped",
        "XLA's launches a token said as ours, and ours as XLA's",
        "sessions/plan/kernels_on_target.py",
        (
            (
                "xla = kernel_launches(decode_program(cfg, batch, None, *found)",
                'xla = kernel_launches(decode_program(cfg, batch, "pallas", *found)',
            ),
            (
                'ours = kernel_launches(decode_program(cfg, batch, "pallas", *found)',
                "ours = kernel_launches(decode_program(cfg, batch, None, *found)",
            ),
        ),
        (f"{KERNEL_CHECK}::test_the_launches_line_counts_ours_and_xla_s_compiled_for_the_chip",),
    ),
    Mutant(
        "kernel-paths-dotted",
        "the kernels' files named by their dotted module names, paths that do not exist",
        "sessions/inference/kernel_check.py",
        (('module.__name__.replace(".", "/") + ".py"', 'module.__name__ + ".py"'),),
        (ONCE_TEST,),
    ),
    Mutant(
        "refusal-said-compiled",
        "a kernel this JAX cannot build reported as compiled by kernels_across_jax.py",
        "sessions/plan/kernels_on_target.py",
        (
            (
                'results.append(Attempt(name, what, "refused", refusal(e), None))',
                'results.append(Attempt(name, what, "compiled", refusal(e), None))',
            ),
        ),
        (f"{KERNEL_CHECK}::test_the_script_compiles_each_kernel_or_says_what_it_lacks",),
    ),
    Mutant(
        "no-time-limit",
        "our kernels' compile for the launches line waits however long Mosaic GPU searches",
        "sessions/plan/kernels_on_target.py",
        (
            (
                "        with time_limit(seconds):\n            ours = kernel_launches",
                "        with contextlib.nullcontext():\n            ours = kernel_launches",
            ),
        ),
        (f"{KERNEL_CHECK}::test_a_compile_that_does_not_answer_is_given_up_and_said_so",),
    ),
    # The decode kernels. The interpreted tests run on JAX 0.12 (python 3.13: run these
    # mutants with that interpreter); the grid's on either.
    Mutant(
        "merge-unweighted",
        "the MLP kernel adds the attention's slice partials unweighted, not log-sum-exp merged",
        RESIDUAL,
        (
            (
                "part = across(load_t(stats_s.at[p, 0], WT.reduce(0)), 1) * part",
                "part = part + 0 * across(load_t(stats_s.at[p, 0], WT.reduce(0)), 1)",
            ),
        ),
        (f"{DECODE_KERNELS}::test_the_kernel_step_equals_xla_s",),
    ),
    Mutant(
        "every-slice-has-the-new-token",
        "each slice of the cache starts its softmax from the new token, counting it S times",
        ATTENTION,
        (("on.iota(1), s == 0\n", "on.iota(1), s >= 0\n"),),
        (f"{ATTENTION_TEST}::test_the_kernel_equals_xla_in_the_interpreter[mha-pos70-2-slices]",),
    ),
    Mutant(
        "slice-drops-its-last-tile",
        "a slice reads only its whole tiles below pos: the partly filled one is left out",
        ATTENTION,
        (("jnp.clip((pos + TILE - 1) // TILE - first_tile", "jnp.clip(pos // TILE - first_tile"),),
        (f"{ATTENTION_TEST}::test_the_kernel_equals_xla_in_the_interpreter[mha-pos70-2-slices]",),
    ),
    Mutant(
        "stats-sum-is-the-max",
        "the running max is written where the slice's sum belongs",
        ATTENTION,
        (("stats_out[p_out, 1, b] = fstage[b, 1]", "stats_out[p_out, 1, b] = fstage[b, 0]"),),
        (f"{ATTENTION_TEST}::test_the_kernel_equals_xla_in_the_interpreter[e2048-d128]",),
    ),
    Mutant(
        "out-stage-reused-unwaited",
        "a stage of the output projection is rewritten before its copy out has read it",
        ATTENTION,
        (
            (
                "                plgpu.wait_smem_to_gmem(1)  # the copy out",
                "                # the copy out",
            ),
        ),
        (f"{ATTENTION_TEST}::test_the_kernel_equals_xla_in_the_interpreter[e2048-d128]",),
    ),
    Mutant(
        "cache-slot-refilled-too-soon",
        "a cache ring's slot is refilled before the tile in it has been multiplied",
        ATTENTION,
        (
            (
                "                    sc = mma(q, kslots.at[slot]) * scale\n",
                "                    pl.when(j + Sc < filled)(lambda: cache_fetch(b, j + Sc))\n"
                "                    sc = mma(q, kslots.at[slot]) * scale\n",
            ),
        ),
        (
            f"{ATTENTION_TEST}::test_the_kernel_equals_xla_in_the_interpreter"
            "[8-slices-cache-ring-refilled]",
        ),
    ),
    Mutant(
        "one-slice",
        "the cache is not split: one CTA a KV head, far under Little's law's bytes in flight",
        GRID,
        (("    return (enough or fits or [1])[0 if enough else -1]", "    return 1"),),
        (f"{GRID_TEST}::test_the_attention_kernel_s_bytes_in_flight_are_its_grid_times_its_rings",),
    ),
    Mutant(
        "in-flight-forgets-v",
        "the cache's bytes in flight count k's tile and not v's",
        GRID,
        (("c * 2 * TILE * cfg.head_dim * 2)", "c * TILE * cfg.head_dim * 2)"),),
        (f"{GRID_TEST}::test_the_attention_kernel_s_bytes_in_flight_are_its_grid_times_its_rings",),
    ),
    Mutant(
        "mlp-in-flight-assumes-every-slot",
        "the MLP's bytes in flight take SLOTS, not the slots that fit its SMEM",
        "sessions/kernels/decode_mlp.py",
        (("* mlp_rings(cfg, P, cfg.attention)[1] *", "* SLOTS *"),),
        (f"{GRID_TEST}::test_the_mlp_kernel_s_bytes_in_flight_are_its_grid_times_its_ring",),
    ),
    Mutant(
        "streams-forget-the-cache",
        "our kernels' estimate streams the caches at XLA's fitted rate, not the attention's",
        "sessions/inference/kernel_step.py",
        (("* value + cache\n", "* value\n"),),
        (f"{ESTIMATE_TEST}::test_our_kernels_bytes_stream_at_what_their_grids_keep_in_flight",),
    ),
    Mutant(
        "target-estimates-ours-as-xla",
        "s3 --target --decode-impl pallas estimates our kernels' bytes at XLA's fitted rate",
        "sessions/plan/infer_on_target.py",
        (("streams = kernel_step.byte_streams(cfg, batch) if impl else None", "streams = None"),),
        ("tests/test_decode_kernels.py::test_target_compiles_the_kernels_for_the_chip",),
    ),
    Mutant(
        "timed-step-never-estimated",
        "a decode step timed on a GPU gets no floor or estimate beside it",
        "sessions/inference/step_times.py",
        (('if device.platform == "gpu" else None', 'if device.platform == "tpu" else None'),),
        (f"{ESTIMATE_TEST}::test_a_timed_step_on_an_h100_gets_its_floor_and_estimate",),
    ),
    Mutant(
        "head-writes-where-not-live",
        "the head kernel writes its logits over the last ones where the step is not live",
        "sessions/kernels/decode_head.py",
        (("@pl.when(residual.pos_and_live(step, run)[1])", "@pl.when(step[0] == step[0])"),),
        (
            "tests/test_decode_head.py::test_the_head_equals_xla_s_and_keeps_the_logits_where_not_live",
            "tests/test_decode_kernels.py::test_a_step_that_is_not_live_writes_nothing",
        ),
    ),
    Mutant(
        "head-drops-the-last-partials",
        "the head kernel adds the last MLP kernel's first partial only, not all of them",
        "sessions/kernels/decode_head.py",
        (("    call(x, pending, w[", "    call(x, pending[:1], w["),),
        (
            "tests/test_decode_head.py::test_the_head_equals_xla_s_and_keeps_the_logits_where_not_live",
        ),
    ),
    Mutant(
        "xla-step-forgets-the-held-logits",
        "XLA's step, where not live, returns its new logits, not the ones it was given",
        "sessions/inference/kernel_step.py",
        (
            (
                "            return jnp.where(live, logits, held), cache",
                "            return logits, cache",
            ),
        ),
        ("tests/test_decode_kernels.py::test_the_flag_picks_the_step_by_platform",),
    ),
    Mutant(
        "clock-live-a-step-late",
        "the kernels read step i as live while i <= n, one step past the call's last",
        "sessions/kernels/decode_residual.py",
        (("    return run[0] + i, i < run[1]", "    return run[0] + i, i <= run[1]"),),
        (
            "tests/test_decode_head.py::test_the_head_equals_xla_s_and_keeps_the_logits_where_not_live",
            "tests/test_decode_kernels.py::test_a_step_that_is_not_live_writes_nothing",
        ),
    ),
    Mutant(
        "clock-made-every-token",
        "(start, n) put together inside the decode loop: a kernel a token",
        "sessions/inference/kv_cache.py",
        (("live, logits, (i, run))", "live, logits, (i, jnp.stack([start, n])))"),),
        (
            "tests/test_decode_kernels.py::"
            "test_the_whole_decode_compiled_for_the_chip_launches_two_kernels_a_layer",
        ),
    ),
    Mutant(
        "head-streams-at-the-roof",
        "the head kernel's table estimated at the roof, not at what its 4 CTAs keep in flight",
        "sessions/inference/kernel_step.py",
        (("[(head, head_bytes_in_flight(cfg))]", "[(head, 10**9)]"),),
        (f"{ESTIMATE_TEST}::test_our_kernels_bytes_stream_at_what_their_grids_keep_in_flight",),
    ),
    Mutant(
        "expected-max-off-by-one",
        "uniform E[max]'s CDF one value behind: F(k) = (k - low)/n",
        BATCHING,
        (("1 - ((k - low + 1) / n) ** batch", "1 - ((k - low) / n) ** batch"),),
        (f"{NAPKIN}::test_expected_max_of_uniform_on_one_to_three_at_batch_two_by_enumeration",),
    ),
    Mutant(
        "expected-max-pmf-cdf-stale",
        "a pmf's E[max] weighting each value by F(v)^B alone, not F(v)^B - F(v-)^B",
        BATCHING,
        (("total += v * (at_most - below)", "total += v * at_most"),),
        (f"{NAPKIN}::test_expected_max_of_a_weighted_pmf_by_enumeration",),
    ),
    Mutant(
        "exponential-ratio-h-b-minus-1",
        "exponential lengths' continuous/static ratio as H_(B-1), not H_B",
        BATCHING,
        (("    return harmonic(batch)", "    return harmonic(batch - 1)"),),
        (
            f"{NAPKIN}::test_continuous_over_static_at_eight_slots_matches_the_issue_s_figures",
            f"{NAPKIN}::test_exponential_ratio_is_the_mean_of_the_max_of_draws",
        ),
    ),
    Mutant(
        "static-prefill-counted-once",
        "the ratio with prefill: a static batch charged one prefill, not B",
        BATCHING,
        (("return (batch * prefill_s + most * step_s)", "return (prefill_s + most * step_s)"),),
        (f"{NAPKIN}::test_prefill_that_is_not_free_shrinks_the_ratio",),
    ),
    Mutant(
        "kv-freed-without-the-prompt",
        "KV tokens freed a step as B·P/G, not B·(P + G)/G",
        BATCHING,
        (("batch * (prompt + output) / output", "batch * prompt / output"),),
        (
            f"{NAPKIN}::test_the_book_s_kv_tokens_freed_and_prefill_to_generate",
            f"{NAPKIN}::test_the_book_s_llama3_70b_on_v5e_as_a_subprocess",
        ),
    ),
    Mutant(
        "knee-prefill-stalls-one-slot",
        "the knee with prefill stalling only its own slot: B / (G·step + prefill)",
        BATCHING,
        (
            (
                "slots / (mean_output * step_s + slots * prefill_s)",
                "slots / (mean_output * step_s + prefill_s)",
            ),
        ),
        (f"{NAPKIN}::test_little_s_law_and_the_knee", f"{NAPKIN}::test_fewest_chips_for_a_rate"),
    ),
    Mutant(
        "paged-gather-read-once",
        "the paged step's gather counted as free: W + B·C, as contiguous",
        BATCHING,
        (("paged = step.weight_bytes + 3 * step.cache_bytes", "paged = step.bytes"),),
        (f"{NAPKIN}::test_the_paged_step_reads_the_cache_three_times",),
    ),
    Mutant(
        "pages-rounded-down",
        "a sequence's pages as tokens // N: its last, partial page not counted",
        BATCHING,
        (("return -(-tokens // page_size)", "return tokens // page_size"),),
        (f"{NAPKIN}::test_pages_paged_against_reserved",),
    ),
    Mutant(
        "int8-kv-scales-forgotten",
        "the int8 cache's bytes a token without its float32 scales: 163,840, not 168,960",
        SERVE_PLAN,
        (
            (
                "per_token = decode_cost.kv_cache_bytes(one_token, 1, cache=cache)",
                "per_token = decode_cost.kv_cache_bytes(one_token, 1, cache=None)"
                " // (2 if cache else 1)",
            ),
        ),
        (f"{NAPKIN}::test_the_book_s_llama3_70b_on_v5e_as_a_subprocess",),
    ),
    Mutant(
        "int8-kv-values-with-scales",
        "the cache's values a token counted with the scales added: 168,960, not 163,840",
        SERVE_PLAN,
        (
            (
                "values = 2 * cfg.layers * cfg.n_kv_heads * cfg.head_dim\n",
                "values = 2 * cfg.layers * cfg.n_kv_heads * (cfg.head_dim + 4)\n",
            ),
        ),
        (f"{NAPKIN}::test_the_book_s_llama3_70b_on_v5e_as_a_subprocess",),
    ),
    Mutant(
        "prefill-mfu-ignored",
        "prefill at the chips' whole peak, --prefill-mfu ignored",
        SERVE_PLAN,
        (("flops / (chips * peak * prefill_mfu)", "flops / (chips * peak)"),),
        (f"{NAPKIN}::test_the_book_s_prefill_on_sixteen_chips_at_forty_percent",),
    ),
    Mutant(
        "serve-batch-past-the-tpot",
        "without --batch, the largest that fits whatever the TPOT target",
        SERVE_PLAN,
        (("tpot is None or step <= tpot", "True"),),
        (f"{NAPKIN}::test_mlperf_slos_pick_the_largest_batch_that_meets_them",),
    ),
    Mutant(
        "serve-past-the-context",
        "a prompt and output past the context planned, exit 0",
        SERVE_PLAN,
        (("if prompt + output > cfg.seq:", "if False:"),),
        (f"{NAPKIN}::test_bad_input_is_one_line_and_exit_2",),
    ),
    Mutant(
        "serve-slo-presets-swapped",
        "MLPerf's llama3.1-8b TPOT given as llama2-70b's 200 ms",
        SERVE_PLAN,
        (('"mlperf-llama3.1-8b": (2.0, 0.100)', '"mlperf-llama3.1-8b": (2.0, 0.200)'),),
        (f"{NAPKIN}::test_mlperf_slos_pick_the_largest_batch_that_meets_them",),
    ),
    Mutant(
        "serve-ttft-from-admission",
        "TTFT from when the engine was handed the request, not from its arrival: no queueing",
        LATENCY,
        (
            (
                '[0] - r["arrival_s"] for r in done])',
                '[0] - r.get("added_s", r["arrival_s"]) for r in done])',
            ),
        ),
        (LOAD_HAND,),
    ),
    Mutant(
        "serve-tpot-over-output",
        "TPOT divides the time after the first token by the output, not output - 1",
        LATENCY,
        (("(e2e - ttft) / np.maximum(outputs - 1, 1)", "(e2e - ttft) / outputs"),),
        (LOAD_HAND,),
    ),
    Mutant(
        "serve-p99-is-max",
        "p99 taken as the largest sample, not numpy's linear percentile",
        LATENCY,
        (
            (
                "float(np.percentile(values, q))",
                "float(values.max() if q == 99 else np.percentile(values, q))",
            ),
        ),
        (f"{LOAD}::test_percentiles_are_numpy_s_linear_by_hand", LOAD_HAND),
    ),
    Mutant(
        "serve-rate-as-interval",
        "the rate used as the mean gap between arrivals",
        WORKLOAD,
        (("scale=1.0 / (rate * burstiness)", "scale=rate / burstiness"),),
        (f"{LOAD}::test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_root_burstiness",),
    ),
    Mutant(
        "serve-gamma-swapped",
        "the gamma's shape and scale swapped: the same mean gap, the wrong burstiness",
        WORKLOAD,
        (
            (
                "shape=burstiness, scale=1.0 / (rate * burstiness)",
                "shape=1.0 / (rate * burstiness), scale=burstiness",
            ),
        ),
        (f"{LOAD}::test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_root_burstiness",),
    ),
    Mutant(
        "serve-fit-off-by-one",
        "a stream whose longest request is a token past the context let through",
        WORKLOAD,
        (
            (
                "if prompt_most + output_room > context or",
                "if prompt_most + output_room > context + 1 or",
            ),
        ),
        (f"{LOAD}::test_lengths_must_fit_the_context_exactly",),
    ),
    Mutant(
        "serve-exponential-unclipped",
        "exponential lengths not clipped to what the context leaves",
        WORKLOAD,
        (("return np.clip(drawn, 1, cap)", "return np.maximum(drawn, 1)"),),
        (f"{LOAD}::test_each_dist_samples_within_its_range",),
    ),
    Mutant(
        "serve-added-early",
        "every request handed to the engine at once, before its arrival",
        REPLAY,
        (
            (
                "while nxt < len(pending) and pending[nxt].arrival_s <= now:",
                "while nxt < len(pending):",
            ),
        ),
        (f"{LOAD}::test_a_request_is_added_at_its_arrival_never_before",),
    ),
    Mutant(
        "serve-in-flight-running-only",
        "requests in flight counted as the running ones only, the queued left out",
        REPLAY,
        (('"in_flight": in_flight,', '"in_flight": stats["running"],'),),
        (
            f"{LOAD}::test_queued_requests_count_in_flight_ttft_and_little_s_law_by_hand",
            f"{LOAD}::test_little_s_law_holds_exactly_on_a_deterministic_fake",
        ),
    ),
    Mutant(
        "serve-host-gap-dropped",
        "the host's gap between steps left out of host_s: only the engine's own counted",
        REPLAY,
        (
            (
                '"host_s": host_gap + stats.get("host_s", 0.0),',
                '"host_s": stats.get("host_s", 0.0),',
            ),
        ),
        (
            f"{LOAD}::test_host_time_between_steps_is_measured_and_preemptions_counted_from_the_start",
        ),
    ),
    Mutant(
        "serve-preemptions-cumulative",
        "the engine's preemptions since it was built reported as this run's",
        REPLAY,
        (
            (
                'preemptions = engine.stats()["preemptions"] - preemptions_before',
                'preemptions = engine.stats()["preemptions"]',
            ),
        ),
        (
            f"{LOAD}::test_host_time_between_steps_is_measured_and_preemptions_counted_from_the_start",
        ),
    ),
    Mutant(
        "serve-kv-over-pool",
        "KV utilisation over the whole pool, not the pages in use",
        REPLAY,
        (("held / (used * page_size)", 'held / (stats["pages_total"] * page_size)'),),
        (f"{LOAD}::test_kv_utilisation_paged_and_reserved_by_hand",),
    ),
    Mutant(
        "serve-tokens-returned",
        "tokens a step counted as the tokens it returned: prefill's work left out",
        REPLAY,
        (('"tokens": stats.get("tokens_this_step", tokens_out),', '"tokens": tokens_out,'),),
        (f"{LOAD}::test_tokens_a_step_come_from_the_engine_continuous_against_static",),
    ),
    Mutant(
        "serve-duration-from-first-token",
        "the run's duration from the first token, not the first arrival: throughput inflated",
        LATENCY,
        (('min(r["arrival_s"] for r in records)', 'min(r["token_times_s"][0] for r in served)'),),
        (LOAD_HAND,),
    ),
    Mutant(
        "serve-goodput-ttft-only",
        "goodput that checks the TTFT SLO and forgets the TPOT one",
        LATENCY,
        (('ok &= latencies["tpot"] <= slo_tpot', "pass"),),
        (LOAD_HAND,),
    ),
    Mutant(
        "emax-off-by-one",
        "E[max] summed over P(max > k), not P(max >= k): one step short",
        "solutions/serving_napkin.py",
        (
            (
                "        expected_max += 1 - below**slots\n        below += pmf.get(k, 0.0)\n",
                "        below += pmf.get(k, 0.0)\n        expected_max += 1 - below**slots\n",
            ),
        ),
        (
            f"{SESSION_7}::test_continuous_over_static_by_enumeration",
            f"{SESSION_7}::test_uniform_lengths_at_eight_slots",
        ),
    ),
    Mutant(
        "harmonic-short",
        "exponential lengths' ratio as H_(B-1): the last request to end left out",
        "solutions/serving_napkin.py",
        (
            (
                "return sum(1 / k for k in range(1, slots + 1))",
                "return sum(1 / k for k in range(1, slots))",
            ),
        ),
        (f"{SESSION_7}::test_exponential_lengths_by_hand",),
    ),
    Mutant(
        "pages-floor",
        "a sequence's pages rounded down: its last, partly full page not counted",
        "solutions/serving_napkin.py",
        (
            (
                "return sum(math.ceil(length / page_size) for length in lengths)",
                "return sum(math.floor(length / page_size) for length in lengths)",
            ),
        ),
        (
            f"{SESSION_7}::test_pages_for_a_mix_by_hand",
            f"{SESSION_7}::test_kv_utilisation_paged_and_reserved_by_hand",
        ),
    ),
    Mutant(
        "fit-skips-the-queue",
        "a sequence that does not fit is skipped and a later, shorter one admitted",
        "solutions/serving_napkin.py",
        (
            (
                "        if used > pages:\n            break\n",
                "        if used > pages:\n            used -= math.ceil(length / page_size)\n"
                "            continue\n",
            ),
        ),
        (f"{SESSION_7}::test_sequences_that_fit_paged_and_reserved_by_hand",),
    ),
    Mutant(
        "reserved-uncapped",
        "reserved sequences counted by the pool alone, more than there are",
        "solutions/serving_napkin.py",
        (
            (
                "reserved = min(len(lengths), pages // math.ceil(context / page_size))",
                "reserved = pages // math.ceil(context / page_size)",
            ),
        ),
        (f"{SESSION_7}::test_sequences_that_fit_paged_and_reserved_by_hand",),
    ),
    Mutant(
        "littles-law-divides",
        "Little's law as rate / latency",
        "solutions/serving_napkin.py",
        (("    return rate * mean_latency_s\n", "    return rate / mean_latency_s\n"),),
        (
            f"{SESSION_7}::test_littles_law_by_hand",
            f"{SESSION_7}::test_littles_law_holds_on_a_trace_counted_step_by_step",
        ),
    ),
    Mutant(
        "knee-per-step",
        "the knee as a request a slot a step: a request's G steps forgotten",
        "solutions/serving_napkin.py",
        (("return slots / (step_s * mean_output_tokens)", "return slots / step_s"),),
        (f"{SESSION_7}::test_the_knee_by_hand",),
    ),
    Mutant(
        "freed-prompt-only",
        "the tokens freed a step as B·P/G: the generated tokens' cache not counted",
        "solutions/serving_napkin.py",
        (
            (
                "return batch * (prompt + generate) / generate",
                "return batch * prompt / generate",
            ),
        ),
        (f"{SESSION_7}::test_the_books_96_tokens_freed_a_step",),
    ),
    Mutant(
        "page-leak-back",
        "the drill's bug back in its solution: a finished request returns tokens // N pages",
        "solutions/bug_page_leak.py",
        (
            (
                "            held.pop(request)\n            free.extend(tables.pop(request))",
                "            pages_used = held.pop(request) // page_size\n"
                "            free.extend(tables.pop(request)[:pages_used])",
            ),
        ),
        (
            f"{SESSION_7}::test_a_pool_for_one_request_serves_three_in_turn",
            f"{SESSION_7}::test_two_rows_serve_a_mix_by_hand",
            f"{SESSION_7}::test_a_long_stream_drains_with_every_page_free",
        ),
    ),
    Mutant(
        "pages-never-returned",
        "a finished request's page table dropped, none of its pages returned",
        "solutions/bug_page_leak.py",
        (("            free.extend(tables.pop(request))", "            tables.pop(request)"),),
        (
            f"{SESSION_7}::test_a_pool_for_one_request_serves_three_in_turn",
            f"{SESSION_7}::test_two_rows_serve_a_mix_by_hand",
            f"{SESSION_7}::test_a_long_stream_drains_with_every_page_free",
        ),
    ),
    Mutant(
        "serve-static",
        "the fixed loop admits only when no row has started: static batching",
        "solutions/bug_page_leak.py",
        (
            (
                "        while waiting and len(tables) < slots:\n",
                "        while waiting and len(tables) < slots and not any(held.values()):\n",
            ),
        ),
        (
            f"{SESSION_7}::test_two_rows_serve_a_mix_by_hand",
            f"{SESSION_7}::test_a_long_stream_drains_with_every_page_free",
        ),
    ),
    Mutant(
        "position-shared-back",
        "the drill's bug back in its solution: every row's key and value written at row 0's position",
        "solutions/bug_shared_position.py",
        (
            (
                "cache_k = cache_k.at[rows, positions].set(k)",
                "cache_k = cache_k.at[rows, positions[0]].set(k)",
            ),
            (
                "cache_v = cache_v.at[rows, positions].set(v)",
                "cache_v = cache_v.at[rows, positions[0]].set(v)",
            ),
        ),
        (
            f"{SESSION_7}::test_each_row_writes_and_attends_at_its_own_position[staggered]",
            f"{SESSION_7}::test_rows_admitted_at_different_times_decode_their_own_sequences",
        ),
    ),
    Mutant(
        "mask-shared",
        "each row writes at its own position but attends up to row 0's",
        "solutions/bug_shared_position.py",
        (("<= positions[:, None]  # [B, T]", "<= positions[0]  # [B, T]"),),
        (
            f"{SESSION_7}::test_each_row_writes_and_attends_at_its_own_position[staggered]",
            f"{SESSION_7}::test_rows_admitted_at_different_times_decode_their_own_sequences",
        ),
    ),
    Mutant(
        "differ-against-itself",
        "each row compared with the batch's own output, never run alone",
        "solutions/bug_shared_position.py",
        (
            (
                "alone = step(cache_k[one], cache_v[one], q[one], k[one], v[one], positions[one])[0]",
                "alone = together[one]",
            ),
        ),
        (f"{SESSION_7}::test_rows_that_differ_finds_the_rows_away_from_row_0",),
    ),
    Mutant(
        "leak-check-counts-held",
        "the invariant check reports held pages as leaked",
        "solutions/bug_page_leak.py",
        (
            (
                "return sorted(set(range(pages)) - set(free) - held)",
                "return sorted(set(range(pages)) - set(free))",
            ),
        ),
        (
            f"{SESSION_7}::test_leaked_pages_by_hand",
            f"{SESSION_7}::test_leaked_pages_finds_what_the_broken_serve_lost",
        ),
    ),
    Mutant(
        "http-non-json-crashes",
        "the server parses a body that is not JSON without catching the error: a 500, not a 400",
        "sessions/serve/completion_request.py",
        (
            (
                "    try:\n        request = json.loads(body)\n    except ValueError:",
                "    request = json.loads(body)\n    if False:",
            ),
        ),
        (f"{HTTP_TEST}::{BAD_REQUEST}[not JSON]", f"{HTTP_TEST}::{BAD_REQUEST}[not UTF-8]"),
    ),
    Mutant(
        "http-negative-temperature",
        "a negative temperature passes the server's check and reaches the engine",
        "sessions/serve/completion_request.py",
        (("math.isfinite(temperature) and temperature >= 0", "math.isfinite(temperature)"),),
        (f"{HTTP_TEST}::{BAD_REQUEST}[a negative temperature]",),
    ),
    Mutant(
        "http-prompt-past-context",
        "the server lets a prompt and max_tokens past the context through to the engine",
        "sessions/serve/completion_request.py",
        (("len(prompt_token_ids) + max_tokens > context", "len(prompt_token_ids) > context"),),
        (f"{HTTP_TEST}::{BAD_REQUEST}[prompt + max_tokens past the context]",),
    ),
    Mutant(
        "http-no-queue-limit",
        "no backpressure: every request is queued, however many wait",
        "sessions/serve/orchestrator.py",
        (("if self.unfinished - self.running >= self.max_queue:", "if self.max_queue < 0:"),),
        (f"{HTTP_TEST}::test_past_the_queue_limit_a_request_gets_429_at_once",),
    ),
    Mutant(
        "http-no-abort-on-disconnect",
        "a stream whose client left is never aborted: its slot and pages stay held",
        "sessions/serve/server.py",
        (
            (
                "        if not finished:\n            orchestrator.abort(request_id)",
                "        if not finished:\n            pass",
            ),
        ),
        (f"{HTTP_TEST}::test_a_client_that_leaves_mid_stream_frees_its_slot_and_pages",),
    ),
    Mutant(
        "http-whole-disconnect-unseen",
        "an unstreamed completion whose client left runs to its end",
        "sessions/serve/server.py",
        (("if await request.is_disconnected():", "if False:"),),
        (f"{HTTP_TEST}::test_a_client_that_leaves_a_whole_completion_frees_its_slot_and_pages",),
    ),
    Mutant(
        "http-abort-skips-the-engine",
        "the engine thread forgets an aborted request without telling the engine: pages held",
        "sessions/serve/orchestrator.py",
        (("                    self.engine.abort_request(command[1])\n", ""),),
        (f"{HTTP_TEST}::test_a_client_that_leaves_mid_stream_frees_its_slot_and_pages",),
    ),
    Mutant(
        "http-decodes-each-token-alone",
        "each streamed step's bytes decoded alone: a character split across tokens mangled",
        "sessions/serve/server.py",
        (
            (
                "text = decoder.decode(bytes(token_ids), final=finished)",
                'text = bytes(token_ids).decode("utf-8", errors="replace")',
            ),
        ),
        (f"{HTTP_TEST}::test_a_character_split_across_tokens_comes_out_whole",),
    ),
    Mutant(
        "http-stream-without-done",
        "the stream ends without OpenAI's data: [DONE]",
        "sessions/serve/server.py",
        (('        yield "data: [DONE]\\n\\n"\n', ""),),
        (f"{HTTP_TEST}::test_a_character_split_across_tokens_comes_out_whole",),
    ),
    Mutant(
        "http-metric-renamed",
        "generation_tokens_total under another name than vLLM's",
        "sessions/serve/metrics.py",
        (('"generation_tokens", "tokens generated"', '"output_tokens", "tokens generated"'),),
        (f"{HTTP_TEST}::test_metrics_carry_vllm_s_names_and_count_the_tokens",),
    ),
    Mutant(
        "http-no-grace-deadline",
        "on SIGTERM the engine runs its requests to their end: no error, uvicorn cuts them off",
        "sessions/serve/orchestrator.py",
        (("not self.in_flight or time.perf_counter() >= self.deadline_s", "not self.in_flight"),),
        (f"{HTTP_TEST}::test_sigterm_during_a_stream_ends_it_with_an_error_and_exits_cleanly",),
    ),
    Mutant(
        "bench-reads-the-prompt-s-usage",
        "bench_serving.py takes the usage's prompt_tokens for a request's output length",
        "scripts/bench_serving.py",
        (
            (
                'record["output_len"] = chunk["usage"]["completion_tokens"]',
                'record["output_len"] = chunk["usage"]["prompt_tokens"]',
            ),
        ),
        (f"{HTTP_TEST}::test_bench_serving_drives_the_server_and_counts_every_token",),
    ),
    Mutant(
        "http-engine-failure-kills-the-thread",
        "a step that raises stops the engine's thread: the server serves no one after it",
        "sessions/serve/orchestrator.py",
        (
            (
                "except Exception as e:  # an engine bug: fail what it held, serve on",
                "except KeyError as e:  # an engine bug: fail what it held, serve on",
            ),
        ),
        (
            f"{HTTP_TEST}::test_a_step_that_fails_fails_its_request_with_500_and_the_server_serves_on",
        ),
    ),
    Mutant(
        "serve-shared-position",
        "the paged step writes and masks every row at row 0's position",
        "sessions/serve/paged_cache.py",
        (
            (
                "positions = start[:, None] + jnp.arange(C)",
                "positions = jnp.broadcast_to(start[:1, None], start[:, None].shape) + jnp.arange(C)",
            ),
        ),
        (f"{SAME_TOKENS}[course]", f"{PAGED_STEP}[course]"),
    ),
    Mutant(
        "serve-rope-shared-start",
        "rotary positions turn every row by the largest row's start",
        "sessions/model/rotary.py",
        (("(jnp.asarray(start)[..., None]", "(jnp.asarray(start).max()[..., None]"),),
        (f"{SAME_TOKENS}[gqa-rope-gated-untied]",),
    ),
    Mutant(
        "serve-learned-shared-start",
        "learned positions give every row row 0's positions",
        "sessions/model/positions.py",
        (("rows = jnp.asarray(start)[:, None]", "rows = jnp.asarray(start)[:1, None]"),),
        (f"{SAME_TOKENS}[course]",),
    ),
    Mutant(
        "serve-dead-rows-write",
        "rows that are not live (and padded tokens) write the cache",
        "sessions/serve/paged_cache.py",
        (
            (
                "        page = jnp.where(real, page, pages_plus_padding)  # past the pool: dropped\n",
                "",
            ),
        ),
        (f"{PAGED_STEP}[course]", f"{PAGED_STEP}[gqa-rope-gated-untied]"),
    ),
    Mutant(
        "serve-page-leak",
        "a released request keeps one page off the free list",
        "sessions/serve/scheduler.py",
        (("self.pool.release(request.pages)", "self.pool.release(request.pages[1:])"),),
        (f"{SERVE_PAGES}::test_every_page_and_slot_is_free_once_the_queue_drains", SAME_TOKENS),
    ),
    Mutant(
        "serve-preempt-oldest",
        "a dry pool preempts the oldest running request, not the newest",
        "sessions/serve/scheduler.py",
        (("victim = max(self.running.values()", "victim = min(self.running.values()"),),
        (
            f"{SERVE_PAGES}::test_a_dry_pool_preempts_the_newest_running_request_to_the_front_of"
            "_the_queue",
        ),
    ),
    Mutant(
        "serve-budget-ignored",
        "prefill chunks take prefill_chunk tokens whatever the step's token budget left",
        "sessions/serve/scheduler.py",
        (
            (
                "count = min(self.prefill_chunk, budget, request.prefill_to - request.cached)",
                "count = min(self.prefill_chunk, request.prefill_to - request.cached)",
            ),
        ),
        (f"{SERVE_PAGES}::test_decodes_go_first_and_prefill_chunks_fill_the_rest_of_the_budget",),
    ),
    Mutant(
        "serve-static-mid-batch",
        "static batching admits into a free slot before its whole batch has finished",
        "sessions/serve/scheduler.py",
        (("self.batch_open = False", "self.batch_open = True"),),
        (f"{SERVE_PAGES}::test_static_admits_nothing_until_its_whole_batch_has_finished",),
    ),
    Mutant(
        "s7-pool-check-skipped",
        "s7 sends a stream whose longest request the pool can never hold: no one-line refusal naming --pages",
        "sessions/s7_engine.py",
        (
            (
                "    if need > pages:  # it would wait forever",
                "    if False:  # it would wait forever",
            ),
        ),
        (f"{S7_BAD}[argv8---pages 2]",),
    ),
    Mutant(
        "s7-pool-half",
        "the default pool is half of what reserving whole contexts takes, not three quarters",
        "sessions/run/engine_flags.py",
        (("max(slots * whole * 3 // 4, whole)", "max(slots * whole // 2, whole)"),),
        (f"{S7}::test_the_story_runs_every_request_of_both_policies_at_each_rate",),
    ),
    Mutant(
        "s7-rate-and-rates",
        "--rate and --rates both given: one is silently dropped",
        "sessions/run/engine_flags.py",
        (("if args.rate is not None and args.rates is not None:", "if False:"),),
        (f"{S7_BAD}[argv4---rate and --rates]",),
    ),
    Mutant(
        "hw6-sp-outside-kept",
        "sequence parallelism leaves the 10 bytes outside attention and the MLP whole on each chip",
        "solutions/training_memory.py",
        (("outside = 10 / t if sequence_parallel else 10", "outside = 10"),),
        (
            "tests/test_exercises/test_session_6.py::"
            "test_a_layer_s_activations_by_korthikanti_s_table[8-True-none-358612992]",
        ),
    ),
    Mutant(
        "hw6-chunk-not-rebuilt",
        "the chunked loss without jax.checkpoint: the backward keeps every chunk's logits",
        "solutions/training_memory.py",
        (("    @jax.checkpoint\n    def chunk_loss", "    def chunk_loss"),),
        (
            "tests/test_exercises/test_session_6.py::test_the_chunked_loss_never_holds_the_whole_logits",
        ),
    ),
    # Issue 58, the planner (H1): answers the planner accepts, and the levers' napkin.
    Mutant(
        "fsdp-gathers-no-gradient",
        "under --shard params the gathered layer counted without its gradient",
        MEMORY_PLAN,
        (
            (
                'per_chip["gathered"] = 2 * layer * act_bytes',
                'per_chip["gathered"] = layer * act_bytes',
            ),
        ),
        (
            f"{PLAN_LEVERS_TEST}::test_fsdp_counts_one_layer_gathered_and_its_gradient",
            f"{PLAN_LEVERS_TEST}::test_llama3_70b_on_256_v5p_no_longer_fits_with_its_gathered_layer",
        ),
    ),
    Mutant(
        "sp-divides-only-the-split",
        "--sequence-parallel leaves the norms, the input and the stream whole on each tp chip",
        MEMORY_PLAN,
        (
            (
                "return saved_bytes(saved, act_bytes) / tp",
                "return saved_bytes(saved, act_bytes, tp)",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_sequence_parallel_divides_what_tp_copies",),
    ),
    Mutant(
        "loss-chunks-hold-all-logits",
        "--loss-chunks N still holds the whole [tokens, V] logits and their gradient",
        MEMORY_PLAN,
        (
            (
                "logits = 2 * cfg.vocab * act_bytes / lv.loss_chunks",
                "logits = 2 * cfg.vocab * act_bytes",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_loss_chunks_divide_the_logits_transient",),
    ),
    Mutant(
        "offload-one-way",
        "the offloaded optimizer crosses the host link once a step, not there and back",
        MEMORY_PLAN,
        (('over_link = 2 * host["optimizer"]', 'over_link = host["optimizer"]'),),
        (f"{PLAN_LEVERS_TEST}::test_offload_moves_bytes_to_the_host_and_prices_the_link",),
    ),
    Mutant(
        "pipeline-holds-every-microbatch",
        "1F1B's stage 0 counted as holding all M microbatches' activations, not P",
        MEMORY_PLAN,
        (
            (
                "in_flight = min(stages, m) if stages > 1 else 1",
                "in_flight = m if stages > 1 else 1",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_a_pipeline_s_stage_0_holds_p_microbatches_under_1f1b",),
    ),
    Mutant(
        "fits-against-the-whole-hbm",
        "fits and the largest batch judged against a GPU's whole HBM, not the 75% JAX takes",
        "roofline/memory.py",
        (('return float(os.environ.get(MEM_FRACTION, "0.75"))', "return 1.0"),),
        (f"{PLAN_LEVERS_TEST}::test_gpt2_s_example_is_judged_against_what_jax_may_use",),
    ),
    Mutant(
        "fewest-chips-unaccepted",
        "the fewest chips taken from the bytes alone: a count over which the batch does not divide",
        MEMORY_PLAN,
        (
            (
                "min_chips = fewest_accepted(\n            cfg, batch_tokens, least, lv.seq_shards, "
                "fixed, accepted_and_fits\n        )",
                "min_chips = least",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_the_fewest_chips_is_a_count_the_command_accepts",),
    ),
    Mutant(
        "seq-shards-ignored",
        "the replicas counted as if each held whole sequences: the book's layout is refused",
        "roofline/plan/memory_layout.py",
        (
            (
                "return self.chips // (self.tp * self.seq_shards * self.stages)",
                "return self.chips // (self.tp * self.stages)",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_the_scaling_book_s_layout_plans",),
    ),
    Mutant(
        "tp-over-kv-heads-planned",
        "--tp that splits the KV heads unevenly planned, as the step would refuse",
        "roofline/plan/memory_layout.py",
        (('("kv_heads", cfg.n_kv_heads), ', ""),),
        (f"{PLAN_LEVERS_TEST}::test_bad_levers_are_one_line_and_exit_2",),
    ),
    Mutant(
        "flops-in-gflop",
        "an exa-scale step printed in GFLOP: 2,683,564,835.8 GFLOP",
        "roofline/units.py",
        (
            (
                'for unit, name in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP")):',
                "for unit, name in ():",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_flops_print_in_the_unit_that_fits",),
    ),
    Mutant(
        "advice-canned",
        "a does-not-fit names every lever, not the ones that make it fit when re-planned",
        "roofline/plan/memory_advice.py",
        (
            (
                "return (flag, there) if there and there.fits else None",
                "return (flag, there) if there else None",
            ),
        ),
        (f"{PLAN_LEVERS_TEST}::test_a_step_that_does_not_fit_names_the_levers_that_would",),
    ),
    Mutant(
        "save-qkv-forgets-v",
        "the step's save_qkv_proj saves q and k but not v: one tensor too few",
        "sessions/model/remat.py",
        (('    "save_qkv_proj": QKV,', '    "save_qkv_proj": QKV[:2],'),),
        ("tests/test_remat.py::test_the_layer_names_its_tensors_as_the_napkin_does",),
    ),
    Mutant(
        "napkin-save-qkv-forgets-v",
        "the napkin's save_qkv_proj keeps q and k but not v: what JAX keeps, one tensor short",
        "roofline/plan/saved_activations.py",
        (('    "save_qkv_proj": QKV,', '    "save_qkv_proj": QKV[:2],'),),
        ("tests/test_remat.py::test_the_napkin_keeps_what_jax_saves_under_every_policy",),
    ),
    Mutant(
        "context-misspelled",
        "the heads' output named 'contxt': a policy saving context saves nothing there",
        "sessions/model/transformer.py",
        (
            (
                'out = checkpoint_name(constrain(out, "BSHD"), "context")',
                'out = checkpoint_name(constrain(out, "BSHD"), "contxt")',
            ),
        ),
        (
            "tests/test_remat.py::test_the_layer_names_its_tensors_as_the_napkin_does",
            "tests/test_remat.py::test_the_napkin_keeps_what_jax_saves_under_every_policy",
        ),
    ),
    Mutant(
        "a-name-that-computes",
        "a name that is an optimization barrier too: naming changes the compiled program",
        "sessions/model/transformer.py",
        (
            (
                "from jax.ad_checkpoint import checkpoint_name\n",
                "from jax.ad_checkpoint import checkpoint_name as named\n\n\n"
                "def checkpoint_name(x, name):\n"
                "    return jax.lax.optimization_barrier(named(x, name))\n\n\n",
            ),
        ),
        ("tests/test_remat.py::test_naming_changes_neither_the_program_nor_the_loss",),
    ),
    Mutant(
        "remat-n-is-full",
        "--remat N priced as full recomputation for every N (the issue's slip)",
        "roofline/plan/saved_activations.py",
        (
            (
                "        return book_recompute(cfg, batch, remat)",
                '        return recompute_flops(cfg, batch, "block")',
            ),
        ),
        ("tests/test_remat.py::test_remat_n_recomputes_less_as_it_keeps_more",),
    ),
    Mutant(
        "w-out-rebuilt",
        "the napkin rebuilds w_out's matmul, whose output no backward reads (XLA does not)",
        "roofline/plan/saved_activations.py",
        (
            (
                "    if flash_kernel(cfg) and cfg.attention:\n",
                '    wanted.append("mlpwo")\n    if flash_kernel(cfg) and cfg.attention:\n',
            ),
        ),
        (
            "tests/test_remat.py::test_the_recompute_is_the_matmuls_xla_runs_again",
            "tests/test_remat.py::test_recompute_by_hand",
        ),
    ),
    Mutant(
        "flash-rebuilds-the-scores-alone",
        "a flash kernel under remat counted as rebuilding q·k alone, not its whole forward",
        "roofline/plan/saved_activations.py",
        (
            (
                'ops += [(("context", "log-sum-exp"), QKV, 4 * S',
                'ops += [(("context", "log-sum-exp"), QKV, 2 * S',
            ),
        ),
        ("tests/test_remat.py::test_recompute_by_hand",),
    ),
    Mutant(
        "bf16-norm-input-kept",
        "in bf16 the napkin keeps each norm's input beside its float32 copy: JAX keeps the copy alone",
        "roofline/plan/saved_activations.py",
        (
            (
                '    if cfg.dtype == "float32":\n        norm["input"]',
                '    if True:\n        norm["input"]',
            ),
        ),
        ("tests/test_remat.py::test_the_napkin_keeps_what_jax_saves_under_every_policy",),
    ),
    Mutant(
        "flash-forgets-its-lse",
        "a flash kernel's log-sum-exp left out of what it keeps",
        "roofline/plan/saved_activations.py",
        (
            (
                'saved["the kernel\'s log-sum-exp (float32)"] = (H, True, 4)',
                'saved["the kernel\'s log-sum-exp (float32)"] = (0, True, 4)',
            ),
        ),
        (
            "tests/test_remat.py::test_with_a_flash_kernel_too",
            "tests/test_remat.py::test_korthikanti_s_selective_recompute_keeps_34_sbh",
        ),
    ),
    Mutant(
        "selective-keeps-no-activation",
        "the napkin's selective leaves out the MLP's activation, which Korthikanti et al. keep",
        "roofline/plan/saved_activations.py",
        (
            (
                '    "selective": (*KORTHIKANTI, *MLP_IN, "mlp_activation"),',
                '    "selective": (*KORTHIKANTI, *MLP_IN),',
            ),
        ),
        (
            "tests/test_remat.py::test_korthikanti_s_selective_recompute_keeps_34_sbh",
            "tests/test_remat.py::test_the_layer_names_its_tensors_as_the_napkin_does",
        ),
    ),
    Mutant(
        "unknown-name-accepted",
        "--remat names:a,b takes a name the layer does not give: a policy that saves nothing there",
        "sessions/model/remat.py",
        (("        if not unknown:\n            return None\n", "        return None\n"),),
        ("tests/test_remat.py::test_a_policy_by_name_plans_and_a_bad_name_is_one_line",),
    ),
    Mutant(
        "napkin-unknown-name-accepted",
        "roofline memory --remat names:a,b plans a name no layer gives",
        "roofline/plan/saved_activations.py",
        (("        if not unknown:\n            return None\n", "        return None\n"),),
        ("tests/test_remat.py::test_a_policy_by_name_plans_and_a_bad_name_is_one_line",),
    ),
    Mutant(
        "remat-cuts-the-weights",
        "the rebuilt layer takes its weights through stop_gradient: no gradient reaches them",
        "sessions/model/remat.py",
        (
            (
                "    return jax.checkpoint(layer_fn, policy=REMAT.get(policy) or by_name(*chosen_names(policy)))",
                "    cut = lambda w, x: layer_fn(jax.lax.stop_gradient(w), x)  # noqa: E731\n"
                "    return jax.checkpoint(cut, policy=REMAT.get(policy) or by_name(*chosen_names(policy)))",
            ),
        ),
        ("tests/test_remat.py::test_a_policy_by_name_gives_the_loss_and_gradients_of_none",),
    ),
    Mutant(
        "loss-chunk-dropped",
        "the chunked loss scans all chunks but the last, and still divides by N",
        "sessions/train/chunked_loss.py",
        (("(split(x), split(targets))", "(split(x)[:-1], split(targets)[:-1])"),),
        (
            "tests/test_chunked_loss.py::test_chunks_give_the_loss_and_gradients_of_the_whole_logits",
        ),
    ),
    Mutant(
        "loss-chunk-saved",
        "each chunk's loss without jax.checkpoint: scan saves every chunk's logits for the backward",
        "sessions/train/chunked_loss.py",
        (("    @jax.checkpoint\n    def chunk_loss", "    def chunk_loss"),),
        ("tests/test_chunked_loss.py::test_the_plan_sheds_the_logits_and_their_gradient",),
    ),
    Mutant(
        "loss-chunk-across-rows",
        "chunks are contiguous stretches of the batch's B·S tokens: each lives on a few devices",
        "sessions/train/chunked_loss.py",
        (
            (
                "return jnp.moveaxis(a.reshape(B, S // chunks, chunks, *a.shape[2:]), 2, 0)",
                "return a.reshape(chunks, 1, B * S // chunks, *a.shape[2:])",
            ),
        ),
        ("tests/test_chunked_loss.py::test_a_chunked_step_keeps_each_devices_own_rows",),
    ),
    Mutant(
        "loss-chunks-unchecked",
        "--loss-chunks that does not divide the sequence is not refused: a traceback",
        "sessions/model/config.py",
        (("if self.loss_chunks < 1 or self.seq % self.loss_chunks:", "if self.loss_chunks < 1:"),),
        ("tests/test_chunked_loss.py::test_chunks_that_do_not_divide_the_sequence_are_one_line",),
    ),
    Mutant(
        "offload-on-device",
        "the optimizer's shardings forget memory_kind: the state stays in HBM",
        "sessions/train/offload.py",
        (("sharding = leaf.sharding.with_memory_kind(HOST)", "sharding = leaf.sharding"),),
        ("tests/test_offload.py::test_the_optimizers_bytes_move_from_the_chips_plan_to_the_hosts",),
    ),
    Mutant(
        "offload-not-fetched",
        "the step updates the optimizer's state where it lies, never fetching it (JAX refuses)",
        "sessions/train/step.py",
        (
            (
                'opt = to_device(state["opt"]) if offload == "optimizer" else state["opt"]',
                'opt = state["opt"]',
            ),
        ),
        ("tests/test_offload.py::test_the_h100_plan_falls_by_the_optimizers_bytes",),
    ),
    Mutant(
        "offload-on-cpu",
        "--offload optimizer runs on this CPU, whose memory is the host's: nothing is offloaded",
        "sessions/train/offload.py",
        (('    if platform == "cpu":', "    if False:"),),
        ("tests/test_offload.py::test_offload_on_this_cpu_is_refused_in_one_line_that_says_why",),
    ),
    Mutant(
        "offload-unknown",
        "an --offload the step does not do is taken as none",
        "sessions/model/config.py",
        (("if self.offload not in OFFLOADS:", "if False:"),),
        ("tests/test_offload.py::test_an_offload_the_step_does_not_do_is_one_line",),
    ),
    Mutant(
        "seqpar-dropped",
        "--sequence-parallel leaves the residual stream whole on every tp device",
        "sessions/shard/sharding.py",
        (
            (
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, "tp", None)}',
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, None, None)}',
            ),
        ),
        (
            f"{SEQPAR}::test_on_a_cpu_the_stream_is_gathered_along_s_before_each_matmul",
            f"{SEQPAR}::test_on_a_cpu_the_plan_holds_the_saved_stream_in_slices",
        ),
    ),
    Mutant(
        "seqpar-dropped-h100",
        "--sequence-parallel leaves the stream whole: h100:8 keeps its all-reduces and its plan",
        "sessions/shard/sharding.py",
        (
            (
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, "tp", None)}',
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, None, None)}',
            ),
        ),
        (
            f"{SEQPAR}::test_on_h100_the_all_reduces_become_reduce_scatters_and_all_gathers",
            f"{SEQPAR}::test_on_h100_the_plan_holds_the_saved_stream_in_slices",
        ),
    ),
    Mutant(
        "seqpar-wrong-axis",
        "--sequence-parallel splits the stream along E over tp, not along S",
        "sessions/shard/sharding.py",
        (
            (
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, "tp", None)}',
                'SEQUENCE_PARALLEL_SPECS = {"BSE": P(BATCH, None, "tp")}',
            ),
        ),
        (f"{SEQPAR}::test_on_a_cpu_the_stream_is_gathered_along_s_before_each_matmul",),
    ),
    Mutant(
        "seqpar-flattened",
        "under sequence parallelism the matmuls flatten B and S: h100 all-reduces, then slices",
        "sessions/model/transformer.py",
        (("matmul = dense_apart if cfg.sequence_parallel else dense", "matmul = dense"),),
        (f"{SEQPAR}::test_on_h100_the_all_reduces_become_reduce_scatters_and_all_gathers",),
    ),
    Mutant(
        "seqpar-attention-unpinned",
        "attention's output not pinned by heads: its gradient comes back laid out by S",
        "sessions/model/transformer.py",
        (
            (
                'out = checkpoint_name(constrain(out, "BSHD"), "context")',
                'out = checkpoint_name(out, "context")',
            ),
        ),
        (f"{SEQPAR}::test_on_h100_the_all_reduces_become_reduce_scatters_and_all_gathers",),
    ),
    Mutant(
        "seqpar-bf16-matmuls",
        "sequence parallelism's matmuls round their inputs to bfloat16 in a float32 step",
        "sessions/model/transformer.py",
        (
            (
                "    return jnp.tensordot(x, w, axes=n_in)",
                "    return jnp.tensordot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), axes=n_in).astype(x.dtype)",
            ),
        ),
        (f"{SEQPAR}::test_the_loss_is_the_loss_without_it",),
    ),
    Mutant(
        "seqpar-no-tp",
        "--sequence-parallel without tp trains on, the flag doing nothing",
        "sessions/shard/sharding.py",
        (("if model_cfg.sequence_parallel and tp == 1:", "if False:"),),
        (f"{SEQPAR}::test_a_mesh_it_cannot_split_the_sequence_over_is_refused_in_one_line[no tp]",),
    ),
    Mutant(
        "seqpar-seq-unchecked",
        "a sequence tp does not divide reaches the partitioner",
        "sessions/shard/sharding.py",
        (("if model_cfg.sequence_parallel and model_cfg.seq % tp:", "if False:"),),
        (
            f"{SEQPAR}::test_a_mesh_it_cannot_split_the_sequence_over_is_refused_in_one_line[seq over tp]",
        ),
    ),
    Mutant(
        "seqpar-flag-unread",
        "--sequence-parallel is parsed but never reaches ModelConfig",
        "sessions/model/config.py",
        (
            (
                'LEVERS = ("remat", "scan_layers", "loss_chunks", "sequence_parallel")',
                'LEVERS = ("remat", "scan_layers", "loss_chunks")',
            ),
        ),
        (f"{SEQPAR}::test_the_flag_reaches_the_model",),
    ),
    Mutant(
        "hw6-out-proj-forgotten",
        "save_dot_except_mlp counted as save_qkv_proj: wo's output, which it saves, left out",
        "solutions/training_memory.py",
        (('(E if policy == "save_dot_except_mlp" else 0)', "0"),),
        (
            "tests/test_exercises/test_session_6.py::"
            "test_a_policy_by_name_saves_what_jax_saves[save_dot_except_mlp-gqa]",
        ),
    ),
    Mutant(
        "compile-ratio-inverted",
        "the compile-time ratio said as XLA's decode over ours, not ours over XLA's",
        "sessions/plan/compile_times.py",
        (("ours.seconds / xla.seconds", "xla.seconds / ours.seconds"),),
        (
            f"{KERNEL_CHECK}::test_the_script_says_each_compile_time_and_ours_over_xla_s",
            f"{DECODE_KERNELS}::test_target_says_our_compile_time_beside_xla_s",
            S4_STEP_6,
        ),
    ),
    Mutant(
        "compile-clock-backwards",
        "a compile's seconds taken as the clock before it less the clock after",
        "sessions/plan/kernels_on_target.py",
        (
            (
                "return compiled, time.perf_counter() - start",
                "return compiled, start - time.perf_counter()",
            ),
        ),
        (f"{KERNEL_CHECK}::test_a_compile_is_timed_from_the_clock_around_it",),
    ),
    Mutant(
        "compile-times-unsaid-on-target",
        "s3_infer.py --target --decode-impl pallas no longer says how long ours took to compile",
        "sessions/s3_infer.py",
        (("                print(line)\n", ""),),
        (f"{DECODE_KERNELS}::test_target_says_our_compile_time_beside_xla_s",),
    ),
    Mutant(
        "planner-decode-compiled-again",
        "s3_infer.py --target compiles our whole decode again for its compile time",
        "sessions/plan/compile_times.py",
        (("seconds=seconds, whole=False", "seconds=seconds, whole=True"),),
        (f"{DECODE_KERNELS}::test_target_says_our_compile_time_beside_xla_s",),
    ),
    Mutant(
        "compile-time-per-kernel-unsaid",
        "kernels_across_jax.py says a kernel compiled, not in how long",
        "scripts/kernels_across_jax.py",
        (('took = f" in {r.seconds:.1f} s" if', 'took = " " if'),),
        (f"{KERNEL_CHECK}::test_the_script_says_each_compile_time_and_ours_over_xla_s",),
    ),
    Mutant(
        "step-6-in-float32",
        "s4_kernels.py's step 6 compiles GPT-2's decode in float32, not the bfloat16 it runs in",
        "sessions/s4_kernels.py",
        (('PRESETS["gpt2-bytes"].model, dtype="bfloat16")', 'PRESETS["gpt2-bytes"].model)'),),
        (S4_STEP_6,),
    ),
    Mutant(
        "first-call-ratio-inverted",
        "the first call's table says predicted over measured, not measured over predicted",
        "scripts/first_call_table.py",
        (('f"{measured / predicted:.2f}x"', 'f"{predicted / measured:.2f}x"'),),
        (f"{SCRIPTS}::{FIRST_CALL_TABLE}",),
    ),
    Mutant(
        "first-call-timeout-unsaid",
        "a piece of the first call that ran out of time is no row of its table",
        "scripts/first_call_table.py",
        (("        if status:\n", "        if status is None:\n"),),
        (f"{SCRIPTS}::{FIRST_CALL_TABLE}",),
    ),
    Mutant(
        "bench-summary-bound-is-per-op",
        "bench.py --summary-out writes the per-op prediction as the whole-step bound",
        "scripts/bench.py",
        (('"bound_step_seconds": c.napkin.step_s', '"bound_step_seconds": c.ops.step_s'),),
        (f"{SCRIPTS}::test_bench_times_the_step_of_bf16_weights_with_a_master",),
    ),
    Mutant(
        "bench-decode-shape-unasked",
        "bench_decode.py asks the kernels about --mbu-preset's shape, not the shape flags'",
        "scripts/bench_decode.py",
        (
            (
                "((args.mbu_preset, args.shape), (args.preset, {}))",
                "((args.mbu_preset, {}), (args.preset, {}))",
            ),
        ),
        (f"{DECODE_KERNELS}::test_bench_refuses_on_one_line",),
    ),
    Mutant(
        "ring-unrolled",
        "a ring's product steps its tiles in a Python loop, one copy of the step a tile",
        "sessions/kernels/mosaic.py",
        (
            (
                "pl.loop(0, n)(lambda i: self.step(first + i, acc, b_of(i)))",
                "[self.step(first + i, acc, b_of(i)) for i in range(n)]",
            ),
        ),
        ("tests/test_kernel_sizes.py::test_a_kernel_is_as_large_at_e_2048_as_at_1024",),
    ),
    Mutant(
        "partials-unrolled-by-chunk",
        "the residual sums E's chunks in a Python loop: one copy of the partials' loop a chunk",
        "sessions/kernels/decode_residual.py",
        (
            (
                "ms = jax.lax.fori_loop(0, n_c, sum_chunk, zero) / E",
                "ms = functools.reduce(lambda ms, i: sum_chunk(i, ms), range(n_c), zero) / E",
            ),
        ),
        ("tests/test_kernel_sizes.py::test_a_kernel_is_as_large_at_e_2048_as_at_1024",),
    ),
    Mutant(
        "cache-ring-unrolled",
        "the attention kernel's loop over its slice's cache tiles unrolled, a copy a tile",
        "sessions/kernels/decode_attention.py",
        (
            (
                "o, m, total = lax.fori_loop(0, filled, block, start)",
                "o, m, total = lax.fori_loop(0, per, block, start, unroll=True)",
            ),
        ),
        ("tests/test_kernel_sizes.py::test_the_attention_kernel_is_as_large_at_t_4096_as_at_2048",),
    ),
    Mutant(
        "head-ring-of-one",
        "the head kernel keeps one table tile in flight a CTA, not all SMEM holds",
        "sessions/kernels/decode_head.py",
        (
            (
                "return depth, max(1, min(E // TILE, room // TILE_BYTES))",
                "return depth, max(1, min(1, room // TILE_BYTES))",
            ),
        ),
        (
            "tests/test_decode_grid.py::test_the_head_kernel_s_bytes_in_flight_are_its_grid_times_its_ring",
        ),
    ),
]


def copy_tree(destination):
    """The working tree as git sees it (tracked and untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for path in filter(None, listed):
        source = os.path.join(REPO, path)
        if os.path.isfile(source):  # a tracked file may be deleted in the tree
            os.makedirs(os.path.join(destination, os.path.dirname(path)), exist_ok=True)
            shutil.copy2(source, os.path.join(destination, path))


def plant(root, mutant):
    """Apply the edits in the copy at root; None when done, else why not (the
    mutant is stale)."""
    why = staleness(mutant, root)
    if why:
        return why
    path = os.path.join(root, mutant.path)
    with open(path) as f:
        text = f.read()
    for old, new in mutant.edits:
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return None


def staleness(mutant, root=REPO):
    """Why the mutant no longer fits the tree at root (its text moved, a named
    test is gone), or None; nothing is planted or run."""
    path = os.path.join(root, mutant.path)
    if not os.path.exists(path):
        return f"{mutant.path} is gone"
    with open(path) as f:
        text = f.read()
    for old, _ in mutant.edits:
        if text.count(old) != 1:
            return f"{old.strip()!r} found {text.count(old)} times in {mutant.path}"
    for test in mutant.tests:
        file, _, name = test.partition("::")
        name = name.split("[")[0]
        if not os.path.exists(os.path.join(root, file)):
            return f"{file} is gone"
        with open(os.path.join(root, file)) as f:
            if name and f"def {name}(" not in f.read():
                return f"no test {name} in {file}"
    return None


def run_tests(root, tests, timeout):
    """(pytest's exit status, the failed node ids, the output's tail)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    # -n 0: a mutant's few tests, in one process, start sooner than on two workers.
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-rfE", "-p", "no:cacheprovider"]
    command += tests
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, set(), f"timed out after {timeout} s"
    out = done.stdout + done.stderr
    return done.returncode, failed_tests(out), "\n".join(out.strip().splitlines()[-15:])


def failed_tests(out):
    """The node ids pytest's -rfE summary names as FAILED or ERROR; a parametrization's
    id may hold spaces ('test_x[a b]'), so the brackets are read whole."""
    node = r"\S+?(?:\[[^\]\n]*\])?"
    return set(re.findall(rf"^(?:FAILED|ERROR) ({node})(?: - .*)?$", out, re.MULTILINE))


def missed(tests, failed):
    """The named tests that did not fail (a name covers its parametrizations)."""
    return [t for t in tests if not any(f == t or f.startswith(t + "[") for f in failed)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check that every mutant still fits the tree (seconds), and exit",
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip running the tests on an untouched copy first",
    )
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<22} {m.path:<24} {m.why}")
            for t in m.tests:
                print(f"{'':<22}   must fail: {t}")
        return 0
    if args.check:
        stale = {m.name: staleness(m) for m in MUTANTS}
        for name, why in stale.items():
            if why:
                print(f"stale {name}: {why}")
        print(
            f"{sum(1 for why in stale.values() if not why)} of {len(MUTANTS)} mutants fit the tree"
        )
        return 1 if any(stale.values()) else 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"mutants.py: unknown mutant(s) {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] if args.names else MUTANTS
    # One compile cache for every run (tests/conftest.py): a program no mutant
    # touches compiles once, not once a mutant. Its keys are the programs, so a
    # mutant that changes one compiles it afresh.
    cache = tempfile.TemporaryDirectory(prefix="mutants-jax-cache-")
    os.environ.setdefault("HPLLM_TEST_JAX_CACHE", cache.name)

    if not args.no_baseline:
        tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
        with tempfile.TemporaryDirectory(prefix="mutants-") as root:
            copy_tree(root)
            start = time.perf_counter()
            status, _, tail = run_tests(root, tests, args.timeout)
        if status != 0:
            print(f"baseline: the named tests fail without any mutant:\n{tail}", file=sys.stderr)
            return 1
        print(f"baseline: {len(tests)} tests pass untouched ({time.perf_counter() - start:.0f} s)")

    results = {}
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix="mutants-") as root:
            copy_tree(root)
            stale = plant(root, m)
            start = time.perf_counter()
            if stale:
                verdict, note = "stale", stale
            else:
                status, failed, tail = run_tests(root, m.tests, args.timeout)
                left = missed(m.tests, failed)
                if status is None or status not in (0, 1):
                    verdict, note = "error", tail  # a collection error, a timeout
                elif left:
                    verdict, note = "MISSED", "passed with the bug: " + ", ".join(left)
                else:
                    verdict, note = "caught", f"{len(m.tests)} test(s) failed"
        results[m.name] = verdict
        print(f"{verdict:<7} {m.name:<22} {time.perf_counter() - start:5.0f} s  {m.why}")
        if verdict != "caught":
            print("        " + note.replace("\n", "\n        "))
    caught = sum(v == "caught" for v in results.values())
    print(f"score: {caught} of {len(results)} caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

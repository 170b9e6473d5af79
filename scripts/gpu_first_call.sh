#!/usr/bin/env bash
# The first call on a lent GPU (one H100 or H200, JAX 0.11.2, no network, 10 minutes a
# command): every measurement the course wants from a real chip, each piece under its own
# time limit, then ONE table of measured against predicted (scripts/first_call_table.py).
#
#     bash scripts/gpu_first_call.sh                               # on the GPU machine
#     GPU_FIRST_CALL_REHEARSAL=1 JAX_PLATFORMS=cpu bash scripts/gpu_first_call.sh   # here
#
# The pieces, in order (a piece that fails or runs out of time is reported, and the next runs):
#   decode_*     scripts/bench_decode.py --decode-impl xla,pallas at batches 1 and 8, at
#                GPT-2's shapes and the 1.2B's (E=2048, F=8192, H=16, D=128, 24 layers, T=1024)
#   check        scripts/accelerator_check.py: s2's run, its trace against the roofline, s3,
#                bench_decode
#   bench_*      scripts/bench.py, the course preset and gpt2-bytes, each as it is and with
#                --weights bfloat16 --master (session 6's recipe)
#
# Run from the repo root. Everything goes under $OUT (runs/gpu_first_call where it is unset),
# which brings back at most 8 files: gpu_first_call.log (all that is printed), table.txt,
# figures.json (every piece's JSON, in one), pieces.tar.gz (each piece's log and JSON,
# packed again after every piece, so that a call stopped at its limit still brings them)
# and profile.tar.gz (s2's trace, from the accelerator check).
#
# GPU_FIRST_CALL_REHEARSAL=1 rehearses it on this CPU in minutes: every command as on the GPU,
# with flags appended that shrink it (the last of a flag given twice wins, so the real flags
# are still parsed), accelerator_check.py --cpu, and our kernels in Mosaic GPU's interpreter.
set -u

REHEARSAL=${GPU_FIRST_CALL_REHEARSAL:-0}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/gpu_first_call}
WORK=${GPU_FIRST_CALL_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_first_call.XXXXXX")}
BUDGET=${GPU_FIRST_CALL_BUDGET:-565}  # seconds for every piece: the call's 600, less the table's
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK/check"
exec > >(tee -a "$OUT/gpu_first_call.log") 2>&1
TEE=$!

START=$SECONDS
FAILED=()

pack() {  # each piece's log and JSON, without s2's checkpoint and trace
    tar -czf "$OUT/pieces.tar.gz" -C "$WORK" --exclude=checkpoints --exclude=profile . 2>/dev/null
}

piece() {  # NAME LIMIT COMMAND...: run under `timeout`, its output in WORK/NAME.log
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < 15)); then
        echo "[$name] NOT RUN: the ${BUDGET} s budget is spent"
        printf '%s\t%s\t%s\t%s\n' "$name" 125 0 0 >>"$WORK/pieces.tsv"
        FAILED+=("$name (not run)")
        return
    fi
    ((limit > left)) && limit=$left
    local shown
    printf -v shown '%q ' "$@"
    echo "[$name] \$ ${shown}(limit ${limit} s)"
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local status=$? took=$((SECONDS - began))
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$took" "$limit" >>"$WORK/pieces.tsv"
    grep -v -e '^[IWE]0000 ' -e 'absl::InitializeLog' "$WORK/$name.log" | tail -n 6 | sed 's/^/    /'
    if ((status == 124 || status == 137)); then
        echo "[$name] TIMED OUT after ${took} s"
        FAILED+=("$name (timed out)")
    elif ((status != 0)); then
        echo "[$name] FAILED: exit ${status} after ${took} s"
        FAILED+=("$name (exit $status)")
    else
        echo "[$name] done in ${took} s"
    fi
    pack
}

# What each piece is given here, and what the rehearsal appends to shrink it.
CHECK=(--run-dir "$WORK/check" --s3-args "--batches 1,8" --bench-args "--batches 1 --cache-batches 1")
DECODE=(--decode-impl xla,pallas --dtype bfloat16 --batches 1,8 --cache-batches none)
BIG=(--embed 2048 --ff 8192 --heads 16 --head-dim 128 --layers 24 --seq 1024)
SMALL_BENCH=() SMALL_DECODE=() SCALE=1
if [[ $REHEARSAL == 1 ]]; then
    echo "REHEARSAL on this machine's CPU: shapes and steps shrunk, our kernels interpreted"
    CHECK=(--run-dir "$WORK/check" --cpu
        --s3-args "--batches 1,8 --batches 1 --new-tokens 4"
        --bench-args "--batches 1 --cache-batches 1 --mbu-preset cpu --new-tokens 16 --repeats 1"
        -- --preset tiny --steps 8)
    SMALL_BENCH=(--batch 2 --seq 32 --repeats 2 --warmup 1 --windows 2 --window-steps 1)
    # Interpreted, a step of ours takes seconds: batch 1 only, one call of 16 steps.
    SMALL_DECODE=(--embed 64 --ff 128 --heads 2 --head-dim 64 --layers 1 --seq 64 --batches 1
        --new-tokens 16 --repeats 1)
    SCALE=${GPU_FIRST_CALL_SCALE:-3}  # this CPU is slower than the GPU machine's host
    BUDGET=$((BUDGET * SCALE))
fi

echo "gpu first call: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
timeout 20 nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
    2>/dev/null || echo "nvidia-smi: none here"
timeout 120 "$PYTHON" -c "import json, jax; d = jax.devices(); print(json.dumps({'kind': \
d[0].device_kind, 'platform': d[0].platform, 'devices': len(d), 'jax': jax.__version__}))" \
    2>/dev/null | tail -n 1 | tee "$WORK/machine.json"

# Our kernels against XLA's first: what the call is for, were the budget to run short.
piece decode_gpt2 $((115 * SCALE)) "$PYTHON" scripts/bench_decode.py --mbu-preset gpt2-bytes \
    "${DECODE[@]}" --summary-out "$WORK/decode_gpt2.json" "${SMALL_DECODE[@]}"
piece decode_1.2b $((115 * SCALE)) "$PYTHON" scripts/bench_decode.py --mbu-preset gpt2-bytes \
    "${DECODE[@]}" "${BIG[@]}" --summary-out "$WORK/decode_1.2b.json" "${SMALL_DECODE[@]}"
piece check $((150 * SCALE)) "$PYTHON" scripts/accelerator_check.py "${CHECK[@]}"
# s2's trace of steps 1-3 (a test fixture for a chip's trace), where it fits what comes back
tar -czf "$OUT/profile.tar.gz" -C "$WORK/check" profile 2>/dev/null
if (($(stat -c %s "$OUT/profile.tar.gz" 2>/dev/null || echo 0) > 15000000)); then
    rm -f "$OUT/profile.tar.gz" && echo "the trace is over 15 MB: not brought back"
fi
for preset in course gpt2-bytes; do
    limit=$([[ $preset == course ]] && echo 35 || echo 55)  # gpt2-bytes: 12 layers to compile
    piece "bench_$preset" $((limit * SCALE)) "$PYTHON" scripts/bench.py --preset "$preset" \
        --summary-out "$WORK/bench_$preset.json" "${SMALL_BENCH[@]}"
    piece "bench_${preset}_bf16_master" $((limit * SCALE)) "$PYTHON" scripts/bench.py \
        --preset "$preset" --weights bfloat16 --master \
        --summary-out "$WORK/bench_${preset}_bf16_master.json" "${SMALL_BENCH[@]}"
done

echo
"$PYTHON" scripts/first_call_table.py "$WORK" --json-out "$OUT/figures.json" 2>&1 |
    grep -v -e '^[IWE]0000 ' -e 'absl::InitializeLog' | tee "$OUT/table.txt"
pack
echo "took $((SECONDS - START)) s of a ${BUDGET} s budget; the pieces' files: $OUT/pieces.tar.gz"
((${#FAILED[@]})) && echo "failed: ${FAILED[*]}"
exec >&- 2>&-  # tee sees the end of its input: the log is whole before the call returns
wait "$TEE"
((${#FAILED[@]} == 0))

#!/usr/bin/env bash
# Every GPU check of tinit in one call, for a session lent the device machine (an H200):
#
#     run(command="bash benchmarks/device_check.sh", timeout_s=540)
#
# It installs nothing: the machine's image has python3 with torch, typer, rich, pandas,
# matplotlib, pytest and hypothesis, and tinit runs from the checkout (PYTHONPATH);
# `audit --hf` needs transformers (skipped, and said so, where it is missing). Each step
# has its own timeout, so a slow or failing step never costs the others; the limits add
# up to 9 minutes (expected: about 4). Without CUDA it runs every step at tiny sizes on
# the CPU instead, a check of the script itself and not a measurement:
# `bash benchmarks/device_check.sh` here (tests/test_benchmarks.py does, in the suite).
#
# Steps, every command's GPU path:
#   1. versions and device
#   2. the CUDA tests (tests/test_gpu.py, tests/test_overlap_schedule.py)
#   3. benchmarks/bench_gpu.py: the 70B-shape streamed variance in bf16 and in fp32
#      with TF32, peak memory, the probe's overhead, the weight-generation overlap,
#      grad-norms at 80 x 4096 (layer-wise backward)
#   4. `tinit variance` on the 70B shape as a user runs it (whole command, bf16)
#   5. `tinit norms`: LayerNorm / RMSNorm ratios, torch.compile included
#   6. `tinit train` with bf16 autocast and --compile: tokens/s and MFU
#   7. `tinit audit --hf llama` at transformers' default (7B) shape in bf16
#   8. `tinit coord-check` at GPU widths (where the command exists)
#   9. a Llama-3-8B-shaped checkpoint (15 GiB of bf16, written shard by shard by
#      benchmarks/make_checkpoint.py, drawn on the GPU), `tinit audit --checkpoint --device
#      cuda` on it (each block read on the CPU while the GPU measures the one before), and
#      the float32 whole-load peer (benchmarks/_checkpoint_peer.py) moved to the GPU
# and benchmarks/device_table.py gathers the figures of every step into one table.
#
# What comes back under $OUT (at most 8 files): device_check.log, device_table.csv,
# gpu_tests.txt, bench_gpu.csv, norms.png, train_runs.csv, audit_config.json,
# ckpt_audit_config.json. Anywhere else it writes to a temporary folder.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT="${OUT:-benchmarks/out/device}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT  # (the runs' folders: what is kept was copied to $OUT)
exec > >(tee "$OUT/device_check.log") 2>&1

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
status=0
check() {  # check NAME SECONDS CMD...: run with a timeout, note a failure, go on
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "$name,$rc,$((SECONDS - t0))" >> "$WORK/steps.csv"
    if [ "$rc" -ne 0 ]; then
        echo "!!! $name: exit $rc$([ "$rc" -eq 124 ] && echo " (timed out after ${limit} s)")"
        status=1
    fi
}
echo "step,exit,seconds" > "$WORK/steps.csv"

step "versions"
# one interpreter start both reports the versions and decides the sizes
check versions 30 "$PY" -c '
import importlib.util, platform, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA", "|", platform.node())
open(sys.argv[1], "w").write("cuda" if torch.cuda.is_available() else "cpu")
open(sys.argv[2], "w").write("yes" if importlib.util.find_spec("transformers") else "no")
' "$WORK/device" "$WORK/hf"
SMALL=()
REPEATS=3
VARIANCE_SIZE=(--preset llama2-70b --batch 4 --seq-len 512)
NORMS_SIZE=()
GPU_TESTS=(tests/test_gpu.py tests/test_overlap_schedule.py)
# train: a 12-layer d 1024 model on 16 x 512 tokens, long enough for compile to pay off
TRAIN_SIZE=(--layers 12 --d-model 1024 --heads 16 --vocab 4096 --seq-len 512 --batch 16 --steps 60
            --eval-every 60 --warmup 10 --probe-points 0 --compile)
# audit: transformers' default llama config is the 7B shape (32 x 4096, 11008, 32000)
AUDIT_SIZE=(--hf llama --dtype bfloat16 --seq-len 512 --batch 2)
COORD_SIZE=(--d-model 256,512,1024,2048 --layers 4 --steps 4)
# the checkpoint: Llama-3-8B's shape (32 x 4096, d_ff 14336, vocab 128256, untied), four shards
CKPT_SHAPE=(--shape llama-8b --shard-mib 4800)
DEV=cuda
if [ "$(cat "$WORK/device" 2>/dev/null)" != cuda ]; then
    echo "NO CUDA: tiny sizes, checking the script only; these are not GPU figures"
    SMALL=(--small)
    REPEATS=1  # every case once after its warm-up: the script is checked, nothing is timed
    VARIANCE_SIZE=(--layers 2 --d-model 64 --heads 4 --batch 2 --seq-len 16)
    NORMS_SIZE=(--rows 64 --d-model 64 --repeats 2 --warmup 1 --no-compile)
    GPU_TESTS=(tests/test_gpu.py)  # skips without CUDA; the overlap test runs in the main suite
    TRAIN_SIZE=(--layers 2 --d-model 32 --heads 2 --vocab 64 --seq-len 16 --batch 2 --steps 4
                --eval-every 4 --warmup 1 --probe-points 0)
    AUDIT_SIZE=(--hf llama --set num_hidden_layers=2 --set hidden_size=64 --set intermediate_size=128
                --set num_attention_heads=4 --set num_key_value_heads=4 --set vocab_size=256
                --seq-len 16 --batch 2)
    COORD_SIZE=(--d-model 32,64 --layers 2 --steps 2 --seeds 2 --seq-len 16 --batch 2 --vocab 64)
    CKPT_SHAPE=(--shape llama-1b --layers 2 --d-model 64 --d-ff 128 --vocab 256)
    DEV=cpu
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
    --format=csv,noheader

step "GPU tests"
check gpu-tests 60 "$PY" -m pytest -q -p no:cacheprovider -p no:hypothesispytest -rs "${GPU_TESTS[@]}" \
    2>&1 | tee "$OUT/gpu_tests.txt"

step "benchmarks/bench_gpu.py --repeats $REPEATS ${SMALL[*]}"
check bench-gpu 150 "$PY" benchmarks/bench_gpu.py --repeats "$REPEATS" "${SMALL[@]}" --csv "$OUT/bench_gpu.csv"

step "tinit variance ${VARIANCE_SIZE[*]} --init naive --pre-norm --stream --dtype bfloat16"
check variance-70b 45 "$PY" -m tinit variance "${VARIANCE_SIZE[@]}" --init naive --pre-norm --stream \
    --dtype bfloat16 -q --out "$WORK/variance"

step "tinit norms ${NORMS_SIZE[*]} (on CUDA: compiled norms included)"
check norms 75 "$PY" -m tinit norms "${NORMS_SIZE[@]}" -q --out "$WORK/norms"
cp "$WORK/norms/norms.png" "$OUT/" 2>/dev/null

step "tinit train ${TRAIN_SIZE[*]} (bf16 autocast on CUDA)"
check train 90 "$PY" -m tinit train "${TRAIN_SIZE[@]}" --init gpt2 --pre-norm -q --out "$WORK/train"
cp "$WORK/train/runs.csv" "$OUT/train_runs.csv" 2>/dev/null

step "tinit audit ${AUDIT_SIZE[*]}"
if [ "$(cat "$WORK/hf" 2>/dev/null)" = yes ]; then
    check audit-7b 90 "$PY" -m tinit audit "${AUDIT_SIZE[@]}" -q --out "$WORK/audit"
    cp "$WORK/audit/config.json" "$OUT/audit_config.json" 2>/dev/null
else
    echo "transformers is not installed here: audit --hf skipped (pip install transformers)"
    echo "audit-7b,skipped,0" >> "$WORK/steps.csv"
fi

step "tinit coord-check ${COORD_SIZE[*]}"
if [ -f tinit/cli/coord_check.py ]; then  # (not `tinit coord-check --help`: an interpreter start)
    check coord-check 75 "$PY" -m tinit coord-check "${COORD_SIZE[@]}" --init gpt2,mup -q \
        --out "$WORK/coord"
else
    echo "this tinit has no coord-check command: skipped"
    echo "coord-check,skipped,0" >> "$WORK/steps.csv"
fi

step "checkpoint ${CKPT_SHAPE[*]}: written, then tinit audit --checkpoint --device $DEV, then the peer"
if [ "$(cat "$WORK/hf" 2>/dev/null)" = yes ]; then
    check ckpt-write 150 "$PY" benchmarks/make_checkpoint.py "${CKPT_SHAPE[@]}" --out "$WORK/ckpt" --device "$DEV"
    check ckpt-audit 150 "$PY" -m tinit audit --checkpoint "$WORK/ckpt" --seq-len 128 --batch 1 --device "$DEV" \
        -q --out "$WORK/ckpt-audit"
    cp "$WORK/ckpt-audit/config.json" "$OUT/ckpt_audit_config.json" 2>/dev/null
    check ckpt-peer 150 "$PY" benchmarks/_checkpoint_peer.py "$WORK/ckpt" "$WORK/peer.csv" --device "$DEV" \
        --threads "$(nproc)"
    rm -rf "$WORK/ckpt"
else
    echo "transformers is not installed here: the checkpoint audit skipped"
    echo "ckpt-audit,skipped,0" >> "$WORK/steps.csv"
fi

step "the table"
check table 30 "$PY" benchmarks/device_table.py "$WORK" --bench "$OUT/bench_gpu.csv" --csv "$OUT/device_table.csv"

step "done: $([ "$status" -eq 0 ] && echo "every step passed" || echo "some step FAILED (see !!! above)")"
exit "$status"

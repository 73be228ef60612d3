#!/usr/bin/env bash
# Every GPU check of tinit in one call, for a session lent the device machine (an H200):
#
#     run(command="bash benchmarks/device_check.sh", timeout_s=480)
#
# It installs nothing: the machine's image has python3 with torch, typer, rich, pandas,
# matplotlib, pytest and hypothesis, and tinit runs from the checkout (PYTHONPATH).
# Each step has its own timeout, so a slow or failing step never costs the others;
# the whole script stays under 7.5 minutes even when every step runs to its limit
# (expected: about 3). Without CUDA it runs every step at tiny sizes instead (a check of
# the script itself, not a measurement): `bash benchmarks/device_check.sh` here.
#
# Steps: versions and device; tests/test_gpu.py (+ the overlap schedule test);
# benchmarks/bench_gpu.py (issue 6's targets, table + CSV); `tinit variance` on the
# 70B shape as a user runs it (whole command); `tinit norms` on the GPU (issue 5's
# LayerNorm/RMSNorm ratios, torch.compile included).
#
# What comes back under $OUT (at most 8 files): device_check.log, gpu_tests.txt,
# bench_gpu.csv, variance70b_summary.csv, variance70b_config.json, norms_ratio.csv,
# norms.png. Anywhere else it writes to benchmarks/out/device/ (ignored by git).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT="${OUT:-benchmarks/out/device}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
exec > >(tee "$OUT/device_check.log") 2>&1

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
status=0
check() {  # check NAME SECONDS CMD...: run with a timeout, note a failure, go on
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "!!! $name: exit $rc$([ "$rc" -eq 124 ] && echo " (timed out after ${limit} s)")"
        status=1
    fi
}

step "versions"
# one interpreter start both reports the versions and decides the sizes
check versions 30 "$PY" -c '
import platform, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA", "|", platform.node())
open(sys.argv[1], "w").write("cuda" if torch.cuda.is_available() else "cpu")
' "$WORK/device"
SMALL=()
VARIANCE_SIZE=(--preset llama2-70b --batch 4 --seq-len 512)
NORMS_SIZE=()
GPU_TESTS=(tests/test_gpu.py tests/test_overlap_schedule.py)
if [ "$(cat "$WORK/device" 2>/dev/null)" != cuda ]; then
    echo "NO CUDA: tiny sizes, checking the script only; these are not GPU figures"
    SMALL=(--small)
    VARIANCE_SIZE=(--layers 2 --d-model 64 --heads 4 --batch 2 --seq-len 16)
    NORMS_SIZE=(--rows 64 --d-model 64 --repeats 2 --warmup 1 --no-compile)
    GPU_TESTS=(tests/test_gpu.py)  # skips without CUDA; the overlap test runs in the main suite
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
    --format=csv,noheader

step "GPU tests"
check gpu-tests 90 "$PY" -m pytest -q -p no:cacheprovider -p no:hypothesispytest -rs "${GPU_TESTS[@]}" \
    2>&1 | tee "$OUT/gpu_tests.txt"

step "benchmarks/bench_gpu.py --repeats 3 ${SMALL[*]}"
check bench-gpu 150 "$PY" benchmarks/bench_gpu.py --repeats 3 "${SMALL[@]}" --csv "$OUT/bench_gpu.csv"

step "tinit variance ${VARIANCE_SIZE[*]} --init naive --pre-norm --stream --dtype bfloat16"
check variance-70b 45 "$PY" -m tinit variance "${VARIANCE_SIZE[@]}" --init naive --pre-norm --stream \
    --dtype bfloat16 --out "$WORK/variance70b"
cp "$WORK/variance70b/summary.csv" "$OUT/variance70b_summary.csv" 2>/dev/null
cp "$WORK/variance70b/config.json" "$OUT/variance70b_config.json" 2>/dev/null

step "tinit norms ${NORMS_SIZE[*]} (on CUDA: compiled norms included)"
check norms 120 "$PY" -m tinit norms "${NORMS_SIZE[@]}" --out "$WORK/norms"
cp "$WORK/norms/norms_ratio.csv" "$WORK/norms/norms.png" "$OUT/" 2>/dev/null

step "done: $([ "$status" -eq 0 ] && echo "every step passed" || echo "some step FAILED (see !!! above)")"
exit "$status"

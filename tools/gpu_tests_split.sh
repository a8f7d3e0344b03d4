#!/usr/bin/env bash
# The gpu-marked tests in one device call, as two pytest processes side by side (one alone takes
# about 10 minutes, more than a call's limit). Logs in $OUT/gpu_tests_{a,b}.txt.
# Usage on the device: bash tools/gpu_tests_split.sh [TIMEOUT_S]
# On a machine of several GPUs, GPU_A / GPU_B put each half on its own GPU (CUDA_VISIBLE_DEVICES).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=/tmp/pyfuser-cache
limit=${1:-560}
A="tests/codegen/test_device_library_gpu.py tests/gpu/test_broadcast_outputs_gpu.py
   tests/gpu/test_broadcast_reshape_gpu.py tests/gpu/test_empty_and_inputs_gpu.py
   tests/gpu/test_inner_outer_gpu.py tests/gpu/test_inner_persistent_gpu.py
   tests/gpu/test_library_ops_gpu.py tests/gpu/test_odd_rows_gpu.py"
ignore=""
for f in $A; do ignore="$ignore --ignore=$f"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
CUDA_VISIBLE_DEVICES=${GPU_A:-${CUDA_VISIBLE_DEVICES:-0}} timeout "$limit" \
  python3 -m pytest -q -m gpu --timeout=120 -p no:cacheprovider $A > "$OUT/gpu_tests_a.txt" 2>&1 &
CUDA_VISIBLE_DEVICES=${GPU_B:-${CUDA_VISIBLE_DEVICES:-0}} timeout "$limit" \
  python3 -m pytest -q -m gpu --timeout=120 -p no:cacheprovider tests $ignore \
  > "$OUT/gpu_tests_b.txt" 2>&1 &
wait
for h in a b; do echo "== $h"; grep -E "passed|failed|error" "$OUT/gpu_tests_$h.txt" | tail -3; done
grep -h "^FAILED\|^ERROR" "$OUT"/gpu_tests_?.txt | head -20

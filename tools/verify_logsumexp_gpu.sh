#!/usr/bin/env bash
# The one-pass logsumexp (schedule/logsumexp.py) and the streamed row reductions on the GPU in
# one device call: their GPU tests, compute-sanitizer (memcheck, racecheck, synccheck) on the key
# reductions, the GPU fuzzer's normalization pattern (logsumexp and cross-entropy losses among
# its kinds), and issue 16's logsumexp and column-sum bars beside eager and torch.compile.
# Usage on the device: bash tools/verify_logsumexp_gpu.sh; logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=/tmp/pyfuser-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 240 python3 -m pytest -q -m gpu --timeout=120 -p no:cacheprovider \
  tests/gpu/test_logsumexp_gpu.py tests/gpu/test_reduction_gpu.py \
  "tests/codegen/test_device_library_gpu.py::test_logsumexp_keys_match_the_host_rule" \
  > "$OUT/gpu_tests.txt" 2>&1 &
( for tool in memcheck racecheck synccheck; do
    echo "== $tool"
    timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 tools/sanitize_cases.py --logsumexp
  done ) > "$OUT/sanitize.txt" 2>&1 &
timeout 200 python3 tests/fuzz/run_fuzz.py --backend gpu --seed 20263903 --count 200 \
  --pattern normalization --jobs 8 --timeout 90 --no-repro-files --quiet --out "$OUT/fuzz" \
  > "$OUT/fuzz.log" 2>&1 &
wait
timeout 240 python3 tools/bench_issue16.py logsumexp colsum > "$OUT/bench.txt" 2>&1
tail -1 "$OUT/gpu_tests.txt"; grep -E "SUMMARY|logsumexp" "$OUT/sanitize.txt"
head -11 "$OUT/fuzz/summary.txt"; grep "|" "$OUT/bench.txt"

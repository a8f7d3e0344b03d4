#!/usr/bin/env bash
# The fuzzer on the GPU in one device call, then compute-sanitizer memcheck on some of its cases.
# Usage on the device: [PATTERN=name] bash tools/gpu_fuzz.sh SEED COUNT [SANITIZE] [MAX_ELEMENTS]
# (PATTERN: only the generator's pattern of that name, e.g. topk).
# Logs and the run's summary.txt / failures.md / results.jsonl under $OUT/fuzz-gpu-SEED.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=${PYFUSER_CACHE_DIR:-/tmp/pyfuser-cache}
seed=$1 count=$2 sanitize=${3:-0} max=${4:-65536}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/device.txt" 2>&1
python3 tests/fuzz/run_fuzz.py --backend gpu --seed "$seed" --count "$count" --jobs 14 \
  --max-elements "$max" --sanitize "$sanitize" --no-repro-files --quiet ${PATTERN:+--pattern "$PATTERN"} \
  --out "$OUT/fuzz-gpu-$seed" > "$OUT/fuzz-gpu-$seed.log" 2>&1
echo "run_fuzz exit $?" >> "$OUT/fuzz-gpu-$seed.log"
head -12 "$OUT/fuzz-gpu-$seed/summary.txt"; tail -25 "$OUT/fuzz-gpu-$seed.log"

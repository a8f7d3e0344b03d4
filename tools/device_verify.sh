#!/usr/bin/env bash
# One device call that checks correctness broadly: the gpu-marked tests (4 workers) and, on the
# machine's other cores at the same time, the interpreter fuzzer's long runs.
# Usage on the device: bash tools/device_verify.sh "SEED[:COUNT[:MAX]] ..."   (interpreter seeds;
# COUNT defaults to the long run's 5000 cases, MAX to the generator's default).
# Logs under $OUT: gpu_tests.txt, fuzz-interpret-SEED/ (summary.txt, failures.md) and .log.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=${PYFUSER_CACHE_DIR:-/tmp/pyfuser-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/device.txt" 2>&1
( timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu -n 4 --dist loadfile -p no:cacheprovider \
    -q tests > "$OUT/gpu_tests.txt" 2>&1; echo "pytest exit $?" >> "$OUT/gpu_tests.txt" ) &
tests=$!
for spec in ${1:-}; do
  IFS=: read -r seed count max <<< "$spec"
  args=(--backend interpret --seed "$seed" --jobs "${FUZZ_JOBS:-10}" --no-repro-files --quiet
        --out "$OUT/fuzz-interpret-$seed")
  if [ -n "${count:-}" ]; then args+=(--count "$count"); else args+=(--long); fi
  [ -n "${max:-}" ] && args+=(--max-elements "$max")
  timeout "${FUZZ_TIMEOUT:-480}" python3 tests/fuzz/run_fuzz.py "${args[@]}" \
    > "$OUT/fuzz-interpret-$seed.log" 2>&1
  echo "run_fuzz exit $?" >> "$OUT/fuzz-interpret-$seed.log"
  head -14 "$OUT/fuzz-interpret-$seed/summary.txt"
done
wait $tests
tail -15 "$OUT/gpu_tests.txt"

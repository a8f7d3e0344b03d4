#!/usr/bin/env bash
# One GPU-machine call: environment, the gpu-marked tests, then (optionally) a benchmark.
# Usage on the device: bash tools/gpu_check.sh [test paths...]; BENCH="names" for a bench.
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYFUSER_CACHE_DIR=/tmp/pyfuser-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  python3 -c "import cuda.core, cuda.bindings; print('cuda.core', cuda.core.__version__, 'cuda.bindings', cuda.bindings.__version__)"
  python3 -c "from pyfuser.runtime.nvrtc import nvrtc_version; print('nvrtc', nvrtc_version())"
} 2>&1 | tee "$OUT/env.txt"
TESTS=${*:-tests}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -m gpu -x --timeout=120 -p no:cacheprovider $TESTS \
    2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
fi
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 -m pyfuser bench $BENCH --peers "${PEERS:-eager,compile}" \
    --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | tail -30
fi

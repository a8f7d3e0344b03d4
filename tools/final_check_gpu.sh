#!/usr/bin/env bash
# One GPU call: named gpu tests, the issue bars' benchmarks with eager and torch.compile, the host
# timings, and a GPU fuzz run with memcheck. Usage: bash tools/final_check_gpu.sh SEED COUNT SAN "tests..."
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=/tmp/pyfuser-cache
seed=$1 count=$2 san=$3 tests=$4
timeout 120 python3 -m pytest -q -m gpu --timeout=100 -p no:cacheprovider $tests 2>&1 | tail -4
timeout 200 python3 -m pyfuser bench mse_mean amax_scale softmax_dim0 nchw_to_nhwc scale_shift_relu_cl \
  --peers eager,compile --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | tail -9
timeout 60 python3 -m pyfuser bench rmsnorm_fwd --shapes 16384x4097 --peers eager,compile 2>&1 | tail -2
timeout 60 python3 -m pyfuser bench layernorm_bwd --dtype fp16 --shapes 4096x5121 --peers eager,compile 2>&1 | tail -2
timeout 150 python3 tools/host_timing_gpu.py --runs 3 2>&1 | grep -v "ran:" | tee "$OUT/host.txt"
timeout 200 bash tools/gpu_fuzz.sh "$seed" "$count" "$san" 65536 2>&1 | head -14

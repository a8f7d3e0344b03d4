#!/usr/bin/env bash
# One catalogue fusion under Nsight Compute, with its CUDA, ptxas report and SASS, in one device
# call. Usage on the device: bash tools/profile_gpu.sh NAME MxN [REGEX]; files in $OUT/prof-NAME.
# A bench case: bash tools/profile_gpu.sh bench_issue18:dropout - pointwise
# NCU_EXTRA="--section SourceCounters" adds sections; PROFILE_DTYPE=fp16 the catalogue dtype;
# LAUNCH_SKIP and LAUNCH_COUNT (3 and 1) pick the launches profiled (a plan of 3 kernels: 3 and 3).
set -u
OUT=${OUT:-/tmp/out}
name=$1 shape=$2 regex=${3:-$1}
dir="$OUT/prof-${name//:/-}"; mkdir -p "$dir"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYFUSER_CACHE_DIR=/tmp/pyfuser-prof-cache
rm -rf "$PYFUSER_CACHE_DIR"
PROFILE_CUBIN_DIR="$dir/cubin" PYFUSER_DUMP=cuda,ptxas,launch PYFUSER_DUMP_DIR="$dir/dump" python3 tools/profile_case.py "$name" "$shape" \
  > "$dir/run.txt" 2>&1
for f in "$dir"/cubin/*.cubin; do
  (cuobjdump -sass "$f" || nvdisasm "$f") > "$dir/$(basename "$f").sass" 2>&1
done
timeout 240 ncu --kernel-name "regex:$regex" --launch-skip ${LAUNCH_SKIP:-3} --launch-count ${LAUNCH_COUNT:-1} \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section SchedulerStats --section WarpStateStats --section InstructionStats ${NCU_EXTRA:-} \
  python3 tools/profile_case.py "$name" "$shape" > "$dir/ncu.txt" 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A" "$dir/ncu.txt" | head -20

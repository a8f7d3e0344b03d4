export PYTHONPATH=$PWD PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_inner_outer_gpu.py --timeout=120 > $OUT/gpu_io.txt 2>&1; echo rc=$? >> $OUT/gpu_io.txt
timeout 200 python tools/sweep_inner_outer.py rmsnorm_bwd layernorm_bwd --kinds registers --defaults-only --shapes 16384x16384,4096x65536,2048x131072,16384x32768,1x4096,264x4096,2048x4096,16384x4096 > $OUT/after_smem.txt 2>&1; echo rc=$? >> $OUT/after_smem.txt
for s in 1x4096 2048x4096; do timeout 60 ncu --kernel-name regex:rmsnorm_bwd --launch-skip 3 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy python tools/profile_case.py rmsnorm_bwd $s > $OUT/ncu_rms_$s.txt 2>&1; done

export PYTHONPATH=$PWD PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_inner_outer_gpu.py --timeout=120 -x > $OUT/gpu_io.txt 2>&1
echo rc=$? >> $OUT/gpu_io.txt
timeout 380 python tools/sweep_inner_outer.py rmsnorm_bwd --kinds registers,tma,ws --shapes 16384x1024,16384x2048,16384x4096,16384x8192,16384x16384,2048x4096 > $OUT/sweep2_rms.txt 2>&1
echo rc=$? >> $OUT/sweep2_rms.txt

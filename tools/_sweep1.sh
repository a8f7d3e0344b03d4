export PYTHONPATH=$PWD PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
timeout 560 python tools/sweep_inner_outer.py rmsnorm_bwd layernorm_bwd --kinds registers,tma --shapes 16384x1024,16384x2048,16384x4096,16384x8192,16384x16384,2048x1024,2048x4096 > $OUT/sweep1.txt 2>&1
echo rc=$? >> $OUT/sweep1.txt

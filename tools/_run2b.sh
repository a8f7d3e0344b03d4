export PYTHONPATH=$PWD PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 570 python tools/sweep_inner_outer.py layernorm_bwd --kinds registers,tma,ws --shapes 16384x1024,16384x2048,16384x4096,16384x8192,16384x16384,2048x4096 > $OUT/sweep2_ln.txt 2>&1
echo rc=$? >> $OUT/sweep2_ln.txt

source .peer-wheels/b/peer-install.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 300 python -m pyfuser bench rmsnorm_bwd --shapes 16384x1024 16384x2048 16384x4096 16384x8192 16384x16384 16384x32768 4096x65536 2048x131072 2048x1024 2048x2048 2048x4096 2048x8192 2048x16384 2048x32768 2048x65536 --peers eager,compile,liger,quack --out $OUT/bwd_rms_a.json > $OUT/bwd_rms_a.txt 2>&1; echo rc=$? >> $OUT/bwd_rms_a.txt
timeout 270 python -m pyfuser bench layernorm_bwd --shapes 16384x1024 16384x4096 16384x16384 4096x65536 2048x1024 2048x2048 2048x4096 2048x8192 2048x16384 2048x32768 2048x65536 --peers eager,compile,liger,quack --out $OUT/bwd_ln_a.json > $OUT/bwd_ln_a.txt 2>&1; echo rc=$? >> $OUT/bwd_ln_a.txt

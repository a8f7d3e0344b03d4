source .peer-wheels/b/peer-install.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 300 python -m pyfuser bench rmsnorm_bwd --shapes 16384x16384 16384x32768 4096x65536 2048x131072 2048x16384 2048x32768 2048x65536 4096x16384 4096x32768 32768x16384 32768x32768 32768x65536 1x4096 16384x4096 --peers eager,compile,liger,quack --out $OUT/bwd_rms_c.json > $OUT/bwd_rms_c.txt 2>&1; echo rc=$? >> $OUT/bwd_rms_c.txt
timeout 260 python -m pyfuser bench layernorm_bwd --shapes 16384x16384 4096x65536 2048x16384 2048x32768 2048x65536 4096x16384 4096x32768 32768x16384 32768x32768 32768x65536 1x4096 16384x4096 --peers eager,compile,liger,quack --out $OUT/bwd_ln_c.json > $OUT/bwd_ln_c.txt 2>&1; echo rc=$? >> $OUT/bwd_ln_c.txt
grep "bwd |" $OUT/bwd_*_c.txt

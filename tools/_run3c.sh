source .peer-wheels/b/peer-install.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 290 python -m pyfuser bench rmsnorm_bwd --shapes 4096x1024 4096x2048 4096x4096 4096x8192 4096x16384 4096x32768 4096x65536 32768x1024 32768x2048 32768x4096 32768x8192 32768x16384 32768x32768 32768x65536 --peers eager,compile,liger,quack --out $OUT/bwd_rms_b.json > $OUT/bwd_rms_b.txt 2>&1; echo rc=$? >> $OUT/bwd_rms_b.txt
timeout 290 python -m pyfuser bench layernorm_bwd --shapes 4096x1024 4096x2048 4096x4096 4096x8192 4096x16384 4096x32768 4096x65536 32768x1024 32768x2048 32768x4096 32768x8192 32768x16384 32768x32768 32768x65536 --peers eager,compile,liger,quack --out $OUT/bwd_ln_b.json > $OUT/bwd_ln_b.txt 2>&1; echo rc=$? >> $OUT/bwd_ln_b.txt

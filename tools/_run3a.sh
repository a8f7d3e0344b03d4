source .peer-wheels/a/peer-install.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
git log --oneline -1 > $OUT/commit.txt 2>&1
timeout 400 python -m pytest -q -m gpu -p no:cacheprovider tests --timeout=120 > $OUT/gpu_all.txt 2>&1; echo rc=$? >> $OUT/gpu_all.txt
timeout 150 compute-sanitizer --tool memcheck python tools/sanitize_cases.py > $OUT/san_memcheck.txt 2>&1; echo rc=$? >> $OUT/san_memcheck.txt

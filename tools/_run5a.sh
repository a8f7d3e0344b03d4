source .peer-wheels/a/peer-install.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests --timeout=120 > $OUT/gpu_all.txt 2>&1; echo rc=$? >> $OUT/gpu_all.txt
timeout 200 compute-sanitizer --tool memcheck python tools/sanitize_cases.py > $OUT/san_memcheck.txt 2>&1; echo rc=$? >> $OUT/san_memcheck.txt
tail -2 $OUT/gpu_all.txt; grep "ERROR SUMMARY" $OUT/san_memcheck.txt; grep "Program hit" $OUT/san_memcheck.txt | sed 's/.*API call to //' | sort | uniq -c

export PYTHONPATH=$PWD PYFUSER_CACHE_DIR=/tmp/pyfuser-cache PYTHONUNBUFFERED=1
for t in racecheck synccheck; do timeout 200 compute-sanitizer --tool $t python tools/sanitize_cases.py > $OUT/san_$t.txt 2>&1; echo rc=$? >> $OUT/san_$t.txt; done
grep -h "SUMMARY" $OUT/san_*.txt

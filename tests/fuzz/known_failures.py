"""The fuzzer's CI sample (test_fuzz_sample.py): its constants, and the cases known to fail.

Each known case is a strict xfail: it must keep failing in its category, and a fixed case
turns the test red until its entry is removed. Raise SAMPLE_COUNT when the interpreter gets
faster (the sample should take about 2 minutes on one core); after changing the constants or
the generator (which changes the cases), regenerate this file:

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --sample --jobs 2 \
        --known-failures tests/fuzz/known_failures.py

Entries read "category: scheduler | normalized reason".
"""
SAMPLE_SEED = 20261123
SAMPLE_COUNT = 1500
SAMPLE_MAX_ELEMENTS = 32768

KNOWN = {
}

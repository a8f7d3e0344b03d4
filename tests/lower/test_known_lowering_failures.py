"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed. Until then the executor runs
such a fusion through the reference evaluator with a FallbackWarning (RunInfo.internal_error
set), so users get right values, not an exception.

None at present: the last three (fuzz 20261124:4371, 20261124:2807, GPU fuzz 2:883) are fixed
and tested in tests/schedule/test_inlining.py and tests/schedule/test_schedulers_registry.py.
"""

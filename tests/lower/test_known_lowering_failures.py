"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed.

Write one as the fuzzer's repro (`run_fuzz.py --print-repro SEED:INDEX`) reduced, run with
`pyfuser.testing.run_and_check(fd, inputs, kernels=0, options={"enable": ["interpret"]})`
(FallbackWarnings ignored: segments no scheduler takes may run on the reference), then
`assert not fd.last_run.internal_error`, under `@pytest.mark.xfail(strict=True, reason=...)`
naming the case. Until fixed, the executor runs such a fusion on the reference evaluator with a
FallbackWarning (RunInfo.internal_error set), or the interpreter reports the bad access.
"""
# None at present: 20261608:116, the last one, is fixed (tests/schedule/test_inlining.py).

"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed. Until then the executor runs
such a fusion through the reference evaluator with a FallbackWarning (RunInfo.internal_error
set), or the interpreter reports the bad access, so users get no silent wrong value from them
on the interpreter.
"""
import warnings

from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


def _strict(fd, inputs):
    """Right values with no internal error and no bad access: segments no scheduler takes may
    still run on the reference (a fallback, not a failure)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, inputs, kernels=0, options=INTERPRET)
    assert not fd.last_run.internal_error, fd.last_run.internal_error

"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed.

Write one as the fuzzer's repro (`run_fuzz.py --print-repro SEED:INDEX`) reduced, run with
`pyfuser.testing.run_and_check(fd, inputs, kernels=0, options={"enable": ["interpret"]})`
(FallbackWarnings ignored: segments no scheduler takes may run on the reference), then
`assert not fd.last_run.internal_error`, under `@pytest.mark.xfail(strict=True, reason=...)`
naming the case. Until fixed, the executor runs such a fusion on the reference evaluator with a
FallbackWarning (RunInfo.internal_error set), or the interpreter reports the bad access.
"""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check


@pytest.mark.xfail(strict=True, reason=(
    "CPU fuzz 20261606:375 and :1058 (pre-existing at 9239040): the outer persistent kernel "
    "of a var_mean over rows of x [4, 16] whose 16 columns only a full() gives (the input "
    "[4, 1] broadcasts along them) cannot index its output x from its loops"))
def test_outer_persistent_over_columns_only_a_full_gives():
    t = torch.randn(4, 1).half()
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Half)
        ones = fd.ops.logical_not(fd.ops.le(fd.ops.full([4, 16], 1.0, dtype=DataType.Float),
                                            0.5))
        v = fd.ops.add(ones, x)
        var, mean = fd.ops.var_mean(v, [0], keepdim=True, correction=0)
        for o in (v, var, mean):
            fd.add_output(o)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, [t], kernels=0, options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error, fd.last_run.internal_error

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

from pyfuser import FusionDefinition
from pyfuser.testing import run_and_check


@pytest.mark.xfail(strict=True, reason="fuzz 20261504:575: the outer persistent scheduler's "
                   "var_mean over an expanded dim and another reduced dim; lowering cannot "
                   "merge the loops of its two consumers (a reduced loop of one iteration and "
                   "a broadcast one)")
def test_var_mean_over_an_expanded_and_a_reduced_dim_in_the_outer_persistent_scheduler():
    x = torch.randint(-8, 1, (3735,), dtype=torch.int32).as_strided((17, 5, 747), (0, 747, 1))
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.exp2(t0), [0, 1], keepdim=True, correction=1)
        fd.add_output(mean)
        fd.add_output(var)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_and_check(fd, [x], kernels=0, options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error, fd.last_run.internal_error

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
    "CPU fuzz 20261608:116 (pre-existing at 9239040): the full-reduction kernel of "
    "mean(x [N], keepdim) * y [1] beside x == y [N] needs its serial reduction loop and its "
    "thread loop each before the other ('cyclic dependency between loops')"))
def test_full_reduction_beside_a_pointwise_output_over_the_reduced_dim():
    x = torch.rand(2489).bfloat16() + 0.5
    y = torch.randn(1).bfloat16()
    with FusionDefinition() as fd:
        tx = fd.define_tensor(shape=[2489], contiguity=[True], dtype=DataType.BFloat16)
        ty = fd.from_pytorch(y)
        fd.add_output(fd.ops.eq(tx, ty))
        fd.add_output(fd.ops.mul(fd.ops.mean(tx, [0], keepdim=True), ty))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, [x, y], kernels=0, options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error, fd.last_run.internal_error

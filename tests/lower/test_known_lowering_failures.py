"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed. Until then the executor runs
such a fusion through the reference evaluator with a FallbackWarning (RunInfo.internal_error
set), or the interpreter reports the bad access, so users get no silent wrong value from them
on the interpreter.
"""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
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


@pytest.mark.xfail(strict=True, reason="inner_persistent segment: 'max() arg is an empty "
                   "sequence' (fuzz 20261130:3973); not fixed")
def test_var_of_a_constant_beside_sums_of_a_permuted_input():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(55510, generator=g) * 1.5 + 0.5).half().as_strided(
        (2, 61, 35, 13), (61, 1, 122, 4270))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True],
                              dtype=DataType.Half, stride_order=[1, 0, 2, 3])
        v0 = fd.ops.lt(t0, 0.5)
        v1 = fd.ops.where(v0, t0, -1.0)
        v4 = fd.ops.permute(fd.ops.cast(v1, dtype=DataType.BFloat16), [0, 1, 3, 2])
        v9 = fd.ops.le(fd.ops.full([2, 61, 13, 35], 1.0, dtype=DataType.Float), 0.5)
        v12 = fd.ops.sum(fd.ops.where(v9, v4, 2.0), [2])
        v16 = fd.ops.logical_not(fd.ops.le(fd.ops.full([2, 61, 35], 1.0, dtype=DataType.Float),
                                           0.5))
        v18 = fd.ops.var(fd.ops.cast(v16, dtype=DataType.BFloat16), [2], keepdim=True,
                         correction=1)
        fd.add_output(fd.ops.pow(v16, 3))
        fd.add_output(v18)
        fd.add_output(v12)
    _strict(fd, [x])

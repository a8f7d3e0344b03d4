"""Failures the fuzzer found that are not fixed yet, as strict xfails: each turns into a failure
(XPASS) once fixed, and then moves to the tests of what it fixed. Until then the executor runs
such a fusion through the reference evaluator with a FallbackWarning (RunInfo.internal_error
set), so users get right values, not an exception."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


@pytest.mark.xfail(strict=True, reason="lowering: 'cyclic dependency between loops' among the "
                   "vector loops of the pointwise schedule (GPU fuzz case 2:883, seed 2, "
                   "max elements 4194304); not fixed")
def test_broadcast_chain_beside_its_rank_2_source_in_a_transposed_layout():
    """v1 [4, N] (of a column-major input) is read directly by the first output and, broadcast
    to [1, 4, N], by the other two; the vector loops of five tensors end up ordered in a
    cycle."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[0, 1])
        v1 = fd.ops.logical_or(fd.ops.gt(t0, 0.5), True)
        v3 = fd.ops.broadcast(fd.ops.tanh(v1), [True, False, False])
        v7 = fd.ops.sqrt(fd.ops.add(fd.ops.mul(v3, v3), 0.5))
        v8 = fd.ops.zeros([4, 2104], dtype=DataType.BFloat16)
        v11 = fd.ops.where(fd.ops.le(v8, 0.5), v7, 2.0)
        fd.add_output(fd.ops.where(v1, v11, 0.25))
        fd.add_output(v3)
        fd.add_output(v11)
    run_and_check(fd, [torch.randn(2104, 4).t()], scheduler="pointwise", options=INTERPRET)


@pytest.mark.xfail(strict=True, reason="lowering: 'cyclic dependency between loops' among the "
                   "vector loops (fuzz 20261124:4371, the class of 2:883): a tensor read "
                   "directly and through an explicit broadcast to a new outer dim in one output; "
                   "not fixed")
def test_a_tensor_and_its_broadcast_to_a_new_dim_in_one_output():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        v3 = fd.ops.sub(t0, 1.0)
        v4 = fd.ops.broadcast_in_dim(v3, [1, -1, -1, -1], [1, 2, 3])
        v6 = fd.ops.sigmoid(fd.ops.cast(v4, dtype=DataType.BFloat16))
        fd.add_output(fd.ops.mul(v3, v6))
        fd.add_output(v4)
        fd.add_output(v6)
    run_and_check(fd, [torch.rand(2, 4, 8)], scheduler="pointwise", options=INTERPRET)


@pytest.mark.xfail(strict=True, reason="lowering: 'cannot index T#'s axis from its loops' "
                   "(fuzz 20261124:2807): single-element [1, 1, 1] tensors, one reshaped to [1] "
                   "and broadcast back beside a mean over two of their dims; not fixed")
def test_single_element_tensors_with_a_reshape_and_a_reduction_of_them():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        v3 = fd.ops.where(fd.ops.lt(t1, 0.5), t0, -0.5)
        v5 = fd.ops.mean(t1, [-3, -1])
        fd.ops.var_mean(v5, [0], keepdim=True, correction=1)
        v12 = fd.ops.where(fd.ops.gt(t1, 0.5), fd.ops.erf(t1), v3)
        v15 = fd.ops.logical_or(fd.ops.eq(t0, 0.5), fd.ops.ge(fd.ops.reshape(t1, [1]), 0.5))
        fd.add_output(v15)
        fd.add_output(v12)
    inputs = [torch.rand(8)[7:].as_strided((1, 1, 1), (1, 1, 1)), torch.randn(1, 1, 1)]
    run_and_check(fd, inputs, scheduler="pointwise", options=INTERPRET)

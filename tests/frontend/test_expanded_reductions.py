"""Reductions over expanded dims (stride 0: E copies of one element, triage P3).

The frontend does not reduce over them: it keeps them through the reduction of the other dims
as the broadcasts they are and squeezes them from its result (SqueezeOp.reduction), which is E
times the element for a sum, the element for a max or a min. What is checked: the definition
(no ReductionOp over a broadcast ID), the values against torch on the reference evaluator and
on the kernels (interpreter), and an expanded dim of size 0 (a sum is 0, a max is refused as
torch refuses it).
"""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, InputError
from pyfuser.ir.exprs import ReductionOp, ReductionOpType, SqueezeOp

PATHS = {"reference": None, "interpret": {"enable": ["interpret"]}}
TORCH_OP = {"sum": "sum", "max": "amax", "min": "amin", "mean": "mean"}


def _define(op, dims, expanded, dtype=DataType.Float):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * len(expanded), dtype=dtype, expanded=expanded)
        fd.add_output(getattr(fd.ops, op)(x, dims))
    return fd


def test_no_reduction_over_an_expanded_dim():
    fd = _define("sum", [1, 2], [False, False, True])
    reds = [e for e in fd.fusion.exprs() if isinstance(e, ReductionOp)]
    assert len(reds) == 1
    (red,) = reds
    assert [i.is_reduction for i in red.outputs[0].domain.maybe_root] == [False, True, False]
    squeezes = [e for e in fd.fusion.exprs() if isinstance(e, SqueezeOp)]
    assert [(s.is_squeezed, s.reduction) for s in squeezes] == [([False, True],
                                                                  ReductionOpType.Sum)]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("dims, expanded, base, shape", [
    ([1], [False, True], (9, 1), (9, 40)),                       # the expanded dim alone
    ([1, 2], [False, False, True], (5, 3, 1), (5, 3, 33)),       # with a concrete one
    ([0, 2], [True, False, True], (1, 6, 1), (7, 6, 5)),         # kept dim concrete
    ([1, 2], [True, False, True], (1, 3, 1), (7, 3, 257)),       # kept dim expanded
])
def test_values_match_torch(op, dims, expanded, base, shape, path):
    fd = _define(op, dims, expanded)
    x = torch.randn(base).expand(shape)
    (out,) = fd.execute([x], options=PATHS[path])
    want = getattr(x.double(), TORCH_OP[op])(dims)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    if path == "interpret":
        assert fd.last_run.kind == "kernels" and not fd.last_run.internal_error, fd.last_run


@pytest.mark.parametrize("path", list(PATHS))
def test_integer_sum_over_an_expanded_dim_is_exact(path):
    fd = _define("sum", [1], [False, True], DataType.Int)
    x = torch.randint(-1000, 1000, (6, 1)).expand(6, 1000)
    (out,) = fd.execute([x], options=PATHS[path])
    assert out.dtype == torch.int64 and torch.equal(out, x.sum(1))


@pytest.mark.parametrize("path", list(PATHS))
def test_expanded_dim_of_size_0(path):
    """A sum over an expanded dim of size 0 is 0 (torch's too); a max has no value and is
    refused before anything runs, as torch raises."""
    x = torch.randn(3, 1).expand(3, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # the fallback of an empty reduction warns
        (out,) = _define("sum", [1], [False, True]).execute([x], options=PATHS[path])
    torch.testing.assert_close(out, torch.zeros(3))
    with pytest.raises(InputError, match=r"max over a dim of size 0: T\d+ reduces dim 1 of T0"):
        _define("max", [1], [False, True]).execute([x], options=PATHS[path])

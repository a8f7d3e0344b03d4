"""Scalar expressions in generated kernels, on the GPU against float64. The interpreter
evaluates scalar expressions from the IR, not from the printed CUDA, so a printing bug shows
only here: a comparison of two Python numbers printed its operands in its bool output type
(`eq(0.25, 0.5)` became `true == true`; GPU fuzz cases 1:1033, 1:1068, 1:1557 were wrong)."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

COMPARES = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("op", COMPARES)
@pytest.mark.parametrize("a,b", [(0.25, 0.5), (0.5, 0.25), (0.5, 0.5), (-1.5, 0.0)])
def test_comparison_of_two_numbers_beside_a_tensor(op, a, b):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        s = getattr(fd.ops, op)(fd.define_scalar(a), fd.define_scalar(b))
        t = fd.ops.lt(x, 0.5)
        fd.add_output(fd.ops.logical_and(t, s))
        fd.add_output(fd.ops.logical_or(t, s))
        fd.add_output(fd.ops.where(s, x, fd.ops.neg(x)))
    run_and_check(fd, [torch.randn(37, 129, device="cuda")], scheduler="pointwise")


def test_comparisons_of_bools():
    """Case 1:1068: eq(b, b), ge(b, c) and a bool divided by a float, of bool tensors."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.ops.logical_and(fd.ops.le(x, 0.5), fd.ops.lt(fd.define_scalar(-0.75), 0.5))
        c = fd.ops.gt(x, -0.25)
        fd.add_output(fd.ops.sigmoid(fd.ops.eq(b, b)))
        fd.add_output(fd.ops.ge(b, c))
        fd.add_output(fd.ops.div(b, fd.ops.add(fd.ops.abs(x), 0.5)))
    run_and_check(fd, [torch.randn(137, 1284, device="cuda")], scheduler="pointwise")

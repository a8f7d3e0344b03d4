"""Operators on fusion tensors, as nvFuser's frontend has them: each calls the fd.ops op of the
FusionDefinition that owns the tensor, with its type promotion."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import BinaryOp, BinaryOpType
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


def test_arithmetic_comparison_and_logical_operators_match_torch():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        s = fd.define_scalar(0.5)
        z = (x + y) * 2 - x / (abs(y) + 1) + s * x + 1.5 ** x - y ** 2
        keep = (x < y) & ~(x >= 0.5) | (y > x) | (x <= -1)
        fd.add_output(fd.ops.where(keep, -z, z))
        fd.add_output(3 - x)
        fd.add_output(1 / (y * y + 1))
    x, y = torch.randn(7, 33), torch.randn(7, 33)
    run_and_check(fd, [x, y], scheduler="pointwise", options=INTERPRET)
    got = fd.execute([x, y], options=INTERPRET)
    z = (x + y) * 2 - x / (y.abs() + 1) + 0.5 * x + 1.5 ** x - y ** 2
    keep = (x < y) & ~(x >= 0.5) | (y > x) | (x <= -1)
    torch.testing.assert_close(got[0], torch.where(keep, -z, z))
    torch.testing.assert_close(got[1], 3 - x)
    torch.testing.assert_close(got[2], 1 / (y * y + 1))


def test_operators_promote_like_the_ops():
    with FusionDefinition() as fd:
        h = fd.define_tensor([-1], dtype=DataType.Half)
        i = fd.define_tensor([-1], dtype=DataType.Int32)
        assert (h + 1).dtype == DataType.Half
        assert (h + 1.5).dtype == DataType.Half
        assert (i * 2).dtype == DataType.Int32
        assert (i / 2).dtype == DataType.Float        # true division, as torch
        assert (h < i).dtype == DataType.Bool
        e = (h - 2).definition
        assert isinstance(e, BinaryOp) and e.op == BinaryOpType.Sub
        fd.add_output(h * i)


def test_equality_stays_identity():
    """`==` compares tensors as objects (the compiler keys dicts on them); values are compared
    with fd.ops.eq."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        y = fd.define_tensor([-1], dtype=DataType.Float)
        assert x == x and x != y and {x: 1}[x] == 1
        fd.add_output(x + y)


def test_operators_after_the_definition_are_a_clear_error():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(x + 1)
    with pytest.raises(FusionDefinitionError, match="ops.add"):
        x + 1

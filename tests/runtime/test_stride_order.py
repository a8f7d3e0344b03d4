"""fd.ops.stride_order(t, order): an output's memory order (nvFuser's spelling: order[k] is the
stride rank of dim k, rank-1 outermost), honoured by output allocation, the kernels writing
it (on the interpreter), and the reference evaluator."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


def _strides_for(shape, order):
    """Dense strides of `shape` laid out by stride ranks `order`."""
    strides = [0] * len(shape)
    acc = 1
    for k in sorted(range(len(shape)), key=lambda k: order[k]):
        strides[k] = acc
        acc *= shape[k]
    return tuple(strides)


def test_channels_last_output_on_the_interpreter():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16)
        b = fd.define_tensor([1, -1, 1, 1], dtype=DataType.BFloat16)
        y = fd.ops.gelu(fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.cast(b, DataType.Float)))
        fd.add_output(fd.ops.stride_order(fd.ops.cast(y, DataType.BFloat16), [3, 0, 2, 1]))
    xs, bs = torch.randn(2, 5, 3, 7).bfloat16(), torch.randn(1, 5, 1, 1).bfloat16()
    (out,) = run_and_check(fd, [xs, bs], scheduler="transpose", options=INTERPRET)
    assert out.stride() == (105, 1, 35, 5)
    assert out.is_contiguous(memory_format=torch.channels_last)
    ref = evaluate(fd.fusion, [xs, bs], promote_to_double=True)[0]
    assert ref.stride() == (105, 1, 35, 5)


@pytest.mark.parametrize("order", [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]])
def test_any_order_beside_a_row_major_output(order):
    """A permuted output beside a row-major one of the same values, with the permuted copy
    also read again by a later op."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)
        y = fd.ops.mul(fd.ops.exp(x), 2.0)
        z = fd.ops.stride_order(y, order)
        fd.add_output(z)
        fd.add_output(fd.ops.add(z, 1.0))
    xs = torch.randn(3, 4, 5)
    # z runs along another dim than x unless order keeps dim 2 innermost: then a transpose.
    z, w = run_and_check(fd, [xs], scheduler="pointwise" if order[2] == 0 else "transpose",
                         options=INTERPRET)
    assert z.stride() == _strides_for((3, 4, 5), order)
    assert w.stride() == (20, 5, 1)


def test_stride_order_of_a_reduction_result():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)
        s = fd.ops.sum(x, [2])
        fd.add_output(fd.ops.stride_order(s, [0, 1]))          # [M, N] stored column-major
    xs = torch.randn(6, 9, 33)
    (out,) = run_and_check(fd, [xs], options=INTERPRET)
    assert out.stride() == (1, 6)


def test_stride_order_on_the_reference_path():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.stride_order(fd.ops.neg(x), [3, 0, 2, 1]))
    xs = torch.randn(2, 3, 4, 5)
    (out,) = fd.execute([xs])
    assert fd.last_run.kind == "reference"
    assert out.stride() == (60, 1, 15, 3) and torch.equal(out, -xs)


def test_identity_and_empty_orders_are_plain_copies():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        a = fd.ops.stride_order(x, [1, 0])
        b = fd.ops.stride_order(x, [])
        fd.add_output(a)
        fd.add_output(b)
    assert a.domain.allocation is None and b.domain.allocation is None


def test_stride_order_errors():
    for order, what in [([0, 1], "2 entries for T0 of rank 3"),
                        ([0, 1, 1], "not a permutation")]:
        with pytest.raises(FusionDefinitionError, match=what):
            with FusionDefinition() as fd:
                x = fd.define_tensor([-1, -1, -1])
                fd.add_output(fd.ops.stride_order(x, order))

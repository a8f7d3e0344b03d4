"""The shared vector-width rules of the schedulers (schedulers/base.py): each tensor's access
width from its own dtype (16 bytes at most), only along its stride-1 dim, narrower or
element-wise where it cannot take the scheduled width."""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import ParallelType as PT
from pyfuser.ir.id_graph import IdGraph
from pyfuser.schedule import cache_after
from pyfuser.schedule.schedulers.base import (InputFacts, access_width, input_vector_problems,
                                              input_vector_width, mapped_dim, vectorize)

D = DataType


@pytest.mark.parametrize("dtype,width,expect", [
    (D.BFloat16, 8, 8), (D.Float, 8, 4), (D.Int, 8, 2), (D.Bool, 8, 8), (D.Bool, 32, 16),
    (D.Float, 2, 2), (D.Double, 4, 2), (D.Half, 1, 1)])
def test_access_width_is_at_most_16_bytes_of_the_dtype(dtype, width, expect):
    assert access_width(dtype, width) == expect


def _copy(shape=(-1, -1), dtype=D.Float, stride_order=None):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), dtype=dtype, stride_order=stride_order)
        fd.add_output(fd.ops.set(x))
    return fd.fusion, fd.fusion.inputs[0], fd.fusion.outputs[0]


def test_vectorize_splits_an_axis_wider_than_16_bytes():
    _, _, y = _copy(dtype=D.Float)
    y.split(1, 8)                                   # a loop vectorized for bf16 elsewhere
    assert vectorize(y, -1) == 4
    assert [i.const_extent for i in y.loop[1:]] == [None, 2, 4]
    assert [i.parallel_type for i in y.loop] == [PT.Serial] * 3 + [PT.Vectorize]


@pytest.mark.parametrize("width,extents", [(8, [8]), (4, [2, 4]), (1, [8])])
def test_vectorize_takes_the_width_asked(width, extents):
    _, _, y = _copy(dtype=D.BFloat16)
    y.split(1, 8)
    assert vectorize(y, 2, width) == width
    assert [i.const_extent for i in y.loop[2:]] == extents
    assert (y.loop[-1].parallel_type == PT.Vectorize) == (width > 1)


def test_vectorize_leaves_a_broadcast_axis_element_wise():
    # A per-row statistic [M, 1] that took the row's vector split on its broadcast dim.
    _, _, y = _copy(shape=(-1, 1))
    y.split(1, 8)
    assert vectorize(y, -1) == 1
    assert all(i.parallel_type == PT.Serial for i in y.loop)


def test_vectorize_follows_the_stride_order_of_an_input():
    f, x, _ = _copy(stride_order=[0, 1])            # dim 0 innermost in memory
    c = cache_after(x)
    c.split(1, 4)
    assert vectorize(c, -1) == 1                    # lanes along dim 1: a row apart
    c.domain.loop = list(c.logical)
    c.split(0, 4).reorder({1: 2}).parallelize(1, PT.TIDx)
    assert vectorize(c, -1) == 4


def test_vectorize_leaves_an_axis_of_runtime_extent_alone():
    _, _, y = _copy()
    assert vectorize(y, -1) == 1 and y.loop[-1].parallel_type == PT.Serial


def _facts(sizes, strides, alignment=16):
    return InputFacts(tuple(sizes), tuple(strides), alignment)


@pytest.mark.parametrize("sizes,strides,alignment,expect", [
    ((4, 64), (64, 1), 16, 4),
    ((4, 64), (64, 1), 8, 1),             # pointer 8 bytes off 16
    ((4, 64), (66, 1), 16, 1),            # rows start off a vector
    ((4, 62), (64, 1), 16, 1),            # a row of 62 is no whole number of 4-vectors
    ((4, 8), (32, 4), 16, 1),             # every 4th element: stride 4 along the row
    ((1, 64), (7, 1), 16, 4),             # the stride of a size-1 dim does not matter
    ((4, 64), (0, 1), 16, 4),             # an expanded outer dim (stride 0)
])
def test_input_vector_width_of_a_float_input(sizes, strides, alignment, expect):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, False])
        fd.add_output(fd.ops.set(x))
    v = fd.fusion.inputs[0]
    assert input_vector_width(v, _facts(sizes, strides, alignment), 1, 8) == expect
    assert input_vector_width(v, _facts(sizes, strides, alignment), 0, 8) == 1   # not stride-1


def test_input_vector_width_of_wider_and_narrower_dtypes():
    for dtype, expect in [(D.Int, 2), (D.BFloat16, 8), (D.Bool, 8)]:
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=dtype)
            fd.add_output(fd.ops.set(x))
        v = fd.fusion.inputs[0]
        assert input_vector_width(v, _facts((4, 64), (64, 1)), 1, 8) == expect


def test_input_vector_problems_name_the_stride_1_dim():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, False], stride_order=[0, 1])
        fd.add_output(fd.ops.set(x))
    v = fd.fusion.inputs[0]
    assert input_vector_problems(v, _facts((6, 5), (1, 6)), 2) == []
    assert input_vector_problems(v, _facts((6, 5), (1, 7)), 2) == [
        "its strides (1, 7) are not multiples of 2"]
    assert input_vector_problems(v, _facts((6, 5), (2, 12), 4), 2) == [
        "its dim 0, innermost in memory, has stride 2, not 1",
        "its data pointer is not 8-byte aligned"]
    with FusionDefinition() as fd:
        b = fd.define_tensor([1])
        fd.add_output(fd.ops.set(b))
    assert input_vector_problems(fd.fusion.inputs[0], _facts((1,), (1,)), 4) == [
        "every dim is a broadcast (one element, no run of elements to read)"]


def test_mapped_dim_skips_broadcasts():
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1]), fd.define_tensor([1])
        w = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(w, fd.ops.maximum(a, b)))
    a, b, w = fd.fusion.inputs
    graph = IdGraph(fd.fusion)
    out = fd.fusion.outputs[0]
    assert mapped_dim(a, out.logical[1], graph) == 0
    assert mapped_dim(b, out.logical[1], graph) is None      # [1]: one element for all
    assert mapped_dim(a, out.logical[0], graph) is None      # a lacks that dim
    assert mapped_dim(w, out.logical[0], graph) == 0

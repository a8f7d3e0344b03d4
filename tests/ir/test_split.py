"""TensorView.split: inner/outer, divisible or not, extents, Split exprs, symbolic extents."""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import IterType, ParallelType, ScheduleError, Split
from pyfuser.ir.printer import tv_str, tv_transforms_str


def _pointwise(shape, dtype=DataType.Float):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape, dtype=dtype)
        y = fd.ops.exp(x)
        fd.add_output(y)
    return fd, x, y


def _row_sum(shape=(-1, -1)):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape))
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    return fd, x, s


def test_inner_split_divisible():
    _, _, y = _pointwise([1024, 64])
    i0 = y.loop[0]
    y.split(0, 128)
    outer, inner = y.loop[0], y.loop[1]
    assert [i.const_extent for i in y.loop] == [8, 128, 64]
    split = outer.definition
    assert isinstance(split, Split) and split is inner.definition
    assert split.in_id is i0 and split.outer is outer and split.inner is inner
    assert split.inner_split is True and split.factor.value == 128
    assert split.is_divisible
    # The logical domain is untouched; the loop domain derives from it.
    assert y.logical[0] is i0 and len(y.logical) == 2
    assert y.loop[2] is y.logical[1]


def test_inner_split_not_divisible_rounds_up():
    _, _, y = _pointwise([1000, 64])
    y.split(0, 128)
    assert [i.const_extent for i in y.loop] == [8, 128, 64]
    assert not y.loop[0].definition.is_divisible


def test_outer_split_gives_factor_to_outer():
    _, _, y = _pointwise([1000, 64])
    y.split(1, 16, inner_split=False)
    outer, inner = y.loop[1], y.loop[2]
    assert (outer.const_extent, inner.const_extent) == (16, 4)
    assert outer.definition.inner_split is False and outer.definition.is_divisible
    y.split(0, 3, inner_split=False)
    assert [i.const_extent for i in y.loop[:2]] == [3, 334]
    assert not y.loop[0].definition.is_divisible


def test_symbolic_extent_prints_as_ceildiv():
    _, _, y = _pointwise([-1, -1])
    y.split(1, 128)
    assert tv_str(y) == "T1_g_float[iS2{i0}, iS4{ceilDiv(i1, 128)}, iS5{128}]"
    assert y.loop[1].const_extent is None and y.loop[2].const_extent == 128
    y.split(0, 4, inner_split=False)
    assert tv_str(y) == ("T1_g_float[iS6{4}, iS7{ceilDiv(i0, 4)}, iS4{ceilDiv(i1, 128)}, "
                         "iS5{128}]")
    assert not y.loop[1].definition.is_divisible  # unknown extent: not known to divide
    text = tv_transforms_str(y)
    assert "Split: iS3{i1} by 128 (inner) -> iS4{ceilDiv(i1, 128)}, iS5{128}" in text
    assert "Split: iS2{i0} by 4 (outer) -> iS6{4}, iS7{ceilDiv(i0, 4)}" in text


def test_split_negative_axis_and_nested_split():
    _, _, y = _pointwise([4096, 8])
    y.split(-2, 2)
    y.split(0, 132)
    assert [i.const_extent for i in y.loop] == [16, 132, 2, 8]
    assert y.loop[0].definition.in_id.definition.in_id is y.logical[0]


def test_split_of_reduction_keeps_iteration_type():
    _, _, s = _row_sum()
    s.split(1, 128)
    s.split(0, 2)
    assert [i.iter_type for i in s.loop] == [IterType.Iteration, IterType.Iteration,
                                            IterType.Reduction, IterType.Reduction]
    assert tv_str(s) == ("T1_g_float[iS6{ceilDiv(i0, 2)}, iS7{2}, rS4{ceilDiv(i1, 128)}, "
                         "rS5{128}]")


def test_split_of_broadcast_stays_broadcast():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1])
        fd.add_output(fd.ops.exp(x))
    y = fd.fusion.outputs[0]
    y.split(1, 4)
    assert all(i.is_broadcast for i in y.loop[1:])
    assert y.loop[1].const_extent == 1


@pytest.mark.parametrize("factor", [0, -2, 1.5])
def test_bad_factor_raises(factor):
    _, _, y = _pointwise([-1, -1])
    with pytest.raises(ScheduleError, match=r"split on T1: axis 1: factor must be a positive"):
        y.split(1, factor)
    assert len(y.loop) == 2


def test_out_of_range_axis_raises():
    _, _, y = _pointwise([-1, -1])
    with pytest.raises(ScheduleError, match=r"split on T1: axis 2 is out of range for 2 loop axes"):
        y.split(2, 4)
    with pytest.raises(ScheduleError, match=r"axis -3 is out of range"):
        y.split(-3, 4)


def test_split_of_parallelized_axis_raises():
    _, _, y = _pointwise([-1, -1])
    y.parallelize(1, ParallelType.TIDx)
    with pytest.raises(ScheduleError, match=r"split on T1: axis 1 \(iTIDx3\{i1\}\) is already "
                                            r"parallelized as TIDx"):
        y.split(1, 32)


def test_split_left_of_compute_at_raises():
    from pyfuser.schedule import inline_at
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    inline_at(a, 1)
    with pytest.raises(ScheduleError, match=r"split on T1: axis 0 is left of the compute-at "
                                            r"position 1"):
        a.split(0, 4)
    out = fd.fusion.outputs[0]
    with pytest.raises(ScheduleError, match=r"split on T2: axis 0 is left of position 1 where a "
                                            r"producer is inlined"):
        out.split(0, 4)
    a.split(1, 4)  # right of the compute-at position: fine
    assert len(a.loop) == 3

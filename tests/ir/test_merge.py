"""TensorView.merge: extents, Merge exprs, broadcast with iteration, illegal merges."""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import IterType, Merge, ParallelType, ScheduleError
from pyfuser.ir.printer import tv_str


def _pointwise(shape):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
    return fd.fusion.outputs[0]


def test_merge_static_extents():
    y = _pointwise([4, 6, 8])
    a, b, c = y.loop
    y.merge(0)
    assert len(y.loop) == 2 and y.loop[1] is c
    m = y.loop[0]
    assert m.const_extent == 24 and m.iter_type == IterType.Iteration
    assert isinstance(m.definition, Merge)
    assert m.definition.outer is a and m.definition.inner is b and m.definition.out is m


def test_merge_symbolic_extent_prints_product():
    y = _pointwise([-1, -1])
    y.merge(0, 1)
    assert tv_str(y) == "T1_g_float[iS4{(i0 * i1)}]"
    y.split(0, 128)
    assert tv_str(y) == "T1_g_float[iS5{ceilDiv((i0 * i1), 128)}, iS6{128}]"


def test_merge_non_adjacent_axes():
    y = _pointwise([2, 3, 5])
    a, b, c = y.loop
    y.merge(0, 2)
    assert y.loop[0].definition.outer is a and y.loop[0].definition.inner is c
    assert [i.const_extent for i in y.loop] == [10, 3] and y.loop[1] is b


def test_merge_negative_axes():
    y = _pointwise([2, 3, 5])
    y.merge(-2, -1)
    assert [i.const_extent for i in y.loop] == [2, 15]


def test_merge_broadcast_with_iteration():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(x, b))
    bt = fd.fusion.outputs[0].definition.inputs[1]  # b broadcast to [1, N]
    assert bt.loop[0].is_broadcast
    bt.merge(0)
    m = bt.loop[0]
    # A broadcast contributes extent 1: the merged ID iterates b's N, and is an iteration.
    assert m.iter_type == IterType.Iteration
    assert m.extent is bt.logical[1].extent
    assert tv_str(bt) == "T2_l_float[iS7{i2}]"


def test_merge_two_broadcasts_is_broadcast():
    y = _pointwise([1, 1, -1])
    y.merge(0)
    assert y.loop[0].is_broadcast and y.loop[0].const_extent == 1


def test_merge_reductions():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.sum(x, [1, 2]))
    s = fd.fusion.outputs[0]
    s.merge(1)
    assert s.loop[1].iter_type == IterType.Reduction
    assert tv_str(s) == "T1_g_float[iS3{i0}, rS6{(i1 * i2)}]"


def test_merge_iteration_with_reduction_raises_naming_tensor_axis_rule():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
    s = fd.fusion.outputs[0]
    with pytest.raises(ScheduleError) as e:
        s.merge(0, 1)
    msg = str(e.value)
    assert msg.startswith("merge on T1:")
    assert "axes 0 (iS2{i0}) and 1 (rS3{i1})" in msg
    assert "mix an iteration and a reduction ID" in msg
    assert len(s.loop) == 2  # nothing changed


def test_merge_with_itself_and_out_of_range_raise():
    y = _pointwise([-1, -1])
    with pytest.raises(ScheduleError, match=r"merge on T1: cannot merge axis 1 with itself"):
        y.merge(1, 1)
    y.merge(0)
    assert len(y.loop) == 1
    with pytest.raises(ScheduleError, match=r"merge on T1: axis 1 is out of range for 1 loop"):
        y.merge(0)


def test_merge_parallelized_axis_raises():
    y = _pointwise([-1, -1])
    y.parallelize(0, ParallelType.BIDx)
    with pytest.raises(ScheduleError, match=r"merge on T1: axis 0 \(iBIDx2\{i0\}\) is already "
                                            r"parallelized as BIDx"):
        y.merge(0)

"""TensorView.parallelize: each rule, and errors naming T<n>, the axis and the rule."""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import LoadKind, ParallelType, ScheduleError
from pyfuser.ir.printer import tv_str
from pyfuser.schedule import cache_after

P = ParallelType


def _pointwise(shape=(-1, -1), dtype=DataType.Float):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), dtype=dtype)
        fd.add_output(fd.ops.set(x))
    return fd, x, fd.fusion.outputs[0]


@pytest.mark.parametrize("ptype", [P.BIDx, P.BIDy, P.BIDz, P.TIDx, P.TIDy, P.TIDz, P.Serial,
                                   P.Unroll, P.Unswitch])
def test_thread_block_and_loop_types_bind(ptype):
    _, _, y = _pointwise()
    y.parallelize(0, ptype)
    assert y.loop[0].parallel_type is ptype
    assert y.loop[1].parallel_type is P.Serial


def test_printed_parallel_types():
    _, _, y = _pointwise()
    y.split(1, 4)
    y.parallelize(0, P.BIDx).parallelize(1, P.TIDx).parallelize(2, P.Vectorize)
    assert tv_str(y) == "T1_g_float[iBIDx2{i0}, iTIDx4{ceilDiv(i1, 4)}, iV5{4}]"


@pytest.mark.parametrize("dtype, width, ok", [
    (DataType.Float, 4, True), (DataType.Float, 8, False), (DataType.Half, 8, True),
    (DataType.BFloat16, 16, False), (DataType.Double, 2, True), (DataType.Double, 4, False),
    (DataType.Bool, 16, True), (DataType.Float, 1, True), (DataType.Half, 16, False),
])
def test_vectorize_width_times_dtype_bytes_at_most_16(dtype, width, ok):
    _, _, y = _pointwise(dtype=dtype)
    y.split(1, width)
    if ok:
        y.parallelize(2, P.Vectorize)
        assert y.loop[2].parallel_type is P.Vectorize
    else:
        with pytest.raises(ScheduleError) as e:
            y.parallelize(2, P.Vectorize)
        assert str(e.value) == (f"parallelize on T1: axis 2 (iS5{{{width}}}) as V: {width} x "
                                f"{dtype.size} bytes exceeds a 16-byte access")
        assert y.loop[2].parallel_type is P.Serial


@pytest.mark.parametrize("width", [3, 6, 12, 32])
def test_vectorize_width_must_be_power_of_two_up_to_16(width):
    _, _, y = _pointwise(dtype=DataType.Bool)
    y.split(1, width)
    with pytest.raises(ScheduleError, match=rf"parallelize on T1: axis 2 \(iS5\{{{width}\}}\) as V: "
                                            rf"vector width {width} is not 1, 2, 4, 8 or 16"):
        y.parallelize(2, P.Vectorize)


def test_vectorize_needs_constant_extent():
    _, _, y = _pointwise()
    with pytest.raises(ScheduleError, match=r"parallelize on T1: axis 1 \(iS3\{i1\}\) as V: a "
                                            r"vectorized axis needs a constant extent"):
        y.parallelize(1, P.Vectorize)


def test_vectorize_must_be_innermost_serial_axis():
    _, _, y = _pointwise()
    y.split(1, 4).reorder({2: 1})                  # [i0, 4, ceilDiv(i1, 4)]
    with pytest.raises(ScheduleError, match=r"axis 1 \(iS5\{4\}\) as V: only axes right of a "
                                            r"vectorized axis"):
        y.parallelize(1, P.Vectorize)
    # Right of it only parallel axes or extent 1: then it may be vectorized.
    y.parallelize(2, P.TIDx)
    y.parallelize(1, P.Vectorize)
    assert y.loop[1].parallel_type is P.Vectorize


def _contiguity_error(tv, axis, stepped, inner):
    return (f"parallelize on T{tv.name}: axis {axis} ({tv.loop[axis]!r}) as V: the axis {stepped}, "
            f"but the innermost allocated dim is {inner}; a vector access must be contiguous "
            "in memory")


def test_vectorize_along_a_dim_that_is_not_innermost_in_memory_refused():
    # Lanes of the split of i0 are i1 elements apart in memory: not one vector access.
    _, _, y = _pointwise()
    y.split(0, 4).reorder({1: 2})                  # [ceilDiv(i0, 4), i1, 4]
    y.parallelize(1, P.TIDx)
    with pytest.raises(ScheduleError) as e:
        y.parallelize(2, P.Vectorize)
    assert str(e.value) == _contiguity_error(y, 2, "steps through iS2{i0}", "iTIDx3{i1}")
    assert y.loop[2].parallel_type is P.Serial


def test_vectorize_follows_the_allocation_order_not_the_logical_order():
    # A channels-last style input: dim 0 is innermost in memory (stride_order rank 0).
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], stride_order=[0, 1])
        fd.add_output(fd.ops.set(x))
    c = cache_after(fd.fusion.inputs[0])          # inherits the input's allocation order
    c.split(1, 4)
    with pytest.raises(ScheduleError, match=r"steps through iS\d+\{i1\}, but the innermost "
                                            r"allocated dim is iS\d+\{i0\}"):
        c.parallelize(2, P.Vectorize)
    c.domain.loop = list(c.logical)
    c.split(0, 4).reorder({1: 2}).parallelize(1, P.TIDx)
    c.parallelize(2, P.Vectorize)
    assert c.loop[2].parallel_type is P.Vectorize


def test_vectorize_the_outer_part_of_a_split_refused():
    _, _, y = _pointwise()
    y.split(1, 4, inner_split=False)               # [i0, 4, ceilDiv(i1, 4)]: lanes jump
    y.parallelize(2, P.TIDx)
    with pytest.raises(ScheduleError, match="does not step through one allocated dim element by "
                                            "element, but the innermost allocated dim is iS3"):
        y.parallelize(1, P.Vectorize)


def test_vectorize_a_merge_whose_inner_dim_is_innermost():
    _, _, y = _pointwise([-1, -1, -1])
    y.merge(1, 2).merge(0, 1).split(0, 4)          # [ceilDiv(i0 * i1 * i2, 4), 4]
    y.parallelize(1, P.Vectorize)
    assert y.loop[1].parallel_type is P.Vectorize


def test_vectorize_along_a_broadcast_dim_refused():
    # A per-row statistic [M, 1] whose loop took a row's vector split on its broadcast dim.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1])
        fd.add_output(fd.ops.set(x))
    y = fd.fusion.outputs[0]
    y.split(1, 4)
    with pytest.raises(ScheduleError, match=r"axis 2 \(bS5\{4\}\) as V: the axis steps through "
                                            r"bS3\{1\}, but the innermost allocated dim is iS2"):
        y.parallelize(2, P.Vectorize)


def test_vectorize_when_every_dim_is_a_broadcast_refused():
    with FusionDefinition() as fd:
        x = fd.define_tensor([1])
        fd.add_output(fd.ops.set(x))
    y = fd.fusion.outputs[0]
    y.split(0, 4)
    with pytest.raises(ScheduleError, match="every allocated dim is a broadcast"):
        y.parallelize(1, P.Vectorize)


def test_vectorize_reduction_axis_refused():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
    s = fd.fusion.outputs[0]
    s.split(1, 4)
    with pytest.raises(ScheduleError, match=r"parallelize on T1: axis 2 \(rS5\{4\}\) as V: a "
                                            r"reduction axis cannot be vectorized"):
        s.parallelize(2, P.Vectorize)


def test_one_vectorized_axis_per_tensor():
    _, _, y = _pointwise([-1, 8, 4])
    y.parallelize(2, P.Vectorize)
    with pytest.raises(ScheduleError, match=r"parallelize on T1: axis 1 \(iS4\{8\}\) as V: axis 2 "
                                            r"is already V"):
        y.parallelize(1, P.Vectorize)


@pytest.mark.parametrize("ptype", [P.TIDx, P.BIDy])
def test_thread_dim_used_once_per_tensor(ptype):
    _, _, y = _pointwise([-1, -1, -1])
    y.parallelize(0, ptype)
    with pytest.raises(ScheduleError) as e:
        y.parallelize(2, ptype)
    assert str(e.value).startswith(f"parallelize on T1: axis 2 (iS5{{i2}}) as {ptype.short}: "
                                   f"axis 0 is already {ptype.short}")
    assert y.loop[2].parallel_type is P.Serial
    y.parallelize(0, ptype)  # re-binding the same axis is fine
    y.parallelize(0, P.Serial)
    y.parallelize(2, ptype)
    assert y.loop[2].parallel_type is ptype


@pytest.mark.parametrize("kind", [LoadKind.TmaBulk, LoadKind.TmaTensor])
def test_bulk_on_tma_load(kind):
    _, x, _ = _pointwise()
    c = cache_after(x, kind)
    c.parallelize(1, P.Bulk)
    assert c.loop[1].parallel_type is P.Bulk
    assert tv_str(c) == "T2_s_float[iS4{i0}, iB5{i1}]"


@pytest.mark.parametrize("kind", [LoadKind.Set, LoadKind.CpAsync])
def test_bulk_refused_on_other_loads(kind):
    _, x, _ = _pointwise()
    c = cache_after(x, kind)
    with pytest.raises(ScheduleError, match=r"parallelize on T2: axis 1 \(iS5\{i1\}\) as B: Bulk "
                                            r"is only for the output of a TMA load"):
        c.parallelize(1, P.Bulk)


def test_bulk_refused_on_compute_and_inputs():
    _, x, y = _pointwise()
    for tv, name in ((y, "T1"), (x, "T0")):
        with pytest.raises(ScheduleError, match=rf"parallelize on {name}: axis 0 .* as B: Bulk"):
            tv.parallelize(0, P.Bulk)


def test_group_on_reduction_output_only():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(x)
        fd.add_output(fd.ops.sum(e, [1]))
    s = fd.fusion.outputs[0]
    s.split(0, 4)
    s.parallelize(1, P.Group)
    assert s.loop[1].parallel_type is P.Group
    with pytest.raises(ScheduleError, match=r"parallelize on T1: axis 1 \(iS3\{i1\}\) as G: Group "
                                            r"is for the iteration axes of a reduction"):
        e.parallelize(1, P.Group)


def test_out_of_range_axis():
    _, _, y = _pointwise()
    with pytest.raises(ScheduleError, match=r"parallelize on T1: axis 5 is out of range"):
        y.parallelize(5, P.TIDx)

"""rfactor: the partial and final reductions' domains, and illegal calls."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir import IterType, ParallelType, ReductionOp, ScheduleError
from pyfuser.ir.printer import tv_str
from pyfuser.ir.verifier import verify
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule import inline_at, rfactor

R, I = IterType.Reduction, IterType.Iteration


def _sum(rank=2, dims=(1,), op="sum"):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank)
        fd.add_output(getattr(fd.ops, op)(x, list(dims)))
    return fd, x, fd.fusion.outputs[0]


def test_rfactor_inner_split():
    fd, x, s = _sum()
    i0, r1 = s.logical
    s.split(1, 128)
    s.parallelize(2, ParallelType.TIDx)
    rf = rfactor(s, [1])
    # Partial: root = (i0, r1); logical = (i0, r1o, i1i): it reduces r1o and keeps 128 lanes.
    assert [i.iter_type for i in rf.domain.root] == [I, R]
    assert [i.iter_type for i in rf.logical] == [I, R, I]
    assert rf.loop == rf.logical
    assert tv_str(rf) == "T2_l_float[iS6{i0}, rS8{ceilDiv(i1, 128)}, iTIDx9{128}]"
    split = rf.logical[1].definition
    assert split.in_id is rf.domain.root[1] and split.factor.value == 128
    assert rf.logical[2].is_rfactor_product and rf.logical[1].is_rfactor_product
    # Final: reduces the 128 lanes, keeps the thread binding.
    assert s.domain.root is None
    assert [i.iter_type for i in s.logical] == [I, R]
    assert tv_str(s) == "T1_g_float[iS10{i0}, rTIDx11{128}]"
    # Graph: x -> rf -> s.
    assert isinstance(rf.definition, ReductionOp) and rf.definition.inputs == [x]
    assert isinstance(s.definition, ReductionOp) and s.definition.inputs == [rf]
    assert x.uses == [rf.definition] and fd.fusion.outputs == [s]
    verify(fd.fusion)


def _check_values(fd, shape, reduce):
    X = torch.randn(*shape)
    (out,) = evaluate(fd.fusion, [X])
    torch.testing.assert_close(out, reduce(X))


def test_rfactor_computes_the_same_non_divisible():
    fd, x, s = _sum()
    s.split(1, 128)
    rfactor(s, [1])
    _check_values(fd, (5, 300), lambda X: X.sum(1))  # 300 = 2 * 128 + 44: padded


def test_rfactor_max_pads_with_init():
    fd, x, s = _sum(op="max")
    s.split(1, 32)
    rfactor(s, [2])
    X = -torch.rand(3, 70) - 1  # all negative: zero padding would be wrong
    (out,) = evaluate(fd.fusion, [X])
    torch.testing.assert_close(out, X.amax(1))


def test_rfactor_of_merged_reduction_outer_split():
    fd, x, s = _sum(3, (1, 2))
    i0, r1, r2 = s.logical
    s.merge(1, 2)
    s.split(1, 32)
    s.split(1, 4, inner_split=False)  # loop (i0, r4, r{ceil(ceil(n/32)/4)}, r32)
    rf = rfactor(s, [1, 3])
    # Each reduction leaf appears once in the partial's logical domain.
    assert len(rf.logical) == 4 and len(set(rf.logical)) == 4
    assert [i.iter_type for i in rf.logical] == [I, R, I, R]
    assert [i.const_extent for i in rf.logical] == [None, 4, None, 32]
    assert [i.iter_type for i in rf.domain.root] == [I, R, R]
    assert [i.iter_type for i in s.logical] == [I, R] and len(s.loop) == 2
    assert s.logical[1].extent is rf.logical[2].extent
    verify(fd.fusion)
    _check_values(fd, (3, 7, 50), lambda X: X.sum((1, 2)))


def test_rfactor_keeps_iteration_transforms():
    fd, x, s = _sum()
    s.split(0, 2)
    s.split(2, 16)
    rf = rfactor(s, [3])
    assert [i.iter_type for i in rf.loop] == [I, I, I, R]
    assert [i.const_extent for i in rf.loop] == [None, 2, None, 16]
    assert [i.iter_type for i in s.loop] == [I, I, R]
    assert s.loop[1].const_extent == 2
    verify(fd.fusion)
    _check_values(fd, (9, 40), lambda X: X.sum(1))


def test_rfactor_errors():
    fd, x, s = _sum()
    with pytest.raises(ScheduleError, match=r"rfactor on T0: it is not the output of a reduction"):
        rfactor(x, [0])
    with pytest.raises(ScheduleError, match=r"rfactor on T1: rfactoring every reduction axis "
                                            r"leaves nothing"):
        rfactor(s, [1])
    s.split(1, 4)
    with pytest.raises(ScheduleError, match=r"rfactor on T1: axis 0 \(iS2\{i0\}\) is not a "
                                            r"reduction axis"):
        rfactor(s, [0])
    with pytest.raises(ScheduleError, match=r"rfactor on T1: axis 5 out of range for 3 loop axes"):
        rfactor(s, [5])
    with pytest.raises(ScheduleError, match=r"leaves nothing"):
        rfactor(s, [1, 2])
    assert s.definition.inputs == [x]  # nothing changed


def test_rfactor_after_inlining_refused():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.ops.sum(x, [1])
        fd.add_output(fd.ops.neg(s))
    s.split(1, 4)
    inline_at(s, 1)
    with pytest.raises(ScheduleError, match=r"rfactor on T1: call rfactor before inlining"):
        rfactor(s, [1])

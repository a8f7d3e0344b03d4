"""inline_at / inline_most / max_inline_position: compute-at positions and their limits."""
import pytest

from pyfuser import FusionDefinition
from pyfuser.ir import ParallelType, ScheduleError
from pyfuser.schedule import (inline_at, inline_most, max_inline_position,
                              propagate_transforms)


def _chain():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        b = fd.ops.neg(a)
        fd.add_output(fd.ops.abs(b))
    return fd, x, a, b, fd.fusion.outputs[0]


def _norm():
    """x -> e = exp(x) -> s = sum(e, 1) -> sb = broadcast(s) -> y = e / sb."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(x)
        s = fd.ops.sum(e, [1], keepdim=True)
        y = fd.ops.div(e, s)
        fd.add_output(y)
    sb = y.definition.inputs[1]
    red = sb.definition.inputs[0]
    return fd, x, e, red, sb, y


def test_inline_at_sets_positions():
    fd, x, a, b, out = _chain()
    inline_at(a, 1)
    assert a.compute_at_pos == 1 and b.max_producer_pos == 1
    inline_at(b, 2)
    assert b.compute_at_pos == 2 and out.max_producer_pos == 2
    inline_at(a, -1)  # -1: all loops
    assert a.compute_at_pos == 2 and b.max_producer_pos == 2


def test_inline_at_out_of_range():
    fd, x, a, b, out = _chain()
    with pytest.raises(ScheduleError, match=r"inline_at on T1: position 3 is out of range 0\.\.2"):
        inline_at(a, 3)
    assert a.compute_at_pos == 0


def test_inline_most_pointwise_chain_inlines_fully():
    fd, x, a, b, out = _chain()
    inline_most(fusion=fd.fusion)
    assert (x.compute_at_pos, a.compute_at_pos, b.compute_at_pos, out.compute_at_pos) == (0, 2, 2, 0)
    assert max_inline_position(x) == (0, "fusion inputs are not computed")
    assert max_inline_position(out) == (0, "no consumer")


def test_inline_most_after_split_and_propagation():
    fd, x, a, b, out = _chain()
    out.merge(0)
    out.split(0, 128)
    propagate_transforms(out)
    inline_most(fusion=fd.fusion)
    assert a.compute_at_pos == 2 and b.compute_at_pos == 2


def test_reduction_axis_stops_inlining():
    fd, x, e, red, sb, y = _norm()
    pos, why = max_inline_position(red)
    assert pos == 1 and "axis 1 is a reduction" in why
    with pytest.raises(ScheduleError) as err:
        inline_at(red, 2)
    msg = str(err.value)
    assert msg.startswith(f"inline_at on T{red.name}: position 2 is past the legal limit 1")
    assert "axis 1 is a reduction" in msg
    assert red.compute_at_pos == 0


def test_norm_pattern_keeps_producer_resident():
    # e feeds the reduction and, directly, y (computed after the reduction): e's row must stay
    # allocated across the reduction's loop, so it can share only the row loop.
    fd, x, e, red, sb, y = _norm()
    pos, why = max_inline_position(e)
    assert pos == 1
    assert f"T{e.name} stays resident" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{e.name}: position 2 is past the "
                                            r"legal limit 1"):
        inline_at(e, 2)
    inline_most(fusion=fd.fusion)
    assert e.compute_at_pos == 1
    assert red.compute_at_pos == 1
    assert sb.compute_at_pos == 2  # the broadcast of the result is computed inside y's loops
    assert y.max_producer_pos == 2


def test_norm_pattern_after_split_still_max_one():
    fd, x, e, red, sb, y = _norm()
    red.split(1, 128)
    propagate_transforms(red)
    assert max_inline_position(e)[0] == 1
    assert max_inline_position(red)[0] == 1


def test_producer_of_reduction_alone_inlines_fully():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(x)
        fd.add_output(fd.ops.sum(e, [1]))
    assert max_inline_position(e) == (2, "fully inlined")


def test_vectorized_axis_stops_inlining():
    fd, x, a, b, out = _chain()
    out.split(1, 4)
    propagate_transforms(out)
    out.parallelize(2, ParallelType.Vectorize)
    pos, why = max_inline_position(b)
    assert pos == 2 and "V" in why and f"T{out.name}" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{b.name}: position 3 is past the "
                                            r"legal limit 2"):
        inline_at(b, 3)
    # The producer's own vectorized axis is an own loop too.
    a.parallelize(2, ParallelType.Vectorize)
    pos, why = max_inline_position(a)
    assert pos == 2 and "axis 2 is V" in why


def test_unmappable_axis_stops_inlining():
    fd, x, a, b, out = _chain()
    b.reorder([1, 0])  # b's loop order no longer matches a's
    pos, why = max_inline_position(a)
    assert pos == 0 and f"consumer T{b.name}" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{a.name}: position 1 is past the "
                                            r"legal limit 0"):
        inline_at(a, 1)
    # out keeps the logical order, b is swapped: b cannot be inlined into out either.
    assert max_inline_position(b)[0] == 0


def test_split_mismatch_stops_inlining_at_the_split():
    fd, x, a, b, out = _chain()
    a.split(1, 4)
    b.split(1, 8)
    pos, why = max_inline_position(a)
    assert pos == 1 and "axis 1" in why

"""TensorView.reorder: dict and list forms, bad permutations."""
import pytest

from pyfuser import FusionDefinition
from pyfuser.ir import ScheduleError


def _tv(rank=4):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank)
        fd.add_output(fd.ops.exp(x))
    return fd.fusion.outputs[0]


def test_list_form_names_old_axis_per_new_position():
    y = _tv()
    a, b, c, d = y.loop
    y.reorder([2, 0, 3, 1])
    assert y.loop == [c, a, d, b]
    assert y.logical == [a, b, c, d]  # logical order is not touched


def test_list_form_negative_axes():
    y = _tv(3)
    a, b, c = y.loop
    y.reorder([-1, 0, 1])
    assert y.loop == [c, a, b]


def test_dict_form_moves_named_axes_others_keep_order():
    y = _tv()
    a, b, c, d = y.loop
    y.reorder({0: 3})
    assert y.loop == [b, c, d, a]
    y.reorder({3: 0, 0: 1})
    assert y.loop == [a, b, c, d]


def test_dict_form_negative_axes_and_swap():
    y = _tv(3)
    a, b, c = y.loop
    y.reorder({-1: 0, 0: -1})
    assert y.loop == [c, b, a]


@pytest.mark.parametrize("order, message", [
    ([0, 0, 1, 2], r"\[0, 0, 1, 2\] is not a permutation of the 4 loop axes"),
    ([0, 1, 2], r"\[0, 1, 2\] is not a permutation of the 4 loop axes"),
    ([0, 1, 2, 4], r"axis 4 is out of range for 4 loop axes"),
    ({0: 1, 2: 1}, r"two axes sent to one position"),
    ({0: 7}, r"axis 7 is out of range for 4 loop axes"),
    ({-5: 0}, r"axis -5 is out of range for 4 loop axes"),
])
def test_bad_permutations_raise(order, message):
    y = _tv()
    before = list(y.loop)
    with pytest.raises(ScheduleError, match=r"reorder on T1: " + message):
        y.reorder(order)
    assert y.loop == before


def test_reorder_across_compute_at_raises():
    from pyfuser.schedule import inline_at
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    inline_at(a, 1)
    with pytest.raises(ScheduleError, match=r"reorder on T1: axis 0 is left of the compute-at"):
        a.reorder({0: 2})
    i1, i2 = a.loop[1], a.loop[2]
    a.reorder({1: 2})
    assert a.loop[1:] == [i2, i1]

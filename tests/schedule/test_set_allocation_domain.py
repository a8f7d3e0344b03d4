"""set_allocation_domain, and how a tensor's allocation follows its memory and loop."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir import MemoryType, ScheduleError
from pyfuser.runtime.inputs import output_strides
from pyfuser.schedule import inline_at, set_allocation_domain, set_memory_type


def _chain(rank=3):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * rank)
        y = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(y))
    return fd, x, y, fd.fusion.outputs[0]


def test_global_output_takes_a_permutation_of_logical_ids():
    fd, x, y, z = _chain()
    a, b, c = z.logical
    set_allocation_domain(z, [c, a, b])
    assert z.allocation_domain == [c, a, b]
    assert z.domain.contiguity == [True, True, True]
    assert output_strides(z, [2, 3, 4]) == [3, 1, 6]
    X = torch.randn(2, 3, 4)
    (out,) = fd.execute([X])
    torch.testing.assert_close(out, -X.exp())


def test_contiguity_and_broadcast_flags():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1])
        fd.add_output(fd.ops.exp(x))
    z = fd.fusion.outputs[0]
    a, b = z.logical
    set_allocation_domain(z, [b, a], [True, False])
    assert z.domain.contiguity == [None, False]  # broadcast IDs carry no contiguity


def test_global_allocation_must_be_logical_permutation():
    fd, x, y, z = _chain()
    a, b, c = z.logical
    with pytest.raises(ScheduleError, match=r"set_allocation_domain on T2: the IDs must be a "
                                            r"permutation of its logical domain \(3 IDs\)"):
        set_allocation_domain(z, [a, b])
    with pytest.raises(ScheduleError, match="set_allocation_domain on T2: an ID appears twice"):
        set_allocation_domain(z, [a, a, b])
    with pytest.raises(ScheduleError, match="set_allocation_domain on T2: 1 contiguity flags for "
                                            "3 IDs"):
        set_allocation_domain(z, [a, b, c], [True])
    z.split(0, 2)
    with pytest.raises(ScheduleError, match="permutation of its logical domain"):
        set_allocation_domain(z, z.loop)
    assert z.domain.allocation is None


def test_local_tensor_takes_loop_ids_and_drops_those_left_of_compute_at():
    fd, x, y, z = _chain()
    y.split(2, 4)
    l0, l1, l2o, l2i = y.loop
    with pytest.raises(ScheduleError, match="permutation of its loop domain"):
        set_allocation_domain(y, y.logical)
    set_allocation_domain(y, [l2i, l0, l1, l2o])
    assert y.allocation_domain == [l2i, l0, l1, l2o]
    z.split(2, 4)
    inline_at(y, 1)
    assert y.allocation_domain == [l2i, l1, l2o]


def test_stale_local_allocation_is_rebuilt_from_loop_ids():
    fd, x, y, z = _chain()
    l0, l1, l2 = y.loop
    set_allocation_domain(y, [l2, l0, l1])
    y.split(0, 2)  # l0 is split after the allocation was set
    l0o, l0i = y.loop[0], y.loop[1]
    # The split IDs take l0's place in the allocation order; l0 itself is never named.
    assert y.allocation_domain == [l2, l0o, l0i, l1]
    assert l0 not in y.allocation_domain


def test_shared_tensor_allocation_follows_memory_type():
    fd, x, y, z = _chain(2)
    a, b = y.logical
    set_allocation_domain(y, [b, a])
    set_memory_type(y, MemoryType.Shared)
    assert y.allocation_domain == [b, a]
    z.split(0, 8)
    y.split(0, 8)
    ao, ai = y.loop[0], y.loop[1]
    inline_at(y, 1)
    assert y.allocation_domain == [b, ai]

"""cache_after / cache_before: graph rewiring, inherited allocation, memory types."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import LoadKind, LoadStoreOp, MemoryType, ReductionOp, ScheduleError
from pyfuser.ir.verifier import verify
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule import cache_after, cache_before


def _two_uses():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        b = fd.ops.neg(x)
        fd.add_output(fd.ops.add(a, b))
    return fd, x, a, b


def test_cache_after_redirects_every_use():
    fd, x, a, b = _two_uses()
    c = cache_after(x)
    d = c.definition
    assert isinstance(d, LoadStoreOp) and d.inputs == [x] and d.load_kind == LoadKind.Set
    assert x.uses == [d]
    assert a.definition.inputs == [c] and b.definition.inputs == [c]
    assert fd.fusion.consumers(x) == [c]
    assert set(fd.fusion.consumers(c)) == {a, b}
    assert c.memory_type == MemoryType.Local
    assert c.logical is not x.logical and len(c.logical) == 2
    verify(fd.fusion)
    X = torch.randn(3, 5)
    (out,) = evaluate(fd.fusion, [X])
    torch.testing.assert_close(out, X.exp() - X)


def test_cache_after_inherits_allocation_order_of_permuted_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], contiguity=[True, False, True], stride_order=[0, 2, 1])
        fd.add_output(fd.ops.exp(x))
    i0, i1, i2 = x.logical
    assert x.domain.allocation == [i1, i2, i0]
    c = cache_after(x)
    c0, c1, c2 = c.logical
    assert c.domain.allocation == [c1, c2, c0]
    assert c.domain.contiguity == [True, False, True]
    assert c.allocation_domain == [c1, c2, c0]  # unscheduled: the inherited order
    # The cache's own copy of the order, not the input's IDs.
    assert not set(c.domain.allocation) & set(x.logical)


def test_cache_after_of_input_without_allocation_has_none():
    fd, x, a, b = _two_uses()
    c = cache_after(x)
    assert c.domain.allocation is None
    assert c.allocation_domain == c.loop


@pytest.mark.parametrize("kind, memory", [
    (LoadKind.Set, MemoryType.Local), (LoadKind.CpAsync, MemoryType.Shared),
    (LoadKind.TmaBulk, MemoryType.Shared), (LoadKind.TmaTensor, MemoryType.Shared),
])
def test_default_memory_type_per_load_kind(kind, memory):
    fd, x, a, b = _two_uses()
    c = cache_after(x, kind)
    assert c.memory_type == memory
    assert c.definition.load_kind == kind


def test_explicit_memory_type():
    fd, x, a, b = _two_uses()
    c = cache_after(x, memory_type=MemoryType.Shared)
    assert c.memory_type == MemoryType.Shared and c.definition.load_kind == LoadKind.Set


@pytest.mark.parametrize("kind", [LoadKind.TmaBulk, LoadKind.TmaTensor, LoadKind.CpAsync])
def test_async_load_into_registers_refused(kind):
    fd, x, a, b = _two_uses()
    with pytest.raises(ScheduleError, match="loads write shared memory only"):
        cache_after(x, kind, memory_type=MemoryType.Local)


@pytest.mark.parametrize("kind", [LoadKind.TmaBulk, LoadKind.CpAsync])
def test_async_load_must_read_global(kind):
    fd, x, a, b = _two_uses()
    c = cache_after(x)
    with pytest.raises(ScheduleError, match=rf"cache_after on T{c.name}: {kind.value} loads read "
                                            r"global memory; T\d+ is in local memory"):
        cache_after(c, kind)


def test_cache_after_without_uses_refused():
    fd, x, a, b = _two_uses()
    out = fd.fusion.outputs[0]
    with pytest.raises(ScheduleError, match=rf"cache_after on T{out.name}: it has no uses"):
        cache_after(out)


def test_cache_before_output():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    old_domain = s.domain
    c = cache_before(s)
    # The cache computes the reduction (with its reduction IDs), in registers.
    assert c.domain is old_domain and c.has_reduction()
    assert isinstance(c.definition, ReductionOp) and c.definition.inputs == [x]
    assert c.memory_type == MemoryType.Local
    # The output is now a copy of the cache, with fresh IDs and no reduction.
    d = s.definition
    assert isinstance(d, LoadStoreOp) and d.inputs == [c]
    assert not s.has_reduction() and len(s.logical) == 1
    assert s.logical[0] is not c.logical[0]
    assert fd.fusion.outputs == [s] and s.memory_type == MemoryType.Global
    verify(fd.fusion)
    X = torch.randn(4, 7)
    (out,) = evaluate(fd.fusion, [X])
    torch.testing.assert_close(out, X.sum(1))


def test_cache_before_output_with_uses_redirects_them_to_the_cache():
    # y is an output and feeds z: after cache_before, z reads the register cache, not y back
    # from global memory.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.exp(x)
        fd.add_output(y)
        z = fd.ops.mul(y, 2.0)
        fd.add_output(z)
    c = cache_before(y)
    assert z.definition.inputs[0] is c
    assert fd.fusion.uses_of(y) == [] and set(fd.fusion.consumers(c)) == {y, z}
    assert y.definition.inputs == [c]
    verify(fd.fusion)
    X = torch.randn(4, 7)
    out_y, out_z = evaluate(fd.fusion, [X])
    torch.testing.assert_close(out_y, X.exp())
    torch.testing.assert_close(out_z, X.exp() * 2)


def test_cache_before_keeps_output_allocation_order():
    from pyfuser.schedule import set_allocation_domain
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.exp(x)
        fd.add_output(y)
    a, b = y.logical
    set_allocation_domain(y, [b, a], [False, True])
    cache_before(y)
    na, nb = y.logical
    assert y.domain.allocation == [nb, na]
    assert y.domain.contiguity == [False, True]


def test_cache_before_input_or_inlined_refused():
    from pyfuser.schedule import inline_at
    fd, x, a, b = _two_uses()
    with pytest.raises(ScheduleError, match="cache_before on T0: it is a fusion input"):
        cache_before(x)
    inline_at(a, 2)
    out = fd.fusion.outputs[0]
    with pytest.raises(ScheduleError, match=rf"cache_before on T{out.name}: it is already inlined"):
        cache_before(out)

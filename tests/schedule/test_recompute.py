"""recompute_for / recompute_blocker: which computations a use may get its own copy of."""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import FullOp, ReductionOp, ReshapeOp, SqueezeOp
from pyfuser.ir.id_graph import IdGraph
from pyfuser.ir.tensor import ScheduleError
from pyfuser.schedule.recompute import recompute_blocker, recompute_for

F32 = DataType.Float


def _last_use(fusion, tv):
    return [e for e in fusion.uses_of(tv) if e is fusion.exprs()[-1]]


def test_fills_reshapes_and_squeezes_are_recomputed():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=F32)
        r = fd.ops.reshape(x, [-1, 8])
        s = fd.ops.squeeze(fd.ops.broadcast(r, [False, False, True]), [2])
        h = fd.ops.add(s, fd.ops.ones([4, 8], dtype=F32))
        fd.add_output(fd.ops.sum(h, [1]))
        fd.add_output(fd.ops.mul(h, 2.0))
    f = fd.fusion.clone()[0]
    h = f.outputs[1].definition.inputs[0]
    assert recompute_blocker(h, set(f.inputs)) is None
    copy = recompute_for(h, _last_use(f, h), set(f.inputs))
    kinds = []
    stack = [copy]
    while stack:
        t = stack.pop()
        if t.definition is not None and t not in f.inputs:
            assert getattr(t.definition, "is_recompute", False)
            kinds.append(type(t.definition))
            stack += [i for i in t.definition.inputs if hasattr(i, "domain")]
    assert {FullOp, ReshapeOp, SqueezeOp} <= set(kinds)
    # The copy of the reshape keeps its merge and split: its logical IDs map exactly to the
    # original's (the same iteration of x's elements).
    exact = IdGraph(f)
    (orig,) = [e.outputs[0] for e in f.exprs() if isinstance(e, ReshapeOp)
               and not getattr(e, "is_recompute", False)]
    (clone,) = [e.outputs[0] for e in f.exprs() if isinstance(e, ReshapeOp)
                and getattr(e, "is_recompute", False)]
    assert all(exact.mapped(a, b) for a, b in zip(orig.domain.logical, clone.domain.logical))


def test_a_tensor_read_twice_in_the_chain_is_copied_once():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=F32)
        e = fd.ops.exp(x)
        h = fd.ops.mul(e, e)
        fd.add_output(fd.ops.sum(h, [1]))
        fd.add_output(fd.ops.neg(h))
    f = fd.fusion.clone()[0]
    h = f.outputs[1].definition.inputs[0]
    copy = recompute_for(h, _last_use(f, h), set(f.inputs))
    a, b = copy.definition.inputs
    assert a is b and a is not h.definition.inputs[0]


def test_a_reduction_in_the_chain_blocks_the_copy():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=F32)
        m = fd.ops.sum(x, [1], keepdim=True)
        h = fd.ops.sub(x, m)
        fd.add_output(fd.ops.sum(h, [1]))
        fd.add_output(fd.ops.neg(h))
    f = fd.fusion.clone()[0]
    h = f.outputs[1].definition.inputs[0]
    blocker = recompute_blocker(h, set(f.inputs))
    assert isinstance(blocker.definition, ReductionOp)
    with pytest.raises(ScheduleError, match=rf"recompute of T{h.name}: T{blocker.name} comes "
                                            r"from a ReductionOp, which is not recomputed"):
        recompute_for(h, _last_use(f, h), set(f.inputs))
    # Stopping at the reduction's result, the rest is copied.
    assert recompute_blocker(h, set(f.inputs) | {blocker}) is None

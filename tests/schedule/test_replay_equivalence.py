"""Replay equivalence: after transform propagation, each replayed tensor's loop domain is the
reference's, ID by ID, in the permissive ID graph, with the same extents where no broadcast is
involved."""
import pytest

from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.ir import Merge, Split
from pyfuser.ir import scalar as S
from pyfuser.ir.id_graph import IdGraph
from pyfuser.schedule import propagate_transforms, replay


def _bindings(fusion):
    """Distinct sizes per (right-aligned) dim, so that a row mapped to a column shows."""
    sizes = {-1: 300, -2: 37, -3: 11}
    out = {}
    for tv in fusion.inputs:
        n = len(tv.logical)
        for d, i in enumerate(tv.logical):
            for e in (i.extent, i.expanded_extent):
                if e is not None and e.value is None and e.definition is None:
                    out.setdefault(e, sizes[d - n])
    return out


def _check_equivalent(fusion, ref, bindings):
    graph = IdGraph(fusion, permissive=True)
    checked = 0
    for tv in fusion.tensors():
        if tv is ref or len(tv.loop) != len(ref.loop):
            continue
        for k, (i, r) in enumerate(zip(tv.loop, ref.loop)):
            assert graph.mapped(i, r), f"T{tv.name} loop {k} {i!r} is not mapped to {r!r}"
        if not any(i.is_broadcast for i in tv.logical + ref.logical):
            assert ([S.evaluate(i.extent, dict(bindings)) for i in tv.loop]
                    == [S.evaluate(r.extent, dict(bindings)) for r in ref.loop]), f"T{tv.name}"
        checked += 1
    return checked


def _pointwise_chain():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        y = fd.define_tensor([-1, -1, -1])
        a = fd.ops.exp(x)
        b = fd.ops.mul(a, y)
        c = fd.ops.permute(b, [0, 2, 1])
        fd.add_output(fd.ops.neg(c))
        fd.add_output(fd.ops.sigmoid(b))
    return fd.fusion


@pytest.mark.parametrize("schedule", [
    lambda t: (t.merge(0, 1), t.split(0, 128), t.split(0, 4, inner_split=False)),
    lambda t: (t.split(2, 8), t.reorder([3, 0, 2, 1]), t.merge(1, 2)),
    lambda t: (t.merge(1, 2), t.merge(0, 1), t.split(0, 7)),
])
def test_pointwise_chain_with_permute(schedule):
    fusion = _pointwise_chain()
    ref = fusion.outputs[1]
    schedule(ref)
    propagate_transforms(ref)
    n = _check_equivalent(fusion, ref, _bindings(fusion))
    assert n == len(fusion.tensors()) - 1  # every other tensor has the reference's loop


def test_permuted_consumer_replays_in_its_own_logical_terms():
    fusion = _pointwise_chain()
    ref = fusion.outputs[1]  # sigmoid(b): dims (d0, d1, d2)
    ref.merge(1, 2)          # merges d1 and d2
    propagate_transforms(ref)
    permuted = fusion.outputs[0]  # neg(permute(b)): dims (d0, d2, d1)
    (m,) = [i for i in permuted.loop if isinstance(i.definition, Merge)]
    # The permuted tensor merges its logical dims 2 (= d1, outer) and 1 (= d2, inner).
    assert m.definition.outer is permuted.logical[2] and m.definition.inner is permuted.logical[1]


@pytest.mark.parametrize("name", ["gelu_bias", "silu_mul", "softmax", "rmsnorm_fwd",
                                  "layernorm_fwd", "layernorm_bwd"])
def test_catalogue_fusions_row_schedule(name):
    fusion = catalogue.define(name).fusion.clone()[0]
    ref = fusion.outputs[0]  # a full-rank output for all of these
    assert len(ref.logical) == 2
    ref.split(1, 128)
    ref.split(1, 2, inner_split=False)
    ref.split(0, 8)
    propagate_transforms(ref)
    n = _check_equivalent(fusion, ref, _bindings(fusion))
    full = [t for t in fusion.tensors() if len(t.logical) == 2]
    assert n == len(full) - 1


def test_replay_direct_producer_and_consumer():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1000], dtype=DataType.Float)
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    out = fd.fusion.outputs[0]
    a.split(1, 128)
    a.merge(0, 1)
    # a -> its consumer (a's logical IDs map to out's root IDs).
    replay(a, out, dict(zip(a.logical, out.logical)), "logical")
    # a -> its producer (a's root IDs map to x's logical IDs).
    replay(a, x, dict(zip(a.logical, x.logical)), "root")
    for tv in (out, x):
        assert len(tv.loop) == 2
        merge = tv.loop[0].definition
        assert isinstance(merge, Merge)
        split = merge.inner.definition
        assert isinstance(split, Split) and split.factor.value == 128 and split.inner_split
        assert split.in_id is tv.logical[1] and merge.outer is tv.logical[0]
        assert tv.loop[1].const_extent == 128 and merge.inner.const_extent == 8
    graph = IdGraph(fd.fusion, permissive=True)
    assert all(graph.mapped(i, j) for i, j in zip(out.loop, a.loop))
    assert all(graph.mapped(i, j) for i, j in zip(x.loop, a.loop))


def test_replay_skips_inlined_tensors():
    from pyfuser.schedule import inline_at
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    out = fd.fusion.outputs[0]
    inline_at(a, 1)
    loop = list(a.loop)
    out.split(1, 4)
    propagate_transforms(out)
    assert a.loop == loop  # already inlined: keeps its loops
    assert len(out.loop) == 3
    assert x.loop == x.logical  # reached through a, whose loops did not change

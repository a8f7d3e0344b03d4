"""Transform propagation over the catalogue's RMSNorm-backward fusion."""
import pytest

from pyfuser import catalogue
from pyfuser.ir import ParallelType
from pyfuser.ir import scalar as S
from pyfuser.ir.id_graph import IdGraph
from pyfuser.ir.verifier import verify
from pyfuser.schedule import parallelize_like, propagate_transforms

ROWS, COLS = 37, 300


def _rmsnorm_bwd():
    fusion = catalogue.define("rmsnorm_bwd").fusion.clone()[0]
    # Inputs: x [rows, cols], dy [rows, cols], w [cols], rstd [rows, 1].
    bindings = {}
    for tv in fusion.inputs:
        for i in tv.logical:
            if not i.is_broadcast:
                bindings[i.extent] = COLS if len(tv.logical) == 1 or i is tv.logical[1] else ROWS
    return fusion, bindings


def _row_reduction(fusion):
    (ref,) = [t for t in fusion.tensors() if t.has_reduction() and t.logical[1].is_reduction]
    return ref


def _schedule_reference(ref):
    # (i_row, r_col) -> (i_row/4, 4, r_col/128, r128): splits and a merge of reduction pieces.
    ref.split(1, 64)
    ref.split(1, 2)          # (i, roo, ro2, r64)
    ref.merge(2, 3)          # (i, roo, r128)
    ref.split(0, 4)          # (io, i4, roo, r128)
    assert len(ref.loop) == 4


def _positions(graph, tv, ref):
    out = []
    for i in tv.loop:
        hits = [k for k, r in enumerate(ref.loop) if graph.mapped(i, r)]
        assert len(hits) == 1, f"T{tv.name} loop ID {i!r} maps to ref loop positions {hits}"
        out.append(hits[0])
    return out


def _value(x, bindings):
    return S.evaluate(x, dict(bindings))


def test_every_tensor_replays_the_reference():
    fusion, bindings = _rmsnorm_bwd()
    ref = _row_reduction(fusion)
    _schedule_reference(ref)
    order = propagate_transforms(ref)
    tensors = fusion.tensors()
    assert order[0] is ref and set(order) == set(tensors) and len(order) == len(tensors)
    graph = IdGraph(fusion, permissive=True)
    ref_ext = [_value(r.extent, bindings) for r in ref.loop]
    assert ref_ext == [10, 4, 3, 128]
    n_full = n_vec = 0
    for tv in tensors:
        assert len(tv.logical) in (1, 2)  # logical domains are untouched
        pos = _positions(graph, tv, ref)
        if len(tv.logical) == 2:
            # Full rank (including the broadcast and dw tensors): all four loops, in order.
            assert pos == [0, 1, 2, 3], f"T{tv.name}: {tv.loop}"
            n_full += 1
            if not any(i.is_broadcast for i in tv.logical):
                assert [_value(i.extent, bindings) for i in tv.loop] == ref_ext, f"T{tv.name}"
        else:
            # w, its cast and dw: the column loops only.
            assert pos == [2, 3], f"T{tv.name}: {tv.loop}"
            assert [_value(i.extent, bindings) for i in tv.loop] == ref_ext[2:]
            n_vec += 1
        # Each replayed loop came from the same factors and kinds as the reference's.
        for i, r in zip(tv.loop, [ref.loop[k] for k in pos]):
            if r.definition is not None and not i.is_broadcast:
                assert type(i.definition) is type(r.definition)
    assert n_full == 19 and n_vec == 3
    verify(fusion)


def test_broadcast_tensors_reached_through_full_rank_paths():
    fusion, bindings = _rmsnorm_bwd()
    ref = _row_reduction(fusion)
    _schedule_reference(ref)
    propagate_transforms(ref)
    bcast = [t for t in fusion.tensors() if any(i.is_broadcast for i in t.logical)]
    # rstd (input), w broadcast over rows, the row reduction broadcast back, and mean = it / N.
    assert len(bcast) == 4
    for tv in bcast:
        (b,) = [i for i in tv.logical if i.is_broadcast]
        row = b is tv.logical[0]
        # The broadcast dim got the reference's transforms for its dim: rows are split by 4,
        # columns by 64 (then 2, then merged): it was reached from a full-rank tensor.
        assert b not in tv.loop, f"T{tv.name}: broadcast dim not transformed: {tv.loop}"
        assert len(tv.loop) == 4
        assert [u.factor.value for u in b.uses] == ([4] if row else [64])
        b_loops = tv.loop[:2] if row else tv.loop[2:]
        assert all(i.is_broadcast for i in b_loops), f"T{tv.name}: {tv.loop}"
        assert not any(i.is_broadcast for i in (tv.loop[2:] if row else tv.loop[:2]))


def test_dw_reduction_replays_with_rows_as_reduction():
    fusion, bindings = _rmsnorm_bwd()
    ref = _row_reduction(fusion)
    _schedule_reference(ref)
    propagate_transforms(ref)
    (dw,) = [t for t in fusion.tensors() if t.has_reduction() and t.logical[0].is_reduction]
    assert [i.is_reduction for i in dw.loop] == [True, True, False, False]
    assert [_value(i.extent, bindings) for i in dw.loop] == [10, 4, 3, 128]


def test_propagation_limited_to_given_tensors():
    fusion, bindings = _rmsnorm_bwd()
    ref = _row_reduction(fusion)
    _schedule_reference(ref)
    producer = ref.definition.inputs[0]
    untouched = [t for t in fusion.tensors() if t not in (ref, producer)]
    before = {t: list(t.loop) for t in untouched}
    order = propagate_transforms(ref, [producer])
    assert order == [ref, producer]
    assert len(producer.loop) == 4
    assert all(t.loop == before[t] for t in untouched)


def test_parallelize_like_copies_bindings_to_mapped_ids():
    fusion, bindings = _rmsnorm_bwd()
    ref = _row_reduction(fusion)
    _schedule_reference(ref)
    propagate_transforms(ref)
    ref.parallelize(0, ParallelType.BIDx)
    ref.parallelize(3, ParallelType.TIDx)
    parallelize_like(ref, parallel_types={ParallelType.BIDx})
    graph = IdGraph(fusion, permissive=True)
    for tv in fusion.tensors():
        if tv is ref:
            continue
        for i in tv.loop:
            if graph.mapped(i, ref.loop[0]):
                assert i.parallel_type == ParallelType.BIDx
            else:
                assert i.parallel_type == ParallelType.Serial  # TIDx was not asked for
    parallelize_like(ref)
    x = fusion.inputs[0]
    assert [i.parallel_type for i in x.loop] == [ParallelType.BIDx, ParallelType.Serial,
                                                ParallelType.Serial, ParallelType.TIDx]


@pytest.mark.parametrize("name", ["layernorm_bwd", "rmsnorm_fwd", "softmax", "add_rmsnorm_fwd"])
def test_other_norms_reach_every_tensor(name):
    fusion = catalogue.define(name).fusion.clone()[0]
    ref = [t for t in fusion.tensors() if t.has_reduction() and t.logical[-1].is_reduction][0]
    ref.split(1, 128)
    ref.split(0, 2)
    order = propagate_transforms(ref)
    assert set(order) == set(fusion.tensors())
    graph = IdGraph(fusion, permissive=True)
    for tv in fusion.tensors():
        if len(tv.logical) == 2:
            assert _positions(graph, tv, ref) == [0, 1, 2, 3], f"T{tv.name}: {tv.loop}"
    verify(fusion)


def test_a_reshape_reached_from_its_producer_keeps_its_loops_derived_from_its_logical():
    """x -> a = reshape(x) and b = reshape(x), the reference a reduction of a: b is reached from
    x, which took a's reshape merge and split. b's loop takes its own reshape's IDs where x's
    history makes the same merge and split, so it derives from b's logical domain (before, the
    merge was made again from b's root: a loop outside b's logical, which rfactor and indexing
    cannot follow)."""
    from pyfuser import DataType, FusionDefinition
    from pyfuser.ir.iter_domain import ancestors
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        a = fd.ops.reshape(x, [-1, 128])
        b = fd.ops.reshape(x, [-1, 128])
        fd.add_output(fd.ops.sum(a, [1]))
        fd.add_output(fd.ops.mul(b, 2.0))       # b is reached through x only
    fusion = fd.fusion.clone()[0]
    ref = next(t for t in fusion.tensors() if t.has_reduction())
    reshapes = [e.outputs[0] for e in fusion.exprs() if type(e).__name__ == "ReshapeOp"]
    ref.split(1, 32).split(0, 2)
    order = propagate_transforms(ref)
    assert order.index(fusion.inputs[0]) < order.index(reshapes[1])
    out = fusion.outputs[1]
    for t in reshapes + [out]:
        assert all(ancestors(i, t.domain.logical) for i in t.domain.loop), t
        assert [S.const_value(i.extent) for i in t.domain.loop][1:] == [2, 4, 32]


def test_a_tensor_is_reached_through_the_producer_whose_dims_iterate():
    """Fuzz 20261201:2331: y = sqrt(|where(x > 0.5, t, 2)| + 2) * t for x [M, 100] and a
    one-element t [1], both reshaped to [M * 100] outputs. The product ties on the reference's
    one (merged) dim through its two producers; reached through t's broadcast, its dim of 100
    took that broadcast's split of one element (1 x 4 x 128 x 2 loops) and its M stayed a
    loop of its own: "needs a register buffer of runtime size". Now reached through x's
    side."""
    import warnings

    import torch

    from pyfuser import DataType, FusionDefinition
    from pyfuser.testing import run_and_check

    x = torch.randn(509, 100).bfloat16()
    t = torch.tensor([3])
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, 100], contiguity=[True, True], dtype=DataType.BFloat16)
        t1 = fd.from_pytorch(t)
        v2 = fd.ops.where(fd.ops.gt(t0, 0.5), t1, 2)
        v8 = fd.ops.mul(fd.ops.sqrt(fd.ops.add(fd.ops.abs(v2), 2)), t1)
        fd.add_output(fd.ops.reshape(v2, [50900]))
        fd.add_output(fd.ops.reshape(v8, [50900]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [x, t], scheduler="pointwise", options={"enable": ["interpret"]})


def test_an_outer_product_gets_the_dims_of_both_producers():
    """Fuzz 20261205:1742: min(w[N] * |max(w * x, dim 1)|[M, 1], dim 0) under inner-outer
    persistent. The product [M, N] of a row statistic [M, 1] and the column vector w [1, N]
    has no neighbour carrying both reference dims: reached through the statistic, its N stayed
    one serial loop while w's broadcast, split along N and bound to threadIdx.x, was computed
    before the rows' loop; the product read w's registers along N, other threads' values
    ("T17 reads T16's registers along iTIDx (TIDx) in none of its TIDx loops"). Now its N takes
    the reference's transforms through w's side too."""
    import warnings

    import torch

    from pyfuser import DataType, FusionDefinition
    from pyfuser.testing import run_and_check

    x = torch.randn(509, 239)
    w = torch.rand(239) + 0.5
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        stat = fd.ops.abs(fd.ops.max(fd.ops.mul(t1, t0), [-1], keepdim=True))
        fd.add_output(fd.ops.min(fd.ops.mul(t1, stat), [0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [x, w], scheduler="inner_outer_persistent",
                      options={"enable": ["interpret"]})

"""can_schedule against schedule(): fuzz triage groups P2, P9 and P11 (tests/fuzz).

Each fusion of acceptance_fusions.py was accepted by a scheduler whose schedule() then failed
(an internal error, or an illegal access on the interpreter). What is checked:
- the fusions that now run as one kernel (RUN): through the executor on the kernel-IR
  interpreter, every output against the float64 reference, with the scheduler named;
- the fusions no scheduler can run whole (REFUSED): the scheduler that took them refuses, with
  its reason, and the executor runs the segmenter's plan (right values, no internal error);
- the mechanisms fixed underneath: recompute_for's copy of a permute keeps its dim order,
  propagation reaches a tensor through the dims that iterate, and through a recomputed copy's
  original, the persistent projection stops at a reduction result whose only other dims are
  kept size-1 dims, and the reduction and inner-outer analyses map dims, not count them.
"""
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from acceptance_fusions import REFUSED, RUN  # noqa: E402
from kir_testing import reference, setup  # noqa: E402

from pyfuser import DataType, FusionDefinition  # noqa: E402
from pyfuser.ir.exprs import LoadStoreOp  # noqa: E402
from pyfuser.ir.id_graph import IdGraph  # noqa: E402
from pyfuser.runtime.executor import FallbackWarning  # noqa: E402
from pyfuser.schedule import cache_after, propagate_transforms  # noqa: E402
from pyfuser.schedule.recompute import recompute_for  # noqa: E402
from pyfuser.schedule.schedulers import (inner_outer_persistent, reduction,  # noqa: E402
                                         registry)
from pyfuser.testing import TOLERANCE, rel_error, run_and_check  # noqa: E402

INTERPRET = {"enable": ["interpret"]}


def _cases(table, which):
    return [(name, dt, shape) for name, entry in table.items() for shape in entry[which]
            for dt in ("fp32", "bf16")]


# Fusions that now run as kernels ----------------------------------------------------------------
@pytest.mark.parametrize("name,dt,shape", _cases(RUN, 2))
def test_runs_as_one_kernel_and_matches_float64(name, dt, shape):
    build, scheduler, _, _ = RUN[name]
    fd, inputs = build(dt, *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, inputs, scheduler=scheduler, options=INTERPRET)
    assert fd.last_run.backend == "interpreter" and not fd.last_run.internal_error


# Fusions no scheduler runs --------------------------------------------------------------------
@pytest.mark.parametrize("name", REFUSED)
def test_refused_whole_with_a_reason_and_run_as_segments(name):
    """No scheduler takes the whole fusion: the one that took it refuses with its reason, and
    the segmenter's plan runs it (kernels, with a FallbackWarning for each reference segment),
    with the right values and no internal error."""
    build, took_it, words, shape = REFUSED[name]
    fd, inputs = build("fp32", *shape)
    ok, why = registry.by_name(took_it).can_schedule(fd.fusion)
    assert not ok and words in why, why
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is None, choice.reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = fd.execute(inputs, options=INTERPRET)
    run = fd.last_run
    assert len(run.segments) > 1 and not run.internal_error, run
    refs = [s for s in run.segments if s.kind == "reference"]
    assert run.kind == ("reference" if refs else "kernels"), run
    assert len([w for w in caught if issubclass(w.category, FallbackWarning)]) == len(refs)
    for o, r in zip(outs, reference(fd, inputs)):
        assert o.shape == r.shape
        assert rel_error(o, r) <= TOLERANCE[DataType.Float]


# recompute_for ------------------------------------------------------------------------------------
def test_recomputed_permute_keeps_its_dim_order():
    """The copy of permute(x) [N, M] has a root in x's order [M, N] and a logical domain in the
    permuted one; a copy of the logical IDs alone paired x's M with its N."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        xt = fd.ops.permute(x, [1, 0])
        fd.add_output(fd.ops.neg(xt))
        fd.add_output(fd.ops.exp(xt))
    f, _ = fd.fusion.clone()
    xt = f.outputs[0].definition.inputs[0]
    use = f.outputs[1].definition
    copy = recompute_for(xt, [use], stop_at={f.inputs[0]})
    assert isinstance(copy.definition, LoadStoreOp) and copy.definition.inputs[0] is f.inputs[0]
    assert use.inputs[0] is copy
    m, n = f.inputs[0].logical
    graph = IdGraph(f)
    assert graph.mapped(copy.domain.maybe_root[0], m) and graph.mapped(copy.domain.maybe_root[1], n)
    assert graph.mapped(copy.logical[0], n) and graph.mapped(copy.logical[1], m)
    assert [i.extent for i in copy.logical] == [n.extent, m.extent]
    assert copy.recompute_of is xt


# Transform propagation --------------------------------------------------------------------------
def test_propagation_takes_the_row_dims_from_the_path_that_iterates_them():
    """out = x + sum(broadcast(x) [N, 1], 0): out's N is both x's N (the reduced dim) and the
    sum's kept size-1 dim broadcast to it. Reached through the sum, it took the kept dim's
    loops; through x's cache it takes the row's."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s = fd.ops.sum(fd.ops.broadcast(x, [False, True]), [0])
        fd.add_output(fd.ops.add(x, s))
    st = setup(fd, [torch.randn(300)])
    f = st.fusion
    cache_after(f.inputs[0])
    red = s_of(f)
    red.reorder({0: 1, 1: 0})
    red.split(1, 4).split(1, 2, inner_split=False)
    propagate_transforms(red)
    out = f.outputs[0]
    graph = IdGraph(f)
    # The output's loops are the row's splits [2, ceilDiv(N / 4, 2), 4], none from the kept dim.
    row = [i for i in red.domain.loop if i.is_reduction]
    assert len(out.domain.loop) == 3
    assert all(graph.mapped(a, b) for a, b in zip(out.domain.loop, row))


def s_of(f):
    from pyfuser.schedule.schedulers.base import reduction_tensors
    (red,) = reduction_tensors(f)
    return red


# Reduction scheduler: outputs over the kept dims, mapped -------------------------------------
def test_reduction_accepts_a_permuted_output_of_the_kept_dims():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        s = fd.ops.sum(x, [2])
        fd.add_output(fd.ops.permute(s, [1, 0]))
        fd.add_output(s)
    assert reduction.can_schedule(fd.fusion)[0]
    run_and_check(fd, [torch.randn(6, 5, 40)], scheduler="reduction", options=INTERPRET)


def test_reduction_refuses_an_output_of_as_many_other_dims():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.neg(y))          # [K]: one dim, not the kept M
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and why.startswith("an output whose dims are not the reduction's dims "
                                      "(output 1")


# inner_outer_persistent: row and column by the dims reduced ------------------------------------
def test_inner_outer_classifies_reductions_by_their_dims():
    fd, _ = RUN["column_sum_of_a_permuted_view"][0]("fp32", 8, 16)
    rows, cols = inner_outer_persistent._kinds(fd.fusion)
    # The sum over dim 1 of permute(y * x) reads [kept, reduced] but reduces M: a column.
    assert len(rows) == 1 and len(cols) == 2
    assert [i.is_reduction for i in cols[0].domain.maybe_root] == [False, True]
    fd, _ = RUN["row_sum_of_a_permuted_view"][0]("fp32", 8, 16)
    rows, cols = inner_outer_persistent._kinds(fd.fusion)
    assert len(rows) == 2 and len(cols) == 1
    # The reference (first) reads [kept, reduced]; the other row reads [reduced, kept].
    assert [i.is_reduction for i in rows[0].domain.maybe_root] == [False, True]
    assert [i.is_reduction for i in rows[1].domain.maybe_root] == [True, False]


def test_inner_outer_takes_a_column_reduction_whose_result_stays_a_column():
    """A column statistic used afterwards only along the columns (its [N] result scaled) is
    phase 2's; one broadcast back over the rows is refused (column_variance_of_rows)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
        fd.add_output(fd.ops.mul(fd.ops.sum(x, [0]), 2.0))
    assert inner_outer_persistent.can_schedule(fd.fusion)[0]
    run_and_check(fd, [torch.randn(33, 40)], scheduler="inner_outer_persistent",
                  options=INTERPRET)


# One-row tensors and expanded dims (triage P3, P4, P14) ----------------------------------------
def test_exact_graph_maps_a_merge_of_two_broadcasts_to_each():
    """sum over dim 1 of x [M(expanded), K, E(expanded)] keeps both broadcasts (the frontend
    squeezes E from the result); the reduction's merged kept dims iterate one element, as the
    squeezed result's M does, and the exact graph maps them, so that the result's loops line
    up with the reduction's (8:222: "cyclic dependency between loops")."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], expanded=[True, False, True])
        fd.add_output(fd.ops.sum(x, [1, 2]))
    st = setup(fd, [torch.randn(1, 3, 1).expand(7, 3, 5)])
    f = st.fusion
    red = s_of(f)
    red.reorder({1: 2, 2: 1}).merge(0)
    propagate_transforms(red)
    out = f.outputs[0]
    assert len(out.domain.loop) == 1 and red.domain.loop[0].is_broadcast
    assert IdGraph(f).mapped(out.domain.loop[0], red.domain.loop[0])


def test_one_row_reductions_are_row_reductions_of_the_rows():
    """A reduction of a one-row tensor [1, N] (its row dim a broadcast) beside those of the
    [M, N] rows: inner_outer takes the rows' reduction for the reference (first) and the
    one-row reduction for a row reduction; inner_persistent takes both as the same rows."""
    from pyfuser.schedule.schedulers import inner_persistent
    from pyfuser.schedule.schedulers.base import reduction_tensors, reference_reduction
    fd, _ = RUN["layernorm_bwd_of_one_row"][0]("fp32", 40)
    rows, cols = inner_outer_persistent._kinds(fd.fusion)
    assert rows is not None, cols
    assert len(rows) == 2 and len(cols) == 1      # sum(dy [1, N], 0) is a squeeze
    assert [i.is_broadcast for i in rows[0].domain.maybe_root] == [False, False]
    assert [i.is_broadcast for i in rows[1].domain.maybe_root] == [True, False]
    fd, _ = RUN["norms_of_one_row_and_of_rows"][0]("fp32", 4, 40)
    reds = reduction_tensors(fd.fusion)
    ref = reference_reduction(reds)
    one_row = [r for r in reds if r.domain.maybe_root[0].is_broadcast]
    assert len(one_row) == 2 and not ref.domain.maybe_root[0].is_broadcast
    graph = IdGraph(fd.fusion)
    assert all(inner_persistent.same_row_dims(r, ref, graph) for r in reds)
    # Not the other way round: the rows' reduction has a row the one-row reduction lacks.
    assert not inner_persistent.same_row_dims(ref, one_row[0], graph)


def test_a_rank_0_register_tensor_is_computed_in_the_one_iteration_loop_it_sits_between():
    """var_mean of x [1]: the squeeze of (x - mean)^2 to rank 0 is read by the variance in the
    same one-iteration loop that computes x - mean; computed at the top of the kernel it
    needed that loop both before and after it."""
    from kir_testing import enclosing, op_writing, schedule_and_lower
    from pyfuser.ir.exprs import SqueezeOp
    from acceptance_fusions import var_mean_of_one_element
    from pyfuser.schedule.schedulers import pointwise
    # The placement is checked on the pointwise schedule (test_runs_as_one_kernel_and_matches_
    # float64 runs it, and the variant of case 1:875).
    fd, inputs = var_mean_of_one_element("fp32")
    st, _, _, kernel = schedule_and_lower(fd, inputs, device="h100-4sm", scheduler=pointwise)
    # The squeeze of (x - mean)^2 (that of x's cache, the mean, comes after the cache's own
    # loops and before all others: the top of the kernel is the place between them).
    (sq,) = [e for e in st.fusion.exprs() if isinstance(e, SqueezeOp)
             and not isinstance(e.inputs[0].definition, LoadStoreOp)]
    loops = enclosing(kernel, op_writing(kernel, sq.outputs[0]))
    assert loops and loops == enclosing(kernel, op_writing(kernel, sq.inputs[0]))
    (use,) = st.fusion.consumers(sq.outputs[0])
    assert loops == enclosing(kernel, op_writing(kernel, use))


@pytest.mark.parametrize("dt,shape", [("fp32", (127, 193)),     # cp.async (772-byte rows)
                                      ("fp32", (9, 256)),       # 1D bulk copies
                                      ("bf16", (127, 200))])
def test_a_grid_stride_loop_promoted_to_a_broadcast_runs_in_every_block(dt, shape):
    """The TMA (1D bulk or cp.async) variants, with w [1, N]'s cache computed before the rows'
    grid-stride loop (compute-at 0, as a weight's may be): the cache keeps a loop of its own
    over its broadcast row dim, parallelized like the rows' (grid-stride). Run from
    blockIdx.x with stride gridDim.x, that loop ran in block 0 only, and the other blocks
    read registers never written."""
    from kir_testing import forced_inner_persistent, interpret, lower_upto
    from pyfuser.ir.iter_domain import ParallelType
    from pyfuser.schedule import inline_at
    from pyfuser.schedule.schedulers import inner_persistent
    fd, inputs = RUN["rows_scaled_by_one_row"][0](dt, *shape)
    params = forced_inner_persistent(fd, inputs, "tma_inner_persistent")
    assert params.grid > 1, params
    st = setup(fd, inputs)
    inner_persistent.schedule(st.fusion, params)
    (w_cache,) = [t for t in st.fusion.tensors() if isinstance(t.definition, LoadStoreOp)
                  and t.definition.inputs[0] is st.fusion.inputs[1]]
    inline_at(w_cache, 0)
    assert w_cache.domain.loop[0].parallel_type == ParallelType.GridStride
    assert w_cache.domain.loop[0].is_broadcast
    kernel = lower_upto(st.fusion)
    outs, _ = interpret(kernel, st.bindings, list(inputs))
    want = reference(fd, inputs)
    assert rel_error(outs[0], want[0]) <= TOLERANCE[DataType.Float]

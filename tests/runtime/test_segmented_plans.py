"""Segmentation decisions on a table of fusions, and their plans run on the kernel-IR
interpreter against float64 (issue 15, "A plan of kernels")."""
from __future__ import annotations

import warnings

import pytest
import torch

from pyfuser.catalogue import CHANNELS_LAST
from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.ir.dtype import DataType
from pyfuser.ir.exprs import ReductionOp
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.op_support import is_cheap
from pyfuser.schedule.segmenter import segment
from pyfuser.testing import run_and_check
from segment_testing import batchnorm_backward, refuse_full_reductions  # noqa: E402  (tests/runtime)

INTERPRET = {"enable": ["interpret"]}


def adamw_two_params(fd):
    """AdamW over two parameters of unrelated sizes: pointwise refuses the whole fusion."""
    for _ in range(2):
        p, g, m = (fd.define_tensor([-1, -1]) for _ in range(3))
        m2 = fd.ops.add(fd.ops.mul(m, 0.9), fd.ops.mul(g, 0.1))
        fd.add_output(m2)
        fd.add_output(fd.ops.sub(p, fd.ops.mul(m2, 1e-3)))


def adamw_inputs():
    return [torch.randn(33, 20) for _ in range(3)] + [torch.randn(7, 130) for _ in range(3)]


def _softmax(fd, x):
    mx = fd.ops.max(x, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(x, mx))
    return fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))


def softmax_column_sum(fd):
    """A softmax whose result is also summed over columns: one cooperative inner-outer kernel
    takes it whole today."""
    x = fd.define_tensor([-1, -1])
    y = _softmax(fd, x)
    fd.add_output(y)
    fd.add_output(fd.ops.sum(y, [0]))


def softmax_then_column_sum(fd):
    """The same with segment_set on the softmax: a persistent kernel, then a reduction that
    reads its result back."""
    x = fd.define_tensor([-1, -1])
    y = fd.ops.segment_set(_softmax(fd, x))
    fd.add_output(y)
    fd.add_output(fd.ops.sum(y, [0]))


def layernorm_and_unrelated_sum(fd):
    x = fd.define_tensor([-1, -1])
    var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
    fd.add_output(fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    z = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.sum(fd.ops.exp(z), [1]))


def segment_set_copy(fd):
    """segment_set splits a fusion one pointwise kernel would take."""
    x = fd.define_tensor([-1, -1])
    y = fd.ops.segment_set(fd.ops.exp(x))
    fd.add_output(fd.ops.mul(y, 2.0))


def full_sum_between_kernels(fd):
    """A full reduction between two pointwise parts: the reduction kernel takes the relu before
    it (and writes y), the division by the sum, broadcast back over y, is a pointwise kernel."""
    x = fd.define_tensor([-1, -1])
    y = fd.ops.relu(x)
    fd.add_output(y)
    fd.add_output(fd.ops.div(y, fd.ops.add(fd.ops.sum(y), 1.0)))


def inner_then_outer_reduction(fd):
    """A reduction result feeding a reduction over another dim (the reduction scheduler takes
    one kind at a time)."""
    x = fd.define_tensor([-1, -1, -1])
    s = fd.ops.sum(x, [2])
    fd.add_output(fd.ops.max(s, [0]))


def outer_product_of_row_sums(fd):
    """a[i] * a[j] of a reduction result a: the roles cannot be separated in one kernel (a copy
    would recompute the reduction), but can once a is an input of its own segment."""
    x = fd.define_tensor([-1, -1])
    a = fd.ops.sum(x, [1])
    fd.add_output(fd.ops.mul(fd.ops.broadcast(a, [True, False]), fd.ops.broadcast(a, [False, True])))


def mean_then_full_sum(fd):
    """The second segment reads a mean, whose divisor (the reduced extent) the first segment
    applies; no tensor of the second segment binds that extent."""
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.sum(fd.ops.mean(x, [1]), [0]))


def flatten_through_segment_set(fd):
    """An intermediate of a reshaped extent (i0 * i1): its segment takes i0 and i1 as scalar
    inputs."""
    x = fd.define_tensor([-1, -1])
    z = fd.ops.segment_set(fd.ops.reshape(fd.ops.exp(x), [-1]))
    fd.add_output(fd.ops.mul(z, 2.0))


def amax_scale(fd):
    """The catalogue's amax_scale: amax(|x|) over all of x, then x * (448 / amax). x's cast to
    fp32 is forwarded: both kernels read x in bf16, none writes an fp32 copy of it."""
    x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
    xf = fd.ops.cast(x, DataType.Float)
    amax = fd.ops.max(fd.ops.abs(xf))
    fd.add_output(fd.ops.cast(fd.ops.mul(xf, fd.ops.div(448.0, amax)), DataType.BFloat16))


def forwarded_chain_of_several_ops(fd):
    """A chain cast -> neg -> abs from an input, its tensors read by both segments at several
    depths: each segment recomputes as much of the chain as it reads."""
    x = fd.define_tensor([-1, -1], dtype=DataType.Half)
    xf = fd.ops.cast(x, DataType.Float)
    n = fd.ops.neg(xf)
    a = fd.ops.abs(n)
    t = fd.ops.sum(a)
    fd.add_output(fd.ops.add(fd.ops.mul(n, fd.ops.broadcast(t, [True, True])), xf))


K, R = "kernel", "reference"
# name -> (definition, inputs, [(kind, name)], substring of SegmentedFusion.why)
TABLE = {
    "adamw_two_params": (adamw_two_params, adamw_inputs,
                         [(K, "pointwise"), (K, "pointwise")], "unrelated shapes"),
    "softmax_column_sum": (softmax_column_sum, lambda: [torch.randn(12, 40)],
                           [(K, "inner_outer_persistent")], "column reductions"),
    "softmax_then_column_sum": (softmax_then_column_sum, lambda: [torch.randn(12, 40)],
                                [(K, "inner_persistent"), (K, "reduction")], "segment_set"),
    "layernorm_and_unrelated_sum": (layernorm_and_unrelated_sum,
                                    lambda: [torch.randn(9, 70), torch.randn(5, 33)],
                                    [(K, "inner_persistent"), (K, "reduction")],
                                    "no scheduler takes the whole fusion"),
    "segment_set_copy": (segment_set_copy, lambda: [torch.randn(6, 37)],
                         [(K, "pointwise"), (K, "pointwise")], "segment_set ends a segment"),
    "full_sum_between_kernels": (full_sum_between_kernels, lambda: [torch.randn(8, 33)],
                                 [(K, "reduction"), (K, "pointwise")],
                                 "is broadcast back to the reduced shape"),
    "inner_then_outer_reduction": (inner_then_outer_reduction, lambda: [torch.randn(5, 6, 70)],
                                   [(K, "reduction"), (K, "reduction")],
                                   "reductions over different dims"),
    "outer_product_of_row_sums": (outer_product_of_row_sums, lambda: [torch.randn(20, 9)],
                                  [(K, "reduction"), (K, "pointwise")], "roles"),
    "mean_then_full_sum": (mean_then_full_sum, lambda: [torch.randn(8, 33)],
                           [(K, "reduction"), (K, "reduction")], "reductions over different dims"),
    "flatten_through_segment_set": (flatten_through_segment_set, lambda: [torch.randn(8, 33)],
                                    [(K, "pointwise"), (K, "pointwise")], "segment_set"),
    "amax_scale": (amax_scale, lambda: [torch.randn(37, 203).bfloat16()],
                   [(K, "reduction"), (K, "pointwise")], "is broadcast back to the reduced shape"),
    "forwarded_chain_of_several_ops": (forwarded_chain_of_several_ops,
                                       lambda: [torch.randn(13, 71).half()],
                                       [(K, "reduction"), (K, "pointwise")],
                                       "is broadcast back to the reduced shape"),
}


def _define(fn):
    with FusionDefinition() as fd:
        fn(fd)
    return fd


@pytest.mark.parametrize("name", list(TABLE))
def test_segmentation(name):
    fn, _, want, why = TABLE[name]
    fd = _define(fn)
    seg = segment(fd.fusion)
    assert [(s.kind, s.name) for s in seg.segments] == want, str(seg)
    assert why in seg.why, str(seg)
    if len(want) == 1:
        # A fusion one scheduler takes stays whole: the fusion itself, no sub-fusion.
        assert seg.segments[0].fusion is fd.fusion
        return
    # Each op is in exactly one segment, but for forwarded ops (casts and the like of fusion
    # inputs), recomputed by every segment that reads them.
    covered = [e for s in seg.segments for e in s.exprs if e not in seg.forwarded]
    assert sorted(map(id, covered)) == sorted(
        id(e) for e in fd.fusion.exprs() if any(hasattr(o, "domain") for o in e.outputs)
        and e not in seg.forwarded)
    for e in seg.forwarded:
        readers = [s for s in seg.segments if e in s.exprs]
        assert readers and all(e.outputs[0] not in s.outputs for s in readers), str(seg)
    for s in seg.segments:
        assert s.why
        assert not all(is_cheap(e) for e in s.exprs), f"a segment of cheap ops only:\n{seg}"
        assert len(s.fusion.inputs) == len(s.inputs)
        assert len(s.fusion.outputs) == len(s.outputs)
    produced = set()
    for s in seg.segments:          # topological: a segment reads what earlier ones wrote
        for v in s.inputs[:len(s.inputs) - s.extent_inputs]:
            assert v in fd.fusion.inputs or v in produced
        produced |= set(s.outputs)
    assert set(fd.fusion.outputs) <= produced


@pytest.mark.parametrize("name", list(TABLE))
def test_plan_on_interpreter(name):
    fn, inputs, want, _ = TABLE[name]
    fd = _define(fn)
    refs = [k for k, _ in want].count(R)
    kernels = 0 if refs else len(want)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_and_check(fd, inputs(), kernels=kernels, options=INTERPRET,
                      segments=tuple(want) if len(want) > 1 else ())
    run = fd.last_run
    fallbacks = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallbacks) == refs, [str(w.message) for w in fallbacks]
    assert run.backend == "interpreter"
    assert not run.internal_error
    if len(want) > 1:
        assert run.kind == ("reference" if refs else "kernels")
        kernel_segs = [s for s in run.segments if s.kind == "kernel"]
        assert run.num_kernels == len(kernel_segs)
        assert run.schedulers == tuple(s.name for s in kernel_segs)
        assert run.kernel_names == tuple(s.run_info.kernel_names[0] for s in kernel_segs)
        assert {k.name for k in fd.kernels(last_run=True)} == set(run.kernel_names)
        # The intermediates between segments count as global traffic (none between AdamW's
        # independent updates).
        written = {o for s in segment(fd.fusion).segments for o in s.outputs}
        shared = any(v in written for s in segment(fd.fusion).segments for v in s.inputs)
        assert (run.workspace_bytes > 0) == shared


def test_reference_segment_warning_names_the_segment(monkeypatch, isolated_cache):
    refuse_full_reductions(monkeypatch)
    fd = _define(full_sum_between_kernels)
    assert [(s.kind, s.name) for s in segment(fd.fusion).segments] == [
        (K, "pointwise"), (R, "reference"), (K, "pointwise")]
    with pytest.warns(FallbackWarning, match=r"segment 1 \(ReductionOp\).*full reduction"):
        fd.execute([torch.randn(4, 5)], options=INTERPRET)
    assert fd.last_run.kind == "reference"
    assert "segment 1 (reference)" in fd.last_run.reason
    with pytest.raises(RuntimeError, match="segment 1.*fallback is disabled"):
        _define(full_sum_between_kernels).execute(
            [torch.randn(4, 5)], options={"enable": ["interpret"], "disable": ["reference_fallback"]})


def test_plan_is_cached_per_signature():
    fd = _define(adamw_two_params)
    x = adamw_inputs()
    fd.execute(x, options=INTERPRET)
    first = fd.last_run
    ex = fd._executor
    assert len(ex._plans) == 1
    fd.execute(x, options=INTERPRET)
    assert fd.last_run is first and len(ex._plans) == 1
    sub = [e for e in ex._segment_executors if e is not None]
    assert len(sub) == 2 and all(len(e._plans) == 1 for e in sub)
    y = [torch.randn(3, 4) for _ in range(3)] + [torch.randn(5, 6) for _ in range(3)]
    run_and_check(fd, y, kernels=2, options=INTERPRET)
    assert len(ex._plans) == 2
    # The intermediates are not kept by the plan between calls.
    plan = next(iter(ex._plans.values()))
    assert not any(hasattr(v, "shape") for v in plan.values)


def test_one_segment_fusion_keeps_the_single_kernel_plan():
    from pyfuser.runtime.executor import _InterpretPlan
    fd = _define(softmax_column_sum)
    run_and_check(fd, [torch.randn(8, 16)], kernels=1, options=INTERPRET)
    assert fd.last_run.segments == ()
    assert isinstance(next(iter(fd._executor._plans.values())), _InterpretPlan)
    assert fd._executor._segment_executors == []


def test_segment_set_is_identity_for_the_reference_evaluator():
    fd = _define(segment_set_copy)
    x = torch.randn(3, 4, dtype=torch.float32)
    (out,) = evaluate(fd.fusion, [x])
    torch.testing.assert_close(out, torch.exp(x) * 2)
    assert "segment_set(" in repr(fd.fusion)


def test_dump_segments(capsys):
    fd = _define(layernorm_and_unrelated_sum)
    fd.execute([torch.randn(4, 8), torch.randn(3, 5)],
               options={"enable": ["interpret"], "dump": ["segments"]})
    err = capsys.readouterr().err
    assert "===== segments: fusion =====" in err
    assert "2 segments: no scheduler takes the whole fusion" in err
    assert "segment 0: kernel inner_persistent" in err
    assert "segment 1: kernel reduction" in err


def test_reduction_result_of_bfloat16_feeds_a_second_segment():
    """An intermediate of a 16-bit dtype keeps its dtype between segments."""
    def fn(fd):
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16)
        s = fd.ops.cast(fd.ops.sum(fd.ops.cast(x, DataType.Float), [2]), DataType.BFloat16)
        fd.add_output(s)
        fd.add_output(fd.ops.max(s, [0]))
    fd = _define(fn)
    run_and_check(fd, [torch.randn(3, 5, 40, dtype=torch.bfloat16)], kernels=2,
                  options=INTERPRET, segments=((K, "reduction"), (K, "reduction")))


def test_a_forced_heuristic_on_a_plan_of_segments_is_a_clear_error():
    """A forced heuristic names one scheduler's parameters; a plan of several segments has a
    scheduler each. It used to reach every segment and fail with a TypeError in the one of
    another scheduler."""
    from pyfuser.options import OptionError
    from pyfuser.schedule.schedulers.pointwise import PointwiseParams
    fd = _define(adamw_two_params)
    with pytest.raises(OptionError, match="a plan of 2 segments"):
        fd.execute(adamw_inputs(), options={**INTERPRET, "heuristic": PointwiseParams()})


def test_a_kernel_segment_that_falls_back_hands_on_its_outputs_as_declared(monkeypatch):
    """Fuzz 20261202:28: segment 0, a kernel segment whose heuristic refused the call (a row of
    252588 elements does not fit registers), ran the reference evaluator and returned its
    intermediate in the input's permuted layout; segment 1 declares it dense in allocation
    order and raised an InputError out of fd.execute. The reduction scheduler now takes the
    max's segment with the broadcast sum as an input over kept and reduced dims, a kernel too
    large to interpret: refusing such inputs, as it did then, keeps the segmentation the
    regression needs."""
    from pyfuser.ir.tensor import TensorView
    from pyfuser.schedule.schedulers import reduction
    take = reduction.can_schedule

    def refuse_inputs_of_another_rank(fusion):
        rank = max(len(t.domain.logical) for t in fusion.tensors())
        if any(isinstance(v, TensorView) and 1 < len(v.domain.logical) < rank
               for v in fusion.inputs):
            return False, "an input of another rank (as before)"
        return take(fusion)
    monkeypatch.setattr(reduction, "can_schedule", refuse_inputs_of_another_rank)
    x = (torch.rand(1015770) + 0.5).bfloat16().as_strided((679, 4, 93), (1496, 3, 16))
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        v1 = fd.ops.cast(fd.ops.broadcast(t0, [False, False, True, False]), dtype=DataType.Bool)
        v2 = fd.ops.sum(v1, [-4, -3, -1], keepdim=True)
        v9 = fd.ops.div(v1, fd.ops.add(fd.ops.sigmoid(fd.ops.cast(v2, dtype=DataType.Float)),
                                       0.5))
        _, mean = fd.ops.var_mean(fd.ops.max(v9, [1]), [0, 1], keepdim=False, correction=0)
        fd.add_output(mean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, [x], kernels=0, options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error
    assert len(fd.last_run.segments) > 1


def test_a_segment_refusing_what_the_plan_hands_it_is_an_internal_error(monkeypatch):
    """The user's inputs are checked before a plan is made, so an InputError out of a segment
    is pyfuser's bug: it must not reach the user (or the fuzzer) as a complaint about their
    inputs."""
    from pyfuser.runtime import plan as plan_mod
    from pyfuser.runtime.inputs import InputError
    fd = _define(adamw_two_params)
    x = adamw_inputs()
    fd.execute(x, options=INTERPRET)
    sub = next(e for e in fd._executor._segment_executors if e is not None)

    def refuse(inputs, device=None):
        raise InputError("input 0: expected 2 dims")
    monkeypatch.setattr(sub, "plan_for", refuse)
    # Another option: a new plan of the whole fusion, whose first run asks the segment's
    # executor for its plan (later runs of a plan call the bound segment plans).
    with pytest.raises(plan_mod.SegmentPlanError, match="refused the tensors the plan") as info:
        fd.execute(x, options={"enable": ["interpret", "poison_outputs"]})
    assert not isinstance(info.value, InputError)


def test_amax_scale_forwards_the_cast_of_x():
    """Issue 16's amax then scale: the segments read x in bf16 and hand on the 0-dim amax
    only. Without forwarding the reduction kernel wrote x's fp32 cast for the pointwise kernel
    to read: 12 bytes an element moved instead of 6."""
    fd = _define(amax_scale)
    seg = segment(fd.fusion)
    assert [_name(e) for e in seg.forwarded] == ["cast", "abs"], str(seg)
    cast = seg.forwarded[0]
    assert all(cast in s.exprs for s in seg.segments), str(seg)
    x = fd.fusion.inputs[0]
    assert all(s.inputs[0] is x for s in seg.segments), str(seg)
    (amax,) = seg.segments[0].outputs
    assert all(i.is_broadcast for i in amax.domain.logical_no_reductions), str(seg)
    for shape in [(37, 203), (1, 1), (129, 7)]:
        run_and_check(fd, [torch.randn(*shape).bfloat16()], kernels=2, options=INTERPRET,
                      segments=((K, "reduction"), (K, "pointwise")))
        assert not fd.last_run.internal_error
    # Each plan (one per signature) hands on one fp32 amax: written by the reduction kernel and
    # read by the pointwise kernel.
    plans = list(fd._executor._plans.values())
    assert len(plans) == 3 and all(p.intermediate_bytes == 2 * 4 for p in plans)
    assert "forwarded" in str(seg) and "cast" in str(seg)


def _name(e):
    return e.op.value


def test_forwarding_stops_at_fusion_outputs_and_library_reads():
    """A forwarded op is recomputed, never written: one whose result is a fusion output, or
    is read by a library call, is an op of one segment (writing its result) as before."""
    def cast_is_an_output(fd):
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        fd.add_output(xf)
        fd.add_output(fd.ops.mul(xf, fd.ops.div(1.0, fd.ops.max(fd.ops.abs(xf)))))

    def cast_read_by_linear(fd):
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor([-1, -1])
        xf = fd.ops.cast(x, DataType.Float)
        fd.add_output(fd.ops.linear(fd.ops.neg(xf), w))
        fd.add_output(fd.ops.sum(xf, [1]))

    fd = _define(cast_is_an_output)
    seg = segment(fd.fusion)
    assert seg.forwarded == () and len(seg.segments) == 2, str(seg)
    run_and_check(fd, [torch.randn(9, 17).bfloat16()], kernels=2, options=INTERPRET,
                  segments=((K, "reduction"), (K, "pointwise")))

    fd = _define(cast_read_by_linear)
    seg = segment(fd.fusion)
    # The cast is forwarded, the neg the linear reads is not (a segment writes it).
    assert [_name(e) for e in seg.forwarded] == ["cast"], str(seg)
    linear = next(s for s in seg.segments if s.kind == "library")
    (neg,) = [v for v in linear.inputs if v not in fd.fusion.inputs]
    assert neg.definition.op.value == "neg"
    assert any(neg in s.outputs for s in seg.segments if s.kind == "kernel"), str(seg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, [torch.randn(6, 10).bfloat16(), torch.randn(5, 10)], kernels=0,
                      options=INTERPRET)
    assert not fd.last_run.internal_error
    assert all(s.kind != "reference" for s in fd.last_run.segments), fd.last_run


# Input views --------------------------------------------------------------------------------------
def _group_norm(n, c, h, w, groups, cast_first=True, stride_order=None, reshape_out=False):
    """GroupNorm's statistics and output over x [n, c, h, w] viewed as [n, groups, rest]: the
    reshape of cast(x) (or the cast of reshape(x)) is what the segmenter may take as a view."""
    def build(fd):
        x = fd.define_tensor([n, c, h, w], dtype=DataType.BFloat16, stride_order=stride_order)
        wt = fd.define_tensor([c])
        shape = [n, groups, c // groups * h * w]
        if cast_first:
            xg = fd.ops.reshape(fd.ops.cast(x, DataType.Float), shape)
        else:
            xg = fd.ops.cast(fd.ops.reshape(x, shape), DataType.Float)
        var, mean = fd.ops.var_mean(xg, [2], correction=0, keepdim=True)
        yg = fd.ops.mul(fd.ops.sub(xg, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        y = fd.ops.mul(fd.ops.reshape(yg, [n, c, h, w]),
                       fd.ops.broadcast(wt, [True, False, True, True]))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
        fd.add_output(fd.ops.squeeze(mean, [2]))
        if reshape_out:
            fd.add_output(xg)
    return build


@pytest.mark.parametrize("cast_first", [True, False])
def test_a_reshape_of_a_dense_input_is_a_view(cast_first, monkeypatch):
    """GroupNorm's reshape of x: a view segment (no kernel, no copy); the two kernels read x's
    bf16 bytes under the new shape and cast them themselves. Before, a pointwise kernel wrote
    x's fp32 copy for both to read (12 bytes an element moved, not 4)."""
    from pyfuser.runtime import plan as plan_module
    n, c, h, w, g = 2, 12, 3, 5, 3
    fd = _define(_group_norm(n, c, h, w, g, cast_first=cast_first))
    seg = segment(fd.fusion)
    assert [(s.kind, s.name) for s in seg.segments] == [
        ("view", "view"), (K, "inner_persistent"), (K, "pointwise")], str(seg)
    view = seg.segments[0]
    assert view.inputs == (fd.fusion.inputs[0],)
    for s in seg.segments[1:]:
        # The kernels declare the view as they get it: bf16, the cast is theirs.
        (read,) = [v for v, d in zip(s.inputs, s.fusion.inputs) if v is view.outputs[0]]
        declared = s.fusion.inputs[list(s.inputs).index(read)]
        assert declared.dtype == DataType.BFloat16
        assert any(getattr(e, "op", None) is not None and e.op.value == "cast"
                   and e.inputs[0] is declared for e in s.fusion.exprs()), str(s.fusion)
    views = []
    real = plan_module._RUNNERS["view"]

    def spy(seg, ins):
        out = real(seg, ins)
        views.append((ins[0], out[0]))
        return out
    monkeypatch.setitem(plan_module._RUNNERS, "view", spy)
    x = torch.randn(n, c, h, w).bfloat16()
    run_and_check(fd, [x, torch.rand(c) + 0.5], kernels=2, options=INTERPRET,
                  segments=(("view", "view"), (K, "inner_persistent"), (K, "pointwise")))
    assert not fd.last_run.internal_error
    ((src, out),) = views
    assert src is x and out.data_ptr() == x.data_ptr() and out.shape == (n, g, c // g * h * w)
    # What moves between segments: the fp32 mean and rstd [n, g, 1], written and read once.
    (p,) = fd._executor._plans.values()
    assert p.intermediate_bytes == 2 * 2 * n * g * 4


def test_no_view_of_an_input_not_dense_in_logical_order_nor_of_an_output():
    """A channels-last x's reshape would need a copy (torch.reshape's, or a kernel's: the
    segmenter keeps the kernel); a reshape that is itself a fusion output stays a kernel's
    result (the caller gets a tensor of its own, not an alias of its input); a fusion one
    scheduler takes whole reads its reshapes in its kernel."""
    n, c, h, w, g = 2, 12, 3, 5, 3
    inputs = [torch.randn(n, c, h, w).bfloat16(), torch.rand(c) + 0.5]
    for build, x in [
            (_group_norm(n, c, h, w, g, stride_order=[3, 0, 2, 1]),
             inputs[0].contiguous(memory_format=torch.channels_last)),
            (_group_norm(n, c, h, w, g, reshape_out=True), inputs[0])]:
        fd = _define(build)
        seg = segment(fd.fusion)
        assert all(s.kind != "view" for s in seg.segments), str(seg)
        run_and_check(fd, [x, inputs[1]], kernels=0, options=INTERPRET)
        assert fd.last_run.kind == "kernels" and not fd.last_run.internal_error

    def one_kernel(fd):
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.exp(fd.ops.reshape(fd.ops.cast(x, DataType.Float), [-1])))
    fd = _define(one_kernel)
    assert [s.kind for s in segment(fd.fusion).segments] == [K]
    run_and_check(fd, [torch.randn(5, 7).bfloat16()], kernels=1, options=INTERPRET)


def _permuted_operand(readers: str, stride_order=None, permute_out=False):
    """q @ permute(k) * scale (attention scores), permute(k) also read by a pointwise op
    where `readers` is "pointwise"."""
    def build(fd):
        q = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16)
        k = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16,
                             stride_order=stride_order)
        kt = fd.ops.permute(k, [0, 1, 3, 2])
        fd.add_output(fd.ops.mul(fd.ops.matmul(q, kt), 0.125))
        if readers == "pointwise":
            fd.add_output(fd.ops.exp(kt))
        if permute_out:
            fd.add_output(kt)
    return build


def test_a_permute_of_a_dense_input_read_by_a_matmul_is_a_view(monkeypatch):
    """Attention scores q @ k^T * scale with k^T a permute in the fusion: a view segment (k's
    memory under the permuted dims, no transpose kernel) and one matmul kernel reading it
    K-major; before, a transpose kernel wrote k^T for a library matmul and a pointwise
    kernel."""
    from pyfuser.runtime import plan as plan_module
    from pyfuser.schedule.schedulers import matmul
    fd = _define(_permuted_operand("matmul"))
    seg = segment(fd.fusion)
    assert [(s.kind, s.name) for s in seg.segments] == [("view", "view"), (K, "matmul")], \
        str(seg)
    (declared,) = [d for v, d in zip(seg.segments[1].inputs, seg.segments[1].fusion.inputs)
                   if v is seg.segments[0].outputs[0]]
    assert declared.domain.allocation is not None, "declared in k's order of dims"
    views = []
    real = plan_module._RUNNERS["view"]

    def spy(seg, ins):
        out = real(seg, ins)
        views.append((ins[0], out[0]))
        return out
    monkeypatch.setitem(plan_module._RUNNERS, "view", spy)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 72, 64, generator=g).bfloat16() for _ in range(2))
    run_and_check(fd, [q, k], kernels=1, options=INTERPRET,
                  segments=(("view", "view"), (K, "matmul")))
    ((src, out),) = views
    assert src is k and out.data_ptr() == k.data_ptr() and out.stride() == (13824, 4608, 1, 64)
    assert fd.last_run.heuristics[0].b_major == "K" and matmul.NAME in fd.last_run.schedulers


@pytest.mark.parametrize("case", ["pointwise", "output"])
def test_no_view_of_a_permute_read_by_other_ops_or_that_is_an_output(case):
    """A permute read by a pointwise op too (it reads the permuted dims element-wise: a
    transpose kernel writes them), or that is a fusion output (the caller's own tensor), stays
    a kernel's; the plan runs right."""
    fd = _define(_permuted_operand(case, permute_out=case == "output"))
    seg = segment(fd.fusion)
    assert all(s.kind != "view" for s in seg.segments), str(seg)
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, 72, 64, generator=g).bfloat16() for _ in range(2))
    run_and_check(fd, [q, k], kernels=0, options=INTERPRET)
    assert not fd.last_run.internal_error


def test_a_permute_of_a_strided_input_is_a_view_of_its_layout():
    """k declared [B, H, S, D] in the memory of [B, S, H, D] (a projection's output seen per
    head, as models pass it): its permute is still a view, declared with k's stride order
    renumbered; the matmul reads it and the plan runs right."""
    fd = _define(_permuted_operand("matmul", stride_order=[3, 1, 2, 0]))
    seg = segment(fd.fusion)
    assert [(s.kind, s.name) for s in seg.segments] == [("view", "view"), (K, "matmul")], \
        str(seg)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 72, 64, generator=g).bfloat16()
    k = torch.randn(2, 72, 3, 64, generator=g).bfloat16().transpose(1, 2)
    run_and_check(fd, [q, k], kernels=1, options=INTERPRET,
                  segments=(("view", "view"), (K, "matmul")))


def test_later_calls_of_a_plan_run_the_segment_plans_it_bound():
    """The first call binds each kernel segment's plan; later calls with the same signature
    run those plans directly (no segment executor's key and look-up: host time, measured at
    104 us per call for BatchNorm forward's three kernels), on their own inputs."""
    fd = _define(softmax_then_column_sum)
    a, b = torch.randn(37, 203), torch.randn(37, 203)
    fd.execute([a], options=INTERPRET)
    subs = [e for e in fd._executor._segment_executors if e is not None]
    assert len(subs) == 2

    def refuse(*args, **kwargs):
        raise AssertionError("a bound plan asked its segment executor again")
    for sub in subs:
        sub.run = sub.plan_for = refuse
    (plan,) = fd._executor._plans.values()
    assert plan.bound is not None and len(plan.bound) == 2
    for x in (b, a):
        out = fd.execute([x], options=INTERPRET)
        for o, r in zip(out, evaluate(fd.fusion, [x])):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cast_first", [True, False])
def test_a_gather_or_a_library_call_of_a_reshape_keeps_it_stored(cast_first):
    """The readers of a view of cast(x) cast it themselves; a gather's source and a library
    call's operand must be stored tensors, so such a reshape stays a kernel's output (GPU fuzz
    20261604:833: an index_select of reshape(cast(x)) ran the reference evaluator). A reshape
    of x itself is a view whoever reads it."""
    def gather_of_reshape(fd):
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        idx = fd.define_tensor([-1], dtype=DataType.Int)
        xf = fd.ops.cast(x, DataType.Float)
        flat = (fd.ops.reshape(xf, [-1]) if cast_first
                else fd.ops.cast(fd.ops.reshape(x, [-1]), DataType.Float))
        fd.add_output(fd.ops.index_select(flat, idx, 0))
        fd.add_output(fd.ops.sum(xf, [0]))

    def linear_of_reshape(fd):
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        rows = (fd.ops.reshape(xf, [-1, 8]) if cast_first
                else fd.ops.cast(fd.ops.reshape(x, [-1, 8]), DataType.Float))
        fd.add_output(fd.ops.linear(rows, fd.ops.cast(w, DataType.Float)))
        fd.add_output(fd.ops.sum(xf, [2]))

    for build, inputs in [
            (gather_of_reshape, [torch.randn(7, 9).bfloat16(), torch.tensor([0, 62, 5, 5])]),
            (linear_of_reshape, [torch.randn(3, 4, 8).bfloat16(), torch.randn(5, 8).bfloat16()])]:
        fd = _define(build)
        kinds = [s.kind for s in segment(fd.fusion).segments]
        assert ("view" in kinds) is not cast_first, kinds
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            run_and_check(fd, inputs, kernels=0, options=INTERPRET)
        assert fd.last_run.kind == "kernels" and not fd.last_run.internal_error, fd.last_run


@pytest.mark.parametrize("stride_order", [None, CHANNELS_LAST], ids=["nchw", "nhwc"])
def test_batchnorm_backward_is_a_reduction_kernel_then_a_pointwise_kernel(stride_order):
    """x_hat, a function of x and the [C] statistics, is forwarded: the reduction segment and
    the pointwise segment each compute it from x (it had been a pointwise kernel writing x_hat
    and dy * x_hat in fp32 for the others). sum(dy) and sum(dy * x_hat) share dy and are merged
    into one reduction kernel (they had been two, each reading dy). Four kernels had moved
    about 17 bytes per element; these two move 10. In channels-last the outer persistent
    scheduler takes the fusion whole where the image's rows fit on chip, so its plan is seen
    with that scheduler refused (as execute() replans where its heuristic refuses)."""
    fd = batchnorm_backward(stride_order)
    exclude = {"outer_persistent": "too many rows"} if stride_order else None
    seg = segment(fd.fusion, exclude)
    assert [(s.kind, s.name) for s in seg.segments] == [(K, "reduction"), (K, "pointwise")], \
        str(seg)
    assert {getattr(e, "op", None) and _name(e) or type(e).__name__ for e in seg.forwarded} == {
        "cast", "BroadcastOp", "sub", "mul"}, str(seg)
    red = seg.segments[0]
    assert sum(isinstance(e, ReductionOp) for e in red.exprs) == 2
    # Between the segments only [C] tensors: the two sums (scaled, broadcast).
    for v in seg.segments[1].inputs:
        assert v in fd.fusion.inputs or len(
            [i for i in v.domain.logical if not i.is_broadcast]) == 1, str(seg)
    if stride_order is None:
        g = torch.Generator().manual_seed(7)
        x, dy = (torch.randn(3, 5, 7, 9, generator=g).bfloat16() for _ in range(2))
        mean = x.float().mean((0, 2, 3))
        rstd = torch.rsqrt(x.float().var((0, 2, 3), unbiased=False) + 1e-5)
        w = torch.rand(5, generator=g) + 0.5
        run_and_check(fd, [x, dy, w, mean, rstd], kernels=2, options=INTERPRET,
                      segments=((K, "reduction"), (K, "pointwise")))


def test_a_view_read_through_a_forwarded_op_is_planned_before_its_reader():
    """fuzz 20263200:143: where(t3 > 0.5, t0, cast(reshape(t3))) beside an output of another
    size (two pointwise segments and a view). The cast is forwarded (each reader recomputes it),
    so the reader's group read the view's result only through it, and the segment order knew
    no edge from the view: the view segment ran after its reader, which got None."""
    t0, t2 = torch.rand(447).bfloat16() + 0.5, torch.rand(301) < 0.5
    t3 = torch.tensor([0.75])
    with FusionDefinition() as fd:
        x0, x2, x3 = fd.from_pytorch(t0), fd.from_pytorch(t2), fd.from_pytorch(t3)
        viewed = fd.ops.cast(fd.ops.reshape(x3, [1]), DataType.Half)
        fd.add_output(fd.ops.logical_not(x2))
        fd.add_output(fd.ops.where(fd.ops.gt(x3, 0.5), x0, viewed))
    segs = segment(fd.fusion).segments
    view = next(k for k, s in enumerate(segs) if s.kind == "view")
    reader = next(k for k, s in enumerate(segs) if segs[view].outputs[0] in s.inputs)
    assert view < reader, [s.kind for s in segs]
    run_and_check(fd, [t0, t2, t3], kernels=2, options=INTERPRET)


def test_a_library_segment_is_bound_to_its_plan_after_the_first_call(monkeypatch):
    """A library segment checked its inputs and evaluated the extents at every call (about 70
    us of host time per call on the H200's host: 4x eager's F.linear). Bound at the plan's
    first call (runtime/plan._LibraryRun), later calls run the op alone, and give the same
    results, laid out as a kernel writes them (a transposed matmul result made dense)."""
    from pyfuser.runtime import plan as plan_mod
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.ops.matmul(a, b)
        fd.add_output(y)
        fd.add_output(fd.ops.relu(y))
    opts = {"enable": ["interpret"], "disable": ["matmul_as_reduction"]}
    ins = [torch.randn(3, 8), torch.randn(8, 5)]
    run_and_check(fd, ins, kernels=1, options=opts)
    assert [s.kind for s in fd.last_run.segments] == ["library", "kernel"]
    fd.execute(ins, options=opts)     # the plan of these options (run_and_check's poison)
    calls = []
    checked = plan_mod.check_inputs
    monkeypatch.setattr(plan_mod, "check_inputs", lambda *a: calls.append(1) or checked(*a))
    for _ in range(3):
        x = [torch.randn(3, 8), torch.randn(8, 5)]
        out = fd.execute(x, options=opts)
        want = x[0] @ x[1]
        assert torch.allclose(out[0], want, atol=1e-5) and torch.allclose(out[1], want.relu(),
                                                                            atol=1e-5)
        assert out[0].stride() == (5, 1)
    assert not calls

"""take_along_axis, gather, index_select and embedding: gathers of the tensors they read
(frontend/indexing.py, ir.exprs.GatherOp). The reference evaluator against torch; generated
kernels on the interpreter against the float64 reference on odd sizes, int32 and int64 indices,
broadcast and computed indices, strided sources and empty indices; an index out of range is
IndexOutOfRange from the checked kernel (and the next call with good indices runs); what the
plans are (cross-entropy's loss and gradient in one normalization kernel, an embedding and its
normalization in one, a segment ending at a gather of a computed tensor); definition errors;
the kernels compile with NVRTC at the sizes of the issue's bars."""
import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import GatherOp
from pyfuser.runtime.index_check import IndexOutOfRange
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
F32, BF16 = DataType.Float, DataType.BFloat16


def _gathers(fd) -> list:
    return [e for e in fd.fusion.exprs() if isinstance(e, GatherOp)]


def _fusion(build, inputs):
    with FusionDefinition() as fd:
        build(fd, *[fd.from_pytorch(t) for t in inputs])
    return fd


X = torch.randn(37, 53)

# name -> (build, inputs, what torch computes)
CASES = {
    "index_select_dim0": (lambda fd, x, i: fd.add_output(fd.ops.index_select(x, i, 0)),
                          [X, torch.randint(0, 37, (11,))],
                          lambda x, i: torch.index_select(x, 0, i)),
    "index_select_dim1_int32": (lambda fd, x, i: fd.add_output(fd.ops.index_select(x, i, -1)),
                                [X, torch.randint(0, 53, (19,), dtype=torch.int32)],
                                lambda x, i: torch.index_select(x, 1, i)),
    "take_along_axis_rows": (lambda fd, x, i: fd.add_output(fd.ops.take_along_axis(x, i, 1)),
                             [X, torch.randint(0, 53, (37, 80))],
                             lambda x, i: torch.take_along_dim(x, i, 1)),
    "take_along_axis_broadcast_index": (
        lambda fd, x, i: fd.add_output(fd.ops.take_along_axis(x, i, 0)),
        [X, torch.randint(0, 37, (5, 1))], lambda x, i: torch.take_along_dim(x, i, 0)),
    "gather_smaller_index": (lambda fd, x, i: fd.add_output(fd.ops.gather(x, i, 1)),
                             [X, torch.randint(0, 53, (20, 7))],
                             lambda x, i: torch.gather(x, 1, i)),
    "gather_dim0": (lambda fd, x, i: fd.add_output(fd.ops.gather(x, i, 0)),
                    [X, torch.randint(0, 37, (50, 53))], lambda x, i: torch.gather(x, 0, i)),
    "embedding_2d_ids": (lambda fd, i, w: fd.add_output(fd.ops.embedding(i, w)),
                         [torch.randint(0, 100, (3, 5)), torch.randn(100, 24).bfloat16()],
                         torch.nn.functional.embedding),
    "strided_source": (lambda fd, x, i: fd.add_output(fd.ops.index_select(x, i, 1)),
                       [torch.randn(53, 37).t(), torch.randint(0, 53, (19,))],
                       lambda x, i: torch.index_select(x, 1, i)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_torch(name):
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    assert len(_gathers(fd)) == 1
    assert torch.equal(evaluate(fd.fusion, inputs)[0], want(*inputs))


@pytest.mark.parametrize("name", list(CASES))
def test_one_pointwise_kernel_on_the_interpreter(name):
    """Each op alone is one pointwise kernel whose values equal torch's exactly (a gather
    copies)."""
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    run_and_check(fd, inputs, scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute(inputs, options=INTERPRET)[0], want(*inputs))


@pytest.mark.parametrize("bad", [-1, 37, 1000])
def test_an_index_out_of_range_raises_and_the_next_call_runs(bad):
    """The checked kernel skips the read and reports the index; the executor raises
    IndexOutOfRange naming the op, the value and the size, as the reference does; a call with
    good indices afterwards gets the right result."""
    ids = torch.randint(0, 37, (11,))
    fd = _fusion(CASES["index_select_dim0"][0], [X, ids])
    wrong = ids.clone()
    wrong[7] = bad
    message = (f"index_select: index {bad} is out of range for dim 0 of size 37 "
               r"\(valid indices are 0 to 36\)")
    with pytest.raises(IndexOutOfRange, match=message):
        evaluate(fd.fusion, [X, wrong])
    with pytest.raises(IndexOutOfRange, match=message):
        fd.execute([X, wrong], options=INTERPRET)
    assert torch.equal(fd.execute([X, ids], options=INTERPRET)[0], X[ids])
    assert fd.last_run.kind == "kernels"
    with pytest.raises(IndexError):      # IndexOutOfRange is an IndexError, as torch raises
        fd.execute([X, wrong], options=INTERPRET)


def test_the_kernel_reports_out_of_range_indices():
    """The generated code checks the index against the dim it indexes and reports it; the
    index-error record is a workspace of the launch, named with the op for the message."""
    ids = torch.randint(0, 100, (3, 5))
    fd = _fusion(CASES["embedding_2d_ids"][0], [ids, torch.randn(100, 24)])
    seg, = fd.explain([ids, torch.randn(100, 24)], device="h100").segments
    cuda = seg.kernel.kernel.source
    assert re.search(r"pf_gi >= 0 && pf_gi < static_cast<long long>\(\w+\)", cuda), cuda
    assert "pf::report_index_error(&pf_index_error[0], &pf_index_report[0], 0, pf_gi)" in cuda
    launch = seg.kernel.kernel.launch
    assert [w[0] for w in launch.workspaces] == ["index_error", "index_report"]
    assert launch.index_checks[0][:2] == ("embedding", 0)


def test_a_size_1_dim_is_indexed_at_0():
    """x [5, 1] (its size-1 dim a broadcast) gathered along it, as torch allows: index 0 reads
    the one element, index 1 is out of range."""
    x, i = torch.randn(5, 1), torch.zeros(5, 3, dtype=torch.int64)
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.take_along_axis(a, b, 1)), [x, i])
    run_and_check(fd, [x, i], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([x, i], options=INTERPRET)[0], torch.take_along_dim(x, i, 1))
    with pytest.raises(IndexOutOfRange, match="index 1 is out of range for dim 1 of size 1"):
        fd.execute([x, i + 1], options=INTERPRET)


def test_an_index_computed_in_the_kernel():
    """The index may be computed in the kernel (ids - 1): an ordinary operand."""
    x, ids = X, torch.randint(1, 54, (19,))
    with FusionDefinition() as fd:
        tx, ti = fd.from_pytorch(x), fd.from_pytorch(ids)
        fd.add_output(fd.ops.index_select(tx, fd.ops.sub(ti, 1), 1))
    run_and_check(fd, [x, ids], scheduler="pointwise", options=INTERPRET)


def test_an_empty_index_gives_an_empty_output():
    ids = torch.zeros(0, dtype=torch.int64)
    fd = _fusion(CASES["index_select_dim0"][0], [X, ids])
    out, = fd.execute([X, ids], options=INTERPRET)
    assert out.shape == (0, 53)


def _cross_entropy(fd, x, t, m, v, cast_first: bool, grad: bool):
    """Cross-entropy of bf16 logits with int64 targets: the loss (logsumexp minus the target's
    logit through take_along_axis) and, with `grad`, dlogits = (softmax - one_hot) / M with
    the one-hot from an iota."""
    xf = fd.ops.cast(x, F32)
    mx = fd.ops.max(xf, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, mx))
    s = fd.ops.sum(e, [1], keepdim=True)
    lse = fd.ops.add(fd.ops.log(s), mx)
    t2 = fd.ops.broadcast_in_dim(t, [m, 1], [0])
    picked = (fd.ops.take_along_axis(xf, t2, 1) if cast_first
              else fd.ops.cast(fd.ops.take_along_axis(x, t2, 1), F32))
    fd.add_output(fd.ops.squeeze(fd.ops.sub(lse, picked), [1]))
    if grad:
        one_hot = fd.ops.eq(fd.ops.broadcast_in_dim(fd.ops.iota(v), [m, v], [1]), t2)
        g = fd.ops.sub(fd.ops.div(e, s), fd.ops.cast(one_hot, F32))
        fd.add_output(fd.ops.cast(fd.ops.mul(g, 1.0 / m), BF16))


@pytest.mark.parametrize("cast_first", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_cross_entropy_is_one_normalization_kernel(cast_first, grad):
    """The target's logit is read by a gather inside the row kernel; a gather of the float
    cast of the logits reads the logits and casts (frontend/indexing.py), so it does not end a
    segment at the cast. The loss alone is a one-pass logsumexp (schedule/logsumexp.py): a
    reduction kernel; with dlogits (the exp read again along the row), a normalization."""
    m, v = 37, 1001
    x, t = torch.randn(m, v).bfloat16(), torch.randint(0, v, (m,))
    with FusionDefinition() as fd:
        _cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v, cast_first, grad)
    assert all(g.src is fd.fusion.inputs[0] for g in _gathers(fd))
    run_and_check(fd, [x, t], scheduler="inner_persistent" if grad else "reduction",
                  options=INTERPRET)
    loss = torch.nn.functional.cross_entropy(x.float(), t, reduction="none")
    torch.testing.assert_close(fd.execute([x, t], options=INTERPRET)[0], loss)


@pytest.mark.parametrize("v", [32003, 128256])
def test_cross_entropy_rows_are_sized_by_the_logits_not_the_targets(v):
    """A row's register need counts the inputs along the row: the int64 targets [M] are one
    value per row. Counted as 8-byte row elements, a row of 32003 bf16 logits needed 128
    registers per thread and the fusion fell apart into 4 kernels (GPU run of e77178d)."""
    m = 129
    x = torch.empty(m, v, dtype=torch.bfloat16, device="meta")
    t = torch.empty(m, dtype=torch.int64, device="meta")
    with FusionDefinition() as fd:
        _cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v, True, True)
    plan = fd.explain([x, t], device="h100")
    assert [(s.kind, s.name, s.refused) for s in plan.segments] == \
        [("kernel", "inner_persistent", "")], plan


def test_embedding_and_its_layer_norm_are_one_kernel():
    """The normalization reads the gathered rows: the inner persistent scheduler recomputes
    the gather from the weight where it projects its buffer to the inputs."""
    ids, w = torch.randint(0, 100, (33,)), torch.randn(100, 72).bfloat16()
    with FusionDefinition() as fd:
        ti, tw = fd.from_pytorch(ids), fd.from_pytorch(w)
        rows = fd.ops.cast(fd.ops.embedding(ti, tw), F32)
        var, mean = fd.ops.var_mean(rows, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(rows, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(fd.ops.cast(y, BF16))
    run_and_check(fd, [ids, w], scheduler="inner_persistent", options=INTERPRET)


def test_a_gather_of_a_computed_tensor_ends_a_segment():
    """take_along_axis(softmax(x), t): the gather reads the softmax from global memory, so the
    plan is the softmax kernel, then the gather's: generated kernels only."""
    x, t = X, torch.randint(0, 53, (37, 1))
    with FusionDefinition() as fd:
        tx, tt = fd.from_pytorch(x), fd.from_pytorch(t)
        e = fd.ops.exp(tx)
        fd.add_output(fd.ops.take_along_axis(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                             tt, 1))
    run_and_check(fd, [x, t], kernels=2, options=INTERPRET,
                  segments=(("kernel", "inner_persistent"), ("kernel", "pointwise")))


def test_take_along_axis_checks_sizes_at_run_time():
    """take_along_axis needs the index's other dims equal to the input's (or broadcast); gather
    needs them at most the input's: symbolic sizes are checked on every call."""
    with FusionDefinition() as fd:
        x, i = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.take_along_axis(x, i, 1))
    with pytest.raises(InputError, match="take_along_axis: the index's dim 0"):
        fd.execute([torch.randn(4, 5), torch.zeros(3, 2, dtype=torch.int64)])
    with FusionDefinition() as fd:
        x, i = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.gather(x, i, 1))
    with pytest.raises(InputError, match=r"sizes do not fit at gather: .* 5 > 4"):
        fd.execute([torch.randn(4, 5), torch.zeros(5, 2, dtype=torch.int64)])
    out, = fd.execute([torch.randn(4, 5), torch.zeros(3, 2, dtype=torch.int64)],
                      options=INTERPRET)
    assert out.shape == (3, 2)


@pytest.mark.parametrize("call, message", [
    (lambda fd, x, i: fd.ops.index_select(x, fd.ops.cast(i, F32), 0),
     "index must be an integer tensor"),
    (lambda fd, x, i: fd.ops.index_select(x, fd.ops.broadcast(i, [False, True]), 0),
     "index must be 1-D"),
    (lambda fd, x, i: fd.ops.take_along_axis(x, i, 0), "index of rank 1 for an input of rank 2"),
    (lambda fd, x, i: fd.ops.index_select(x, i, 2), "dim 2 out of range for rank 2"),
    (lambda fd, x, i: fd.ops.index_select(fd.ops.sum(x), i, 0), "dim 0 out of range for rank 0"),
    (lambda fd, x, i: fd.ops.embedding(i, fd.ops.sum(x, [0])), "weight must be 2-D"),
    (lambda fd, x, i: fd.ops.gather(x, fd.ops.broadcast(i, [False, True]), 1),
     "the index's dim 0 has size 9, the input's dim 0 3; they must be at most"),
])
def test_indexing_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7], dtype=F32),
                 fd.define_tensor([9], dtype=DataType.Int))


def test_kernels_at_the_bar_sizes_compile():
    """Embedding of 8192 ids in [128256, 4096] and cross-entropy of [8192, 128256] bf16
    logits: NVRTC compiles each kernel for sm_90a without spills."""
    ids = torch.empty(8192, dtype=torch.int64, device="meta")
    w = torch.empty(128256, 4096, dtype=torch.bfloat16, device="meta")
    fd = _fusion(lambda fd, i, w: fd.add_output(fd.ops.embedding(i, w)), [ids, w])
    plans = [fd.explain([ids, w], device="h100", compile=True)]
    m, v = 8192, 128256
    x = torch.empty(m, v, dtype=torch.bfloat16, device="meta")
    t = torch.empty(m, dtype=torch.int64, device="meta")
    with FusionDefinition() as fd:
        _cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v, False, True)
    plans.append(fd.explain([x, t], device="h100", compile=True))
    for plan in plans:
        assert all(s.kind == "kernel" for s in plan.segments), plan
        for seg in plan.segments:
            assert re.search(r"registers, .*0 B spill stores, 0 B spill loads",
                             seg.kernel.ptxas), seg.kernel.ptxas


def test_the_report_is_read_without_waiting():
    """The GPU plan's check (runtime/index_check.DeferredIndexChecks) on a report as a kernel
    leaves it in host memory: a zero report passes; a failed one raises with the size the
    launch description gives for these inputs (saying it was found after its call, or not
    with wait_each's own call), and clears the report and the record for the launches to
    come."""
    import json

    from pyfuser.kir.launch import LaunchDescription
    from pyfuser.runtime.index_check import DeferredIndexChecks
    launch = LaunchDescription((), (), (1, 1, 1), (1, 1, 1), 0, False, None,
                               index_checks=(("take_along_axis", 1, ("extent", 0, 1)),))
    # As the disk cache stores it (JSON) and loads it back.
    assert LaunchDescription.from_json(json.loads(json.dumps(launch.to_json()))) == launch
    record, report = torch.tensor([1, -4]), torch.zeros(2, dtype=torch.int64)
    checks = DeferredIndexChecks(record, report, launch.index_checks, [53], "cpu")
    checks.settle()                         # the kernel has not reported (yet)
    report[:] = record
    with pytest.raises(IndexOutOfRange, match="take_along_axis: index -4 is out of range for "
                                              "dim 1 of size 53.*found after the call"):
        checks.settle()
    assert record.tolist() == [0, 0] and report.tolist() == [0, 0]
    checks.settle()
    report[:] = torch.tensor([1, 99])
    with pytest.raises(IndexOutOfRange, match=r"index 99 .* \(valid indices are 0 to 52\)$"):
        checks.settle(late=False)


def test_an_expanded_index_or_source_dim():
    """An expanded index dim (stride 0) is iterated to its expanded size: gather reads every
    row, not row 0 for all; take_along_axis of a [1, 7] input at a [6, 3] expanded index is
    [6, 3]. An expanded source dim indexed holds its expanded size of positions."""
    x = torch.randn(6, 7)
    i = torch.tensor([[1, 4, 2]]).expand(6, 3)
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.gather(a, b, 1)), [x, i])
    run_and_check(fd, [x, i], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([x, i], options=INTERPRET)[0], torch.gather(x, 1, i))
    x1 = torch.randn(1, 7)
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.take_along_axis(a, b, 1)), [x1, i])
    out, = fd.execute([x1, i], options=INTERPRET)
    assert torch.equal(out, torch.take_along_dim(x1, i, 1))
    xe = torch.randn(6, 1).expand(6, 7)
    j = torch.randint(0, 7, (6, 3))
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.gather(a, b, 1)), [xe, j])
    run_and_check(fd, [xe, j], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([xe, j], options=INTERPRET)[0], torch.gather(xe, 1, j))


def test_an_embedding_under_its_norm_stays_parallel():
    """The gather's source dims are paired with the output's (GatherOp.dim_map): the
    normalization's recomputed gather lines up with the rows, so its kernel has no serial
    per-thread loop over the row and no stack (it had a 256-element local array and 1 KB of
    stack, every thread gathering the whole row)."""
    ids = torch.empty(8192, dtype=torch.int64, device="meta")
    w = torch.empty(50257, 1024, dtype=torch.bfloat16, device="meta")
    with FusionDefinition() as fd:
        rows = fd.ops.cast(fd.ops.embedding(fd.from_pytorch(ids), fd.from_pytorch(w)), F32)
        var, mean = fd.ops.var_mean(rows, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(rows, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(fd.ops.cast(y, BF16))
    seg, = fd.explain([ids, w], device="h100", compile=True).segments
    assert seg.name == "inner_persistent"
    assert re.search(r" 0 B stack, 0 B spill stores", seg.kernel.ptxas), seg.kernel.ptxas


@pytest.mark.parametrize("dtype, cols, width", [(torch.bfloat16, 24, 8), (torch.float32, 56, 4)])
def test_embedding_rows_are_read_with_vectors(dtype, cols, width):
    """An embedding's index is one value along the row: each vector of the output is one
    16-byte read of one table row (base.vector_gathers), its index read once per vector, not
    once per lane (lower/indexing.py folds the lane out of the row division; lower/vectorize.py
    runs the index read once). Out-of-range ids still raise."""
    ids, w = torch.randint(0, 100, (13,)), torch.randn(100, cols).to(dtype)
    fd = _fusion(CASES["embedding_2d_ids"][0], [ids, w])
    seg, = fd.explain([ids, w], device="h100").segments
    assert seg.kernel.params.vector_gathers == (0,)
    cuda = seg.kernel.kernel.source
    body = cuda[cuda.index("__global__"):]
    assert re.search(rf"pf::load_global_vec<[^>]*>\(\*reinterpret_cast<pf::Array<[\w:]+, "
                     rf"{width}>\*>\(&T\d+\[0\]\), &T1\[", body), body
    assert f"j0 < {width}" not in body, body        # no loop over the lanes left
    run_and_check(fd, [ids, w], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([ids, w], options=INTERPRET)[0], w[ids])
    wrong = ids.clone()
    wrong[5] = 100
    with pytest.raises(IndexOutOfRange, match="embedding: index 100 is out of range"):
        fd.execute([wrong, w], options=INTERPRET)


def test_an_index_that_varies_along_the_row_is_read_per_element():
    """take_along_axis over dim 0 with an index [5, 56]: each element of a row reads another
    source row, so the gather is not read with vectors (the output's stores still are)."""
    x, i = torch.randn(37, 56), torch.randint(0, 37, (5, 56))
    fd = _fusion(CASES["take_along_axis_broadcast_index"][0], [x, i])
    seg, = fd.explain([x, i], device="h100").segments
    assert seg.kernel.params.vector == 4 and seg.kernel.params.vector_gathers == ()
    run_and_check(fd, [x, i], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([x, i], options=INTERPRET)[0], torch.take_along_dim(x, i, 0))


def test_a_row_extent_the_vectors_do_not_divide_is_refused():
    """A kernel whose vectors rely on rows of whole vectors (fusion.extent_multiples), forced
    onto rows of 12 elements with 8-wide vectors, is refused before the launch, not run with
    vectors across two rows."""
    from pyfuser.schedule.schedulers.pointwise import PointwiseParams
    ids, w = torch.randint(0, 100, (13,)), torch.randn(100, 12).bfloat16()
    fd = _fusion(CASES["embedding_2d_ids"][0], [ids, w])
    forced = PointwiseParams(vector=8)
    with pytest.raises(ValueError, match="needs an extent of 12 to be a multiple of 8"):
        fd.execute([ids, w], options={"enable": ["interpret"], "heuristic": forced})


def test_rows_of_a_wider_type_than_the_vector_takes_are_read_per_element():
    """A float64 table under float32 outputs: the loop's vectors hold 4 lanes, one float64
    access 2, so the gather is not read with vectors (its index would sit outside the inner
    access's loop, one per lane: fuzz 20261405:251, a LoweringError and the reference ran)."""
    ids, w = torch.randint(0, 7, (5,)), torch.randn(7, 48, dtype=torch.float64)
    with FusionDefinition() as fd:
        ti, tw = fd.from_pytorch(ids), fd.from_pytorch(w)
        fd.add_output(fd.ops.cast(fd.ops.embedding(ti, tw), F32))
    seg, = fd.explain([ids, w], device="h100").segments
    assert seg.kernel.params.vector == 4 and seg.kernel.params.vector_gathers == ()
    run_and_check(fd, [ids, w], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([ids, w], options=INTERPRET)[0], w[ids].float())


def test_a_forced_vector_gather_with_an_index_per_lane_runs_lane_by_lane():
    """A heuristic forcing vector reads onto a gather whose index varies along the row
    (take_along_axis over dim 0): lowering sees one index per lane and leaves the loop
    unrolled, each lane reading where it points, instead of one wrong vector."""
    from pyfuser.schedule.schedulers.pointwise import PointwiseParams
    x, i = torch.randn(37, 56), torch.randint(0, 37, (5, 56))
    fd = _fusion(CASES["take_along_axis_broadcast_index"][0], [x, i])
    forced = {"enable": ["interpret"], "heuristic": PointwiseParams(vector=4, vector_gathers=(0,))}
    assert torch.equal(fd.execute([x, i], options=forced)[0], torch.take_along_dim(x, i, 0))
    assert fd.last_run.kind == "kernels" and fd.last_run.backend == "interpreter"

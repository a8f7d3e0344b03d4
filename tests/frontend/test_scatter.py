"""scatter, scatter_add and index_add (frontend/indexing.py; ir.exprs.ScatterOp, IndexCheckOp).

The reference evaluator against torch on odd sizes, duplicate, negative and out-of-range
indices; the generated kernels on the interpreter against the float64 reference, and what ran:
a one-hot scatter is element-wise (iota, eq, where) in whatever kernel takes the ops around it
(pointwise, a cross-entropy's normalization), index_add and scatter_add are the scatter
scheduler's atomic adds (16-bit floats summed in float32, then a pointwise kernel that adds x
and casts back), other scatters run as torch's (a library segment); an index out of range is
IndexOutOfRange from the checked kernel; the kernels compile with NVRTC for sm_90a at the
issue's bar sizes without spills."""
import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import IndexCheckOp, ScatterOp
from pyfuser.runtime.index_check import IndexOutOfRange
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
F32, BF16 = DataType.Float, DataType.BFloat16


def _fusion(build, inputs):
    with FusionDefinition() as fd:
        build(fd, *[fd.from_pytorch(t) for t in inputs])
    return fd


def _ops(fd, kind) -> list:
    return [e for e in fd.fusion.exprs() if isinstance(e, kind)]


def _ints(*shape, hi=9, dtype=torch.float32):
    """Integer values in a float dtype: sums of them are exact in any order."""
    return torch.randint(-hi, hi + 1, shape).to(dtype)


def _dups(n_rows, n, dtype=torch.int64):
    """n indices into n_rows rows, every row hit several times when n >> n_rows."""
    return torch.randint(0, n_rows, (n,), dtype=dtype)


X = _ints(37, 53)

# name -> (build, inputs, what torch computes)
CASES = {
    "one_hot_tensor": (lambda fd, x, i, s: fd.add_output(fd.ops.scatter(x, i, s, 1)),
                       [X, torch.randint(0, 53, (37, 1)), _ints(37, 1)],
                       lambda x, i, s: x.scatter(1, i, s)),
    "one_hot_value_dim0": (lambda fd, x, i: fd.add_output(fd.ops.scatter(x, i, 2.5, 0)),
                           [X, torch.randint(0, 37, (1, 53))], lambda x, i: x.scatter(0, i, 2.5)),
    "one_hot_wide_source": (lambda fd, x, i, s: fd.add_output(fd.ops.scatter(x, i, s, -1)),
                            [X, torch.randint(0, 53, (37, 1)), _ints(37, 7)],
                            lambda x, i, s: x.scatter(1, i, s)),
    "scatter_no_duplicates": (
        lambda fd, x, i, s: fd.add_output(fd.ops.scatter(x, i, s, 1)),
        [X, torch.stack([torch.randperm(53)[:5] for _ in range(37)]), _ints(37, 5)],
        lambda x, i, s: x.scatter(1, i, s)),
    "scatter_add_duplicates": (
        lambda fd, x, i, s: fd.add_output(fd.ops.scatter_add(x, 1, i, s)),
        [X, torch.randint(0, 3, (37, 40)), _ints(37, 40)],
        lambda x, i, s: x.scatter_add(1, i, s)),
    "scatter_add_larger_source": (
        lambda fd, x, i, s: fd.add_output(fd.ops.scatter_add(x, 0, i, s)),
        [X, torch.randint(0, 37, (11, 53)), _ints(11, 53)],
        lambda x, i, s: x.scatter_add(0, i, s)),
    "index_add_rows": (lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, 0, i, s)),
                       [X, _dups(37, 301), _ints(301, 53)], lambda x, i, s: x.index_add(0, i, s)),
    "index_add_columns_alpha": (
        lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, -1, i, s, alpha=3)),
        [X, _dups(53, 17, torch.int32), _ints(37, 17)],
        lambda x, i, s: x.index_add(1, i.long(), s, alpha=3)),
    "index_add_int64": (lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, 0, i, s)),
                        [X.long(), _dups(37, 99), _ints(99, 53, dtype=torch.int64)],
                        lambda x, i, s: x.index_add(0, i, s)),
    "index_add_bool": (lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, 0, i, s)),
                       [X > 0, _dups(37, 19), _ints(19, 53) > 0],
                       lambda x, i, s: x.index_add(0, i, s)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_torch(name):
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    assert torch.equal(evaluate(fd.fusion, inputs)[0], want(*inputs))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("bad", [-1, "size", 10 ** 6])
def test_reference_raises_out_of_range(name, bad):
    """An index outside [0, size) of the dim written is IndexOutOfRange, naming the op, the
    value and the size, as the kernels raise it (torch raises its own error)."""
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    what = next(e.what for e in fd.fusion.exprs() if isinstance(e, (ScatterOp, IndexCheckOp)))
    dim = next(e.dim for e in fd.fusion.exprs() if isinstance(e, (ScatterOp, IndexCheckOp)))
    index = inputs[1].clone()
    size = inputs[0].shape[dim]
    value = size if bad == "size" else bad
    index.view(-1)[index.numel() // 2] = value
    wrong = [inputs[0], index] + inputs[2:]
    with pytest.raises(IndexOutOfRange, match=f"{what}: index {value} is out of range for dim "
                                              f"{dim} of size {size}"):
        evaluate(fd.fusion, wrong)
    with pytest.raises((RuntimeError, IndexError)):
        want(*wrong)


@pytest.mark.parametrize("name", ["one_hot_tensor", "one_hot_value_dim0", "one_hot_wide_source"])
def test_a_one_hot_is_element_wise(name):
    """Index of one element along dim, other dims x's: iota, eq and where with the index
    checked (IndexCheckOp), no ScatterOp: one pointwise kernel, equal to torch's."""
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    assert not _ops(fd, ScatterOp) and len(_ops(fd, IndexCheckOp)) == 1
    run_and_check(fd, inputs, scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute(inputs, options=INTERPRET)[0], want(*inputs))


def test_a_one_hot_of_a_wide_cast_source_reads_the_input():
    """A source wider than one element along dim is read at 0 by a gather, pushed through the
    cast as any gather is: one kernel reading the bf16 input (a gather of the cast, which the
    segmenter forwards into each segment, would have run on the reference: CPU fuzz
    20261123:1331)."""
    x, i, s = X, torch.randint(0, 53, (37, 1)), torch.randn(37, 5).bfloat16()
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.scatter(a, b, fd.ops.cast(c, F32), 1)),
                 [x, i, s])
    run_and_check(fd, [x, i, s], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(fd.execute([x, i, s], options=INTERPRET)[0], x.scatter(1, i, s.float()))


@pytest.mark.parametrize("bad", [-1, 53, 2 ** 40])
def test_a_one_hot_index_out_of_range_raises_and_the_next_call_runs(bad):
    build, inputs, want = CASES["one_hot_tensor"]
    fd = _fusion(build, inputs)
    wrong = inputs[1].clone()
    wrong[20, 0] = bad
    with pytest.raises(IndexOutOfRange, match=f"scatter: index {bad} is out of range for dim 1 "
                                              r"of size 53 \(valid indices are 0 to 52\)"):
        fd.execute([inputs[0], wrong, inputs[2]], options=INTERPRET)
    assert torch.equal(fd.execute(inputs, options=INTERPRET)[0], want(*inputs))
    assert fd.last_run.kind == "kernels"


def _cross_entropy(fd, x, t, m, v):
    """Cross-entropy's loss and dlogits = (softmax - one_hot) / m, the one-hot a scatter of
    1 into zeros at the targets (as a framework writes its backward)."""
    xf = fd.ops.cast(x, F32)
    mx = fd.ops.max(xf, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, mx))
    s = fd.ops.sum(e, [1], keepdim=True)
    t2 = fd.ops.broadcast_in_dim(t, [m, 1], [0])
    picked = fd.ops.take_along_axis(xf, t2, 1)
    fd.add_output(fd.ops.squeeze(fd.ops.sub(fd.ops.add(fd.ops.log(s), mx), picked), [1]))
    one_hot = fd.ops.scatter(fd.ops.zeros([m, v], F32), t2, 1.0, 1)
    g = fd.ops.sub(fd.ops.div(e, s), one_hot)
    fd.add_output(fd.ops.cast(fd.ops.mul(g, 1.0 / m), BF16))


def test_cross_entropy_with_a_scattered_one_hot_is_one_normalization_kernel():
    m, v = 37, 1001
    x, t = torch.randn(m, v).bfloat16(), torch.randint(0, v, (m,))
    with FusionDefinition() as fd:
        _cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v)
    run_and_check(fd, [x, t], scheduler="inner_persistent", options=INTERPRET)
    loss, dx = fd.execute([x, t], options=INTERPRET)
    xr = x.float().requires_grad_()
    want = torch.nn.functional.cross_entropy(xr, t, reduction="none")
    want.sum().div(m).backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(dx, xr.grad.bfloat16())


# name -> (build, inputs, the plan's segments)
KERNELS = {
    # An embedding's backward into zeros: the scatter kernel alone.
    "embedding_backward_f32": (
        lambda fd, i, g: fd.add_output(fd.ops.index_add(fd.ops.zeros([97, 24], F32), 0, i, g)),
        [_dups(97, 1001), torch.randn(1001, 24)], (("kernel", "scatter"),)),
    # bf16: float32 sums, then a pointwise kernel casting them back.
    "embedding_backward_bf16": (
        lambda fd, i, g: fd.add_output(fd.ops.index_add(fd.ops.zeros([97, 24], BF16), 0, i, g)),
        [_dups(97, 1001), torch.randn(1001, 24).bfloat16()],
        (("kernel", "scatter"), ("kernel", "pointwise"))),
    # x an input: sums into zeros, then x + sums.
    "index_add_fp16_into_x": (
        lambda fd, x, i, g: fd.add_output(fd.ops.index_add(x, 1, i, g)),
        [torch.randn(13, 31).half(), _dups(31, 77, torch.int32), torch.randn(13, 77).half()],
        (("kernel", "scatter"), ("kernel", "pointwise"))),
    "scatter_add_3d_dim0_int64": (
        lambda fd, x, i, s: fd.add_output(fd.ops.scatter_add(x, 0, i, s)),
        [torch.randint(-9, 9, (5, 3, 7)), torch.randint(0, 5, (9, 3, 7)),
         torch.randint(-9, 9, (9, 3, 7))], (("kernel", "scatter"), ("kernel", "pointwise"))),
    "scatter_add_int32_fewer_rows": (
        lambda fd, x, i, s: fd.add_output(fd.ops.scatter_add(x, 1, i, s)),
        [torch.randint(-9, 9, (6, 9), dtype=torch.int32), torch.randint(0, 9, (4, 5)),
         torch.randint(-9, 9, (4, 5), dtype=torch.int32)],
        (("kernel", "scatter"), ("kernel", "pointwise"))),
    "index_add_f64_computed": (
        lambda fd, i, g: fd.add_output(fd.ops.index_add(
            fd.ops.zeros([10, 3], DataType.Double), 0, fd.ops.sub(i, 1), fd.ops.mul(g, g))),
        [torch.randint(1, 11, (57,)), torch.randn(57, 3, dtype=torch.float64)],
        (("kernel", "scatter"),)),
    "index_add_1d": (lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, 0, i, s)),
                     [torch.randn(10), _dups(10, 333), torch.randn(333)],
                     (("kernel", "scatter"), ("kernel", "pointwise"))),
    "index_add_size_1_rows": (lambda fd, x, i, s: fd.add_output(fd.ops.index_add(x, 0, i, s)),
                              [torch.randn(10, 1), _dups(10, 33), torch.randn(33, 1)],
                              (("kernel", "scatter"), ("kernel", "pointwise"))),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_scatter_adds_are_atomic_add_kernels(name):
    """Duplicate indices add up; every kernel segment ran (no reference, no library)."""
    build, inputs, segments = KERNELS[name]
    fd = _fusion(build, inputs)
    assert len(_ops(fd, ScatterOp)) == 1
    run_and_check(fd, inputs, kernels=len(segments), segments=segments if len(segments) > 1
                  else None, scheduler="scatter" if len(segments) == 1 else None,
                  options=INTERPRET)


def test_a_one_hot_of_float8_is_a_selection():
    """float8 takes no arithmetic, but a one-hot is a selection (where): it runs, where
    torch's scatter has no float8 kernel."""
    x = torch.randn(9, 40).to(torch.float8_e4m3fn)
    i = torch.randint(0, 40, (9, 1))
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.scatter(a, b, 3.0, 1)), [x, i])
    out, = fd.execute([x, i], options=INTERPRET)
    assert fd.last_run.schedulers == ("pointwise",)
    want = x.float().scatter(1, i, 3.0).to(torch.float8_e4m3fn)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))


def test_outputs_beside_the_scatter_are_written_in_its_loop():
    """What is added (dy * 2, [I, D]) and an output of the index's dims ([I]) are outputs of
    the scatter's kernel too, each element written once (the interpreter checks it); a
    reduction beside it is a kernel of its own."""
    ids, dy = _dups(13, 301), torch.randn(301, 7)

    def build(fd, i, d, reduce):
        g = fd.ops.mul(d, 2.0)
        fd.add_output(fd.ops.index_add(fd.ops.zeros([13, 7], F32), 0, i, g))
        fd.add_output(g)
        fd.add_output(fd.ops.sum(d, [1]) if reduce else fd.ops.cast(i, DataType.Int32))
    fd = _fusion(lambda fd, i, d: build(fd, i, d, False), [ids, dy])
    run_and_check(fd, [ids, dy], scheduler="scatter", options=INTERPRET)
    fd = _fusion(lambda fd, i, d: build(fd, i, d, True), [ids, dy])
    run_and_check(fd, [ids, dy], kernels=2, options=INTERPRET,
                  segments=(("kernel", "scatter"), ("kernel", "reduction")))


def test_integer_sums_are_exact():
    x, i, s = torch.randint(-50, 50, (7, 11)), _dups(7, 500), torch.randint(-50, 50, (500, 11))
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.index_add(a, 0, b, c)), [x, i, s])
    assert torch.equal(fd.execute([x, i, s], options=INTERPRET)[0], x.index_add(0, i, s))


def test_16_bit_sums_are_float32_sums():
    """10000 adds of 1 into one bf16 element: a bf16 running sum stops at 256 (256 + 1 rounds
    to 256); the float32 sums give 10000, and bf16's nearest value to it."""
    n = 10000
    fd = _fusion(lambda fd, i, g: fd.add_output(
        fd.ops.index_add(fd.ops.zeros([2, 8], BF16), 0, i, g)),
        [torch.zeros(n, dtype=torch.int64), torch.ones(n, 8, dtype=torch.bfloat16)])
    out, = fd.execute([torch.zeros(n, dtype=torch.int64), torch.ones(n, 8, dtype=torch.bfloat16)],
                      options=INTERPRET)
    assert torch.equal(out[0], torch.full((8,), n, dtype=torch.bfloat16))
    assert torch.equal(out[1], torch.zeros(8, dtype=torch.bfloat16))


@pytest.mark.parametrize("bad", [-1, 97, 2 ** 40])
def test_a_scatter_index_out_of_range_raises_and_the_next_call_runs(bad):
    build, inputs, _ = KERNELS["embedding_backward_f32"]
    fd = _fusion(build, inputs)
    wrong = inputs[0].clone()
    wrong[500] = bad
    message = (f"index_add: index {bad} is out of range for dim 0 of size 97 "
               r"\(valid indices are 0 to 96\)")
    with pytest.raises(IndexOutOfRange, match=message):
        fd.execute([wrong, inputs[1]], options=INTERPRET)
    out, = fd.execute(inputs, options=INTERPRET)
    assert fd.last_run.kind == "kernels" and fd.last_run.schedulers == ("scatter",)
    torch.testing.assert_close(out, torch.zeros(97, 24).index_add(0, *inputs))


def test_the_kernel_adds_atomically_into_a_zeroed_output():
    """The CUDA adds with pf::atomic_add at the checked index, reports an index out of range;
    the launch says the output is zeroed before it (the executor's job)."""
    build, inputs, _ = KERNELS["embedding_backward_f32"]
    fd = _fusion(build, inputs)
    seg, = fd.explain(inputs, device="h100").segments
    cuda = seg.kernel.kernel.source
    assert re.search(r"if \(pf_gi >= 0 && pf_gi < static_cast<long long>\(97\)\) \{ "
                     r"pf::atomic_add\(&T\d+\[.*pf_gi \* T\d+_s0\)+\], ", cuda), cuda
    assert "pf::report_index_error(&pf_index_error[0], &pf_index_report[0], 0, pf_gi)" in cuda
    launch = seg.kernel.kernel.launch
    assert launch.zeroed_outputs == (0,)
    assert launch.index_checks[0][:2] == ("index_add", 0)


@pytest.mark.parametrize("name", ["scatter_no_duplicates", "index_add_bool"])
def test_other_scatters_run_as_torch_library_segments(name):
    """A scatter that stores (not a one-hot) and bool sums: torch's scatter_ / scatter_add_ as
    a library segment (named in RunInfo), never the reference evaluator."""
    build, inputs, want = CASES[name]
    fd = _fusion(build, inputs)
    out, = fd.execute(inputs, options=INTERPRET)
    assert torch.equal(out, want(*inputs))
    run = fd.last_run
    assert run.kind == "kernels" and run.segments[-1].kind == "library", run
    assert run.segments[-1].name == "scatter"
    assert "torch.Tensor.scatter" in run.segments[-1].why
    # (index_add's index broadcast over the source's rows is a pointwise kernel before it.)
    assert all(s.kind == "kernel" for s in run.segments[:-1]), run
    wrong = inputs[1].clone()
    wrong.view(-1)[0] = -5
    with pytest.raises(IndexOutOfRange, match=r"out of range for dim \d of size"):
        fd.execute([inputs[0], wrong] + inputs[2:], options=INTERPRET)


def test_an_empty_index_adds_nothing():
    x, i, s = torch.randn(10, 3), torch.zeros(0, dtype=torch.int64), torch.randn(0, 3)
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.index_add(a, 0, b, c)), [x, i, s])
    out, = fd.execute([x, i, s], options=INTERPRET)
    assert torch.equal(out, x) and fd.last_run.kind == "kernels"


def test_an_index_into_a_dim_of_size_0_raises():
    """Every index is out of range; the output has no element, so no kernel runs: the
    reference evaluator raises it, as torch does."""
    x, i, s = torch.randn(0, 3), torch.zeros(2, dtype=torch.int64), torch.randn(2, 3)
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.index_add(a, 0, b, c)), [x, i, s])
    with pytest.raises(IndexOutOfRange, match="index 0 is out of range for dim 0 of size 0"):
        fd.execute([x, i, s], options=INTERPRET)
    fd = _fusion(CASES["one_hot_tensor"][0], [torch.randn(4, 0), torch.zeros(4, 1,
                                              dtype=torch.int64), torch.randn(4, 1)])
    with pytest.raises(IndexOutOfRange, match="index 0 is out of range for dim 1 of size 0"):
        fd.execute([torch.randn(4, 0), torch.zeros(4, 1, dtype=torch.int64), torch.randn(4, 1)],
                   options=INTERPRET)


def test_sizes_are_checked_at_run_time():
    """index_add's source has x's sizes but along dim; scatter_add's index is at most x's
    along the other dims; symbolic sizes are checked on every call."""
    with FusionDefinition() as fd:
        x, i = fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.index_add(x, 0, i, fd.define_tensor([-1, -1])))
    with pytest.raises(InputError, match="index_add: the source's dim 1 and the input's dim 1"):
        fd.execute([torch.randn(4, 5), torch.zeros(3, dtype=torch.int64), torch.randn(3, 6)])
    with FusionDefinition() as fd:
        x, i = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.scatter_add(x, 1, i, fd.define_tensor([-1, -1])))
    with pytest.raises(InputError, match=r"sizes do not fit at scatter_add: .* 5 > 4"):
        fd.execute([torch.randn(4, 5), torch.zeros(5, 2, dtype=torch.int64), torch.randn(5, 2)])


@pytest.mark.parametrize("call, message", [
    (lambda fd, x, i: fd.ops.index_add(x, 0, fd.ops.cast(i, F32), x), "index must be an integer"),
    (lambda fd, x, i: fd.ops.index_add(x, 0, fd.ops.broadcast(i, [False, True]), x),
     "index must be 1-D"),
    (lambda fd, x, i: fd.ops.index_add(x, 0, i, fd.ops.cast(x, BF16)),
     "src T\\d+ is bfloat16 but the input T\\d+ is float32; they must have one dtype"),
    (lambda fd, x, i: fd.ops.scatter_add(x, 0, i, x), "index of rank 1 for an input of rank 2"),
    (lambda fd, x, i: fd.ops.scatter(x, fd.ops.broadcast(i, [False, True]), 1.0, 2),
     "dim 2 out of range for rank 2"),
    (lambda fd, x, i: fd.ops.index_add(fd.ops.cast(x, DataType.Int), 0, i,
                                       fd.ops.cast(x, DataType.Int), alpha=0.5),
     r"alpha 0.5 must be a number \(an int for an integer input\)"),
    (lambda fd, x, i: fd.ops.scatter_add(x, 0, fd.ops.broadcast(i, [False, True]),
                                         fd.ops.sum(x, [0], keepdim=True)),
     "the index's dim 0 and the source's dim 0 have sizes 9 and 1"),
    (lambda fd, x, i: fd.ops.scatter(fd.ops.cast(x, DataType.Float8_e4m3fn),
                                     fd.ops.broadcast(i, [False, True]), 1.0, 0),
     "only a one-hot scatter .* takes: torch has no other float8 scatter"),
    (lambda fd, x, i: fd.ops.index_add(fd.ops.cast(x, DataType.Float8_e4m3fn), 0, i,
                                       fd.ops.cast(x, DataType.Float8_e4m3fn)),
     "float8_e4m3fn, a storage type with no arithmetic"),
])
def test_scatter_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7], dtype=F32),
                 fd.define_tensor([9], dtype=DataType.Int))


def test_kernels_at_the_bar_sizes_compile():
    """An embedding's backward (8192 ids into [128256, 4096] bf16: float32 sums, then the cast)
    and cross-entropy with a scattered one-hot at [8192, 128256] bf16: NVRTC compiles each
    kernel for sm_90a without spills."""
    ids = torch.empty(8192, dtype=torch.int64, device="meta")
    dy = torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta")
    with FusionDefinition() as fd:
        ti, td = fd.from_pytorch(ids), fd.from_pytorch(dy)
        fd.add_output(fd.ops.index_add(fd.ops.zeros([128256, 4096], BF16), 0, ti, td))
    plans = [fd.explain([ids, dy], device="h100", compile=True)]
    assert [s.name for s in plans[0].segments] == ["scatter", "pointwise"]
    m, v = 8192, 128256
    x = torch.empty(m, v, dtype=torch.bfloat16, device="meta")
    t = torch.empty(m, dtype=torch.int64, device="meta")
    with FusionDefinition() as fd:
        _cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v)
    plans.append(fd.explain([x, t], device="h100", compile=True))
    for plan in plans:
        assert all(s.kind == "kernel" for s in plan.segments), plan
        for seg in plan.segments:
            assert re.search(r"registers, .*0 B spill stores, 0 B spill loads",
                             seg.kernel.ptxas), seg.kernel.ptxas


_DTYPES = {"float32": (torch.float32, F32), "bfloat16": (torch.bfloat16, BF16),
           "float16": (torch.float16, DataType.Half), "float64": (torch.float64, DataType.Double),
           "int32": (torch.int32, DataType.Int32), "int64": (torch.int64, DataType.Int)}


@pytest.mark.parametrize("dtype", list(_DTYPES))
def test_every_dtype_compiles(dtype):
    """index_add into zeros and a one-hot of every dtype the kernels take: each kernel compiles
    with NVRTC for sm_90a without spills, and the atomic add is one red.global.add of the sums'
    type (float32 for 16-bit floats)."""
    tdt, dt = _DTYPES[dtype]
    ids = torch.empty(1000, dtype=torch.int64, device="meta")
    g = torch.empty(1000, 96, dtype=tdt, device="meta")
    fd = _fusion(lambda fd, i, s: fd.add_output(fd.ops.index_add(fd.ops.zeros([77, 96], dt), 0,
                                                                 i, s)), [ids, g])
    plan = fd.explain([ids, g], device="h100", compile=True)
    x = torch.empty(65, 300, dtype=tdt, device="meta")
    t = torch.empty(65, 1, dtype=torch.int64, device="meta")
    fd = _fusion(lambda fd, a, b: fd.add_output(fd.ops.scatter(a, b, 3, 1)), [x, t])
    one_hot = fd.explain([x, t], device="h100", compile=True)
    assert [s.name for s in one_hot.segments] == ["pointwise"]
    sums = {torch.bfloat16: "float", torch.float16: "float", torch.float32: "float",
            torch.float64: "double", torch.int32: "int", torch.int64: "long long"}[tdt]
    scatter = plan.segments[0].kernel
    assert plan.segments[0].name == "scatter"
    assert re.search(rf"pf::atomic_add\(&T\d+\[.*\], pf::cast<{sums}>\(", scatter.kernel.source)
    for seg in list(plan.segments) + list(one_hot.segments):
        assert seg.kind == "kernel", plan
        assert re.search(r"registers, .*0 B spill stores, 0 B spill loads",
                         seg.kernel.ptxas), seg.kernel.ptxas

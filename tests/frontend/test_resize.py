"""slice, pad, cat, chunk and split: windows of the tensors they read (frontend/resize.py,
ir.exprs.WindowOp). The reference evaluator against torch; generated kernels on the interpreter
against the float64 reference on odd sizes, empty and clamped slices, steps and negative
indices; what the plans are (one kernel for RoPE's rotate-half and a chunked SwiGLU, a segment
ending at a window of a reduction); definition errors."""
import re

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import WindowOp
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
F32, BF16 = DataType.Float, DataType.BFloat16


def _windows(fd) -> list:
    return [e for e in fd.fusion.exprs() if isinstance(e, WindowOp)]


@pytest.mark.parametrize("starts, ends, steps", [
    ([1, 3], [5, -2], [1, 2]), ([0, -7], [9, 100], [3, 1]), ([4, 2], [4, 9], [1, 1]),
    ([-100, 0], [2, 1], [1, 5]), ([2, 5], [1, 30], [1, 4])])
def test_slice_matches_python_indexing(starts, ends, steps):
    x = torch.randn(9, 29)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=F32)
        fd.add_output(fd.ops.slice(tx, starts, ends, steps))
    want = x[starts[0]:ends[0]:steps[0], starts[1]:ends[1]:steps[1]]
    got = evaluate(fd.fusion, [x])[0]
    assert got.shape == want.shape and torch.equal(got, want)
    run_and_check(fd, [x], kernels=None if want.numel() == 0 else 1, options=INTERPRET)


def test_slice_of_a_static_input_has_static_extents():
    x = torch.randn(6, 40)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        fd.add_output(fd.ops.slice(tx, [0, 8], [6, 40], [1, 2]))
    assert [i.extent.value for i in fd.fusion.outputs[0].domain.logical] == [6, 16]
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)


@pytest.mark.parametrize("widths, value", [([2, 1], 0.0), ([0, 3, 4, 0], -1.5),
                                            ([-2, 3, 1, -1], 2.0), ([1, 1, 1, 1], None)])
def test_pad_matches_torch(widths, value):
    x = torch.randn(7, 13)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=F32)
        fd.add_output(fd.ops.pad(tx, widths, value))
    want = F.pad(x, widths, value=0.0 if value is None else value)
    torch.testing.assert_close(evaluate(fd.fusion, [x])[0], want)
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)


def test_cat_of_three_along_the_last_dim_and_of_two_along_the_first():
    a, b, c = torch.randn(5, 3), torch.randn(5, 17), torch.randn(5, 1)
    with FusionDefinition() as fd:
        ta, tb, tc = (fd.define_tensor([-1, -1], dtype=F32) for _ in range(3))
        fd.add_output(fd.ops.cat([ta, tb, tc], -1))
    torch.testing.assert_close(evaluate(fd.fusion, [a, b, c])[0], torch.cat([a, b, c], -1))
    run_and_check(fd, [a, b, c], scheduler="pointwise", options=INTERPRET)
    with FusionDefinition() as fd:
        ta, tb = (fd.define_tensor([-1, -1], dtype=F32) for _ in range(2))
        fd.add_output(fd.ops.cat([ta, fd.ops.exp(tb)], 0))
    a, b = torch.randn(4, 33), torch.randn(9, 33)
    run_and_check(fd, [a, b], scheduler="pointwise", options=INTERPRET)


def _rope(fd, q, cos, sin):
    """q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2])."""
    d = q.domain.logical[-1].extent.value
    full = [i.extent for i in q.domain.logical]
    x1 = fd.ops.slice(q, [0, 0, 0, 0], full[:3] + [d // 2])
    x2 = fd.ops.slice(q, [0, 0, 0, d // 2], full)
    rot = fd.ops.cat([-x2, x1], -1)
    c = fd.ops.broadcast(cos, [True, False, True, False])
    s = fd.ops.broadcast(sin, [True, False, True, False])
    return q * c + rot * s


def test_rope_rotate_half_is_one_kernel():
    q = torch.randn(2, 5, 3, 16)
    cos, sin = torch.randn(5, 16), torch.randn(5, 16)
    with FusionDefinition() as fd:
        tq = fd.from_pytorch(q, static_sizes=True)
        tc, ts = fd.from_pytorch(cos), fd.from_pytorch(sin)
        fd.add_output(_rope(fd, tq, tc, ts))
    want = q * cos[None, :, None] + torch.cat([-q[..., 8:], q[..., :8]], -1) * sin[None, :, None]
    torch.testing.assert_close(evaluate(fd.fusion, [q, cos, sin])[0], want)
    # Both halves read q in place: the windows reach the input through the negation.
    assert all(w.src is fd.fusion.inputs[0] for w in _windows(fd))
    run_and_check(fd, [q, cos, sin], scheduler="pointwise", options=INTERPRET)


def test_rope_reads_its_windows_with_vector_loads():
    """Both halves of q are read 8 bf16 at a time: the cat's parts start at multiples of 8."""
    q = torch.empty(4, 2048, 32, 128, dtype=torch.bfloat16, device="meta")
    cs = torch.empty(2048, 128, device="meta")
    with FusionDefinition() as fd:
        tq = fd.from_pytorch(q, static_sizes=True)
        fd.add_output(fd.ops.cast(_rope(fd, tq, fd.from_pytorch(cs), fd.from_pytorch(cs)), BF16))
    seg, = fd.explain([q, cs, cs], device="h100", compile=True).segments
    params = seg.kernel.params
    assert params.vector == 8 and params.vector_windows == (0, 1), params
    # The guarded vector reads compile (NVRTC for sm_90a) without spills.
    assert re.search(r"registers, .*0 B spill stores, 0 B spill loads", seg.kernel.ptxas), \
        seg.kernel.ptxas


def test_a_window_of_an_input_defined_with_a_size_one_dim_innermost():
    """Fuzz 20263012:501: x [1, N] defined with stride order [0, 1] (its size-1 dim innermost),
    sliced along N, in a loop vectorized by 2: the scheduler reads the window along N (N is the
    stride-1 dim in the call), but the source kept its definition's layout, so lowering's lane
    check refused the vector read (a LoweringError, then the reference). The window's source
    now gets the layout its reads assume, as a vector input does."""
    x = torch.randn(12).as_strided((1, 12), (1, 1))
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float,
                             stride_order=[0, 1])
        fd.add_output(fd.ops.erf(fd.ops.slice(t, [0, 0], [1, 12], [1, 1])))
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)
    params = fd.last_run.heuristics[0]
    assert params.vector > 1 and params.vector_windows == (0,), params


@pytest.mark.parametrize("widths", [(8, 16), (12, 20)])
def test_vector_reads_of_a_cat_on_the_interpreter(widths):
    """Cats 24 and 32 wide, both in loops vectorized by 8: parts 8 and 16 wide are read whole
    vectors at a time (guards at multiples of 8); parts 12 and 20 wide element by element."""
    a = torch.randn(37, widths[0]).bfloat16()
    b = torch.randn(37, widths[1]).bfloat16()
    with FusionDefinition() as fd:
        ta, tb = fd.from_pytorch(a, static_sizes=True), fd.from_pytorch(b, static_sizes=True)
        fd.add_output(fd.ops.cat([ta, -tb], 1))
    run_and_check(fd, [a, b], scheduler="pointwise", options=INTERPRET)
    params = fd.last_run.heuristics[0]
    assert params.vector == 8
    assert params.vector_windows == ((0, 1) if widths[0] % 8 == 0 else ()), params
    assert torch.equal(fd.execute([a, b], options=INTERPRET)[0], torch.cat([a, -b], 1))


def test_clamped_extents_of_a_symbolic_slice_compile():
    """The extent of x[..., 92:-13] with x's sizes symbolic is max(0, max(0, n - 13) -
    min(92, n)): printed with CUDA's max/min (an int literal and an int64 extent), NVRTC found
    the calls ambiguous (GPU fuzz 20261345:729 and :515). Every kernel of the plan compiles."""
    x = torch.empty_strided((512, 1, 128), (128, 128, 1), dtype=torch.bfloat16, device="meta")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        v = fd.ops.segment_set(fd.ops.slice(fd.ops.sigmoid(t0), [None, None, 92],
                                            [None, None, -13]))
        fd.add_output(v)
        fd.add_output(fd.ops.max(v, [-3, -2, -1]))
    plan = fd.explain([x], device="h100", compile=True)
    # The squeeze of the [512, 1, 23] slice is the full reduction's prologue (its input has
    # more dims than the reduction's, all of them reduced).
    assert [(s.kind, s.name) for s in plan.segments] == [
        ("kernel", "pointwise"), ("kernel", "reduction")]
    for seg in plan.segments:
        assert "registers" in seg.kernel.ptxas, seg


def test_chunked_swiglu_is_one_kernel():
    x = torch.randn(7, 2 * 37)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        a, b = fd.ops.chunk(tx, 2, -1)
        fd.add_output(fd.ops.silu(a) * b)
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)
    torch.testing.assert_close(fd.execute([x], options=INTERPRET)[0],
                               F.silu(x[:, :37]) * x[:, 37:])


def test_chunk_of_an_empty_slice_is_chunks_empty_pieces():
    """torch.chunk of an empty dim gives `chunks` empty pieces; chunk stepped through the dim
    by its piece size, 0 there, and raised range()'s ValueError (an internal error)."""
    x = torch.randn(5, 3)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        for piece in fd.ops.chunk(fd.ops.slice(tx, [2, 0], [2, 3]), 3, 0):
            fd.add_output(fd.ops.mul(piece, 2.0))
    assert [g.shape for g in evaluate(fd.fusion, [x])] == [p.shape for p in torch.chunk(x[2:2], 3)]


@pytest.mark.parametrize("sizes", [4, 7, [3, 0, 7], [10]])
def test_split_matches_torch(sizes):
    """torch.split's two forms: pieces of a size (the last shorter) or listed sections."""
    x = torch.randn(5, 10)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        for piece in fd.ops.split(tx, sizes, 1):
            fd.add_output(fd.ops.mul(piece, 2.0))
    want = [p * 2 for p in torch.split(x, sizes, 1)]
    got = evaluate(fd.fusion, [x])
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(fd.execute([x], options=INTERPRET), want):
        torch.testing.assert_close(g, w)


def test_a_normalization_of_a_slice():
    x = torch.randn(6, 300)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=F32)
        s = fd.ops.slice(tx, [0, 10], [tx.domain.logical[0].extent, 290])
        fd.add_output(fd.ops.div(fd.ops.exp(s), fd.ops.sum(fd.ops.exp(s), [1], keepdim=True)))
    run_and_check(fd, [x], scheduler="inner_persistent", options=INTERPRET)


def test_a_window_of_a_reduction_ends_a_segment():
    """A slice of a row sum: the sum is written by one kernel and sliced by the next."""
    x = torch.randn(11, 40)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=F32)
        fd.add_output(fd.ops.pad(fd.ops.sum(tx, [1]), [1, 2], 7.0))
    run_and_check(fd, [x], kernels=2, options=INTERPRET,
                  segments=(("kernel", "reduction"), ("kernel", "pointwise")))


def test_pad_of_a_pad_and_slice_of_a_pad_are_one_window():
    x = torch.randn(5, 6)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=F32)
        p = fd.ops.pad(fd.ops.pad(tx, [1, 2], 3.0), [2, 0], 3.0)
        fd.add_output(fd.ops.slice(p, [1, 1], [4, 9]))
    want = F.pad(F.pad(x, [1, 2], value=3.0), [2, 0], value=3.0)[1:4, 1:9]
    torch.testing.assert_close(evaluate(fd.fusion, [x])[0], want)
    window, = _windows(fd)
    assert window.src is fd.fusion.inputs[0]
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)


def test_cat_of_a_padded_tensor_is_one_kernel():
    """The pad's fill (-3) and the cat's (0) differ: one read of a through both windows with
    the pad's fill, and a mask selecting the cat's around it."""
    a, b = torch.randn(17, 3), torch.randn(17, 10)
    with FusionDefinition() as fd:
        ta, tb = fd.define_tensor([-1, -1], dtype=F32), fd.define_tensor([-1, -1], dtype=F32)
        fd.add_output(fd.ops.cat([fd.ops.pad(ta, [2, 5], -3.0), fd.ops.exp(tb)], 1))
    run_and_check(fd, [a, b], scheduler="pointwise", options=INTERPRET)
    torch.testing.assert_close(fd.execute([a, b], options=INTERPRET)[0],
                               torch.cat([F.pad(a, [2, 5], value=-3.0), b.exp()], 1))


def test_bf16_cat_promotes_and_bool_pad_fills_false():
    a, b = torch.randn(3, 5).bfloat16(), torch.randn(3, 4)
    with FusionDefinition() as fd:
        ta, tb = fd.define_tensor([-1, -1], dtype=BF16), fd.define_tensor([-1, -1], dtype=F32)
        fd.add_output(fd.ops.cat([ta, tb], 1))
        fd.add_output(fd.ops.pad(fd.ops.gt(tb, 0.0), [1, 1]))
    out = evaluate(fd.fusion, [a, b])
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.bool
    torch.testing.assert_close(out[1], F.pad(b > 0, [1, 1]))
    run_and_check(fd, [a, b], kernels=None, options=INTERPRET)


@pytest.mark.parametrize("call, message", [
    (lambda fd, x: fd.ops.slice(x, [0], [1]), "1 start_indices for T0 of rank 2"),
    (lambda fd, x: fd.ops.slice(x, [0, 0], [1, 1], [1, 0]), "stride 0 of dim 1"),
    (lambda fd, x: fd.ops.slice(x, [0, 0.5], [1, 1]), "index 0.5 of dim 1"),
    (lambda fd, x: fd.ops.pad(x, [1]), "give pairs"),
    (lambda fd, x: fd.ops.pad(x, [1, 1.5]), "width 1.5"),
    (lambda fd, x: fd.ops.pad(x, [-4, -4]), "negative size"),
    (lambda fd, x: fd.ops.cat([x, fd.ops.sum(x, [0])], 0), "different ranks"),
    (lambda fd, x: fd.ops.cat([x, x], 2), "dim 2 out of range"),
    (lambda fd, x: fd.ops.chunk(fd.define_tensor([-1, -1]), 2, 1), "static size"),
    (lambda fd, x: fd.ops.split(fd.define_tensor([-1, -1]), 2, 1), "static size"),
    (lambda fd, x: fd.ops.split(fd.from_pytorch(torch.empty(3, 7), static_sizes=True), [3, 3],
                                1), r"add\s+up to the dim's size 7"),
    (lambda fd, x: fd.ops.split(fd.from_pytorch(torch.empty(3, 7), static_sizes=True), 0, 1),
     "must be >= 1"),
])
def test_resize_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7], dtype=F32))


def test_reshape_of_symbolic_sizes_to_all_ones_broadcasts():
    """reshape(x [N], [1]) with N symbolic (1 at run time) is a size-1 dim that broadcasts, as
    in torch: it is the window [0, 1) of x, the element count checked to be 1. It kept the
    symbolic extent N, which then did not broadcast against [241] (fuzz 20261372:409,
    20261374:96: a run-time InputError)."""
    x, y = torch.randn(1), torch.randn(241)
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor([-1]), fd.define_tensor([-1])
        fd.add_output(fd.ops.add(fd.ops.reshape(fd.ops.sigmoid(t0), [1]), t1))
    run_and_check(fd, [x, y], scheduler="pointwise", options=INTERPRET)
    with pytest.raises(InputError, match="reshape element count"):
        fd.execute([torch.randn(2), y], options=INTERPRET)
    x2 = torch.randn(1, 1)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.reshape(fd.define_tensor([-1, -1]), [1, 1, 1]))
    assert torch.equal(fd.execute([x2], options=INTERPRET)[0], x2.reshape(1, 1, 1))

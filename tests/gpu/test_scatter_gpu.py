"""scatter, scatter_add and index_add on the GPU against float64, outputs poisoned (NaN, then
the scatter's outputs zeroed by the executor before its atomic adds): a one-hot scatter in the
kernel of the ops around it (pointwise; cross-entropy's loss and gradient in one normalization
kernel), index_add and scatter_add as the scatter scheduler's atomic adds with duplicate
indices (float32, bfloat16 through float32 sums, int64 exact, float64), the plan's buffers
zeroed again on the next call (no sums carried over); an index out of range raises
IndexOutOfRange from the checked kernel and the context lives on; other scatters as torch's
library segment; an embedding's backward at the bar's size."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition, check_index_errors
from pyfuser.runtime.index_check import IndexOutOfRange
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16 = DataType.Float, DataType.BFloat16


def _fusion(build, inputs):
    with FusionDefinition() as fd:
        build(fd, *[fd.from_pytorch(t) for t in inputs])
    return fd


def _segments(fd):
    return [(s.kind, s.name) for s in fd.last_run.segments]


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_a_one_hot_scatter_is_one_pointwise_kernel(index_dtype):
    x = torch.randn(1031, 777, device="cuda")
    i = torch.randint(0, 777, (1031, 1), device="cuda", dtype=index_dtype)
    s = torch.randn(1031, 1, device="cuda")
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.scatter(a, b, c, 1)), [x, i, s])
    run_and_check(fd, [x, i, s], scheduler="pointwise")
    assert torch.equal(fd.execute([x, i, s])[0], x.scatter(1, i.long(), s))


def test_cross_entropy_with_a_scattered_one_hot_in_one_kernel():
    m, v = 129, 32003
    x = torch.randn(m, v, device="cuda").bfloat16()
    t = torch.randint(0, v, (m,), device="cuda")
    with FusionDefinition() as fd:
        tx, tt = fd.from_pytorch(x), fd.from_pytorch(t)
        xf = fd.ops.cast(tx, F32)
        mx = fd.ops.max(xf, [1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(xf, mx))
        s = fd.ops.sum(e, [1], keepdim=True)
        t2 = fd.ops.broadcast_in_dim(tt, [m, 1], [0])
        picked = fd.ops.take_along_axis(xf, t2, 1)
        fd.add_output(fd.ops.squeeze(fd.ops.sub(fd.ops.add(fd.ops.log(s), mx), picked), [1]))
        one_hot = fd.ops.scatter(fd.ops.zeros([m, v], F32), t2, 1.0, 1)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.sub(fd.ops.div(e, s), one_hot), 1.0 / m),
                                  BF16))
    run_and_check(fd, [x, t], scheduler="inner_persistent")
    loss, dx = fd.execute([x, t])
    xr = x.float().requires_grad_()
    want = torch.nn.functional.cross_entropy(xr, t, reduction="none")
    want.sum().div(m).backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(dx, xr.grad.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_an_embedding_backward_with_duplicate_ids(dtype):
    """dweight[ids[i], :] += dy[i, :]: 8191 ids into 1031 rows (each row about 8 times); the
    second call with other ids starts from zeros again (the executor zeroes the sums)."""
    rows, n, d = 1031, 8191, 257
    ids = torch.randint(0, rows, (n,), device="cuda")
    dy = (torch.randint(-8, 9, (n, d), device="cuda").to(dtype) if not dtype.is_floating_point
          else torch.randn(n, d, device="cuda").to(dtype))
    dt = {torch.float32: F32, torch.bfloat16: BF16, torch.float64: DataType.Double,
          torch.int64: DataType.Int}[dtype]
    fd = _fusion(lambda fd, i, g: fd.add_output(fd.ops.index_add(fd.ops.zeros([rows, d], dt), 0,
                                                                 i, g)), [ids, dy])
    segments = ([("kernel", "scatter"), ("kernel", "pointwise")] if dtype == torch.bfloat16
                else [])
    for _ in range(3):
        run_and_check(fd, [ids, dy], kernels=len(segments) or 1,
                      scheduler=None if segments else "scatter")
        assert _segments(fd) == segments
        ids = torch.randint(0, rows, (n,), device="cuda")


def test_scatter_add_into_an_input():
    x = torch.randn(513, 300, device="cuda").half()
    i = torch.randint(0, 300, (513, 1000), device="cuda")
    s = torch.randn(513, 1000, device="cuda").half()
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.scatter_add(a, 1, b, c)), [x, i, s])
    run_and_check(fd, [x, i, s], kernels=2)
    assert _segments(fd) == [("kernel", "scatter"), ("kernel", "pointwise")]


def test_an_index_out_of_range_raises_and_the_context_lives_on():
    w = torch.zeros(1000, 64, device="cuda")
    ids = torch.randint(0, 1000, (4097,), device="cuda")
    dy = torch.randn(4097, 64, device="cuda")
    fd = _fusion(lambda fd, i, g: fd.add_output(
        fd.ops.index_add(fd.ops.zeros([1000, 64], F32), 0, i, g)), [ids, dy])
    want = w.index_add(0, ids, dy)
    torch.testing.assert_close(fd.execute([ids, dy])[0], want)
    for bad in (-3, 1000, 2 ** 40):
        wrong = ids.clone()
        wrong[4000] = bad
        message = f"index_add: index {bad} is out of range for dim 0 of size 1000"
        fd.execute([wrong, dy])
        torch.cuda.synchronize()
        with pytest.raises(IndexOutOfRange, match=message + ".*found after the call"):
            fd.execute([ids, dy])
        torch.testing.assert_close(fd.execute([ids, dy])[0], want)
        with pytest.raises(IndexOutOfRange, match=message + r" \(valid indices are 0 to 999\)$"):
            fd.execute([wrong, dy], options={"enable": ["sync_index_checks"]})
        torch.testing.assert_close(fd.execute([ids, dy])[0], want)
    check_index_errors()


def test_other_scatters_run_as_torch():
    x = torch.randn(64, 100, device="cuda")
    i = torch.stack([torch.randperm(100, device="cuda")[:7] for _ in range(64)])
    s = torch.randn(64, 7, device="cuda")
    fd = _fusion(lambda fd, a, b, c: fd.add_output(fd.ops.scatter(a, b, c, 1)), [x, i, s])
    out, = fd.execute([x, i, s])
    assert torch.equal(out, x.scatter(1, i, s))
    assert _segments(fd) == [("library", "scatter")] and fd.last_run.kind == "kernels"


def test_an_embedding_backward_at_the_bar_size():
    """8192 ids into [128256, 4096] bf16: float32 sums, cast back to bf16."""
    ids = torch.randint(0, 128256, (8192,), device="cuda")
    dy = torch.randn(8192, 4096, device="cuda").bfloat16()
    fd = _fusion(lambda fd, i, g: fd.add_output(
        fd.ops.index_add(fd.ops.zeros([128256, 4096], BF16), 0, i, g)), [ids, dy])
    run_and_check(fd, [ids, dy], kernels=2)
    assert _segments(fd) == [("kernel", "scatter"), ("kernel", "pointwise")]

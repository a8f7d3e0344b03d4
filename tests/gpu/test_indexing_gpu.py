"""take_along_axis, gather, index_select and embedding on the GPU against float64, outputs
poisoned: odd sizes, int32 and int64 indices, a transposed source; an index out of range raises
IndexOutOfRange from the checked kernel (at the next call, or from the call with
sync_index_checks), and the CUDA context lives on (the next call runs and is right); cross-entropy's loss and gradient as one normalization kernel; an embedding at a
large table."""
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


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_each_op_against_torch(index_dtype):
    x = torch.randn(1031, 777, device="cuda")
    xt = torch.randn(777, 1031, device="cuda").t()
    cases = [
        (lambda fd, a, i: fd.add_output(fd.ops.index_select(a, i, 0)),
         [x, torch.randint(0, 1031, (333,), device="cuda", dtype=index_dtype)],
         lambda a, i: torch.index_select(a, 0, i)),
        (lambda fd, a, i: fd.add_output(fd.ops.index_select(a, i, 1)),
         [xt, torch.randint(0, 777, (95,), device="cuda", dtype=index_dtype)],
         lambda a, i: torch.index_select(a, 1, i)),
        (lambda fd, a, i: fd.add_output(fd.ops.take_along_axis(a, i, 1)),
         [x, torch.randint(0, 777, (1031, 3), device="cuda", dtype=index_dtype)],
         lambda a, i: torch.take_along_dim(a, i.long(), 1)),
        (lambda fd, a, i: fd.add_output(fd.ops.gather(a, i, 0)),
         [x, torch.randint(0, 1031, (517, 700), device="cuda", dtype=index_dtype)],
         lambda a, i: torch.gather(a, 0, i.long())),
        (lambda fd, i, w: fd.add_output(fd.ops.embedding(i, w)),
         [torch.randint(0, 1031, (7, 13), device="cuda", dtype=index_dtype), x.bfloat16()],
         lambda i, w: torch.nn.functional.embedding(i.long(), w)),
    ]
    for build, inputs, want in cases:
        fd = _fusion(build, inputs)
        run_and_check(fd, inputs, scheduler="pointwise")
        assert torch.equal(fd.execute(inputs)[0], want(*inputs))


def test_an_index_out_of_range_raises_and_the_context_lives_on():
    """Checks are read asynchronously (runtime/index_check.py): the failing call returns, and
    the next call of any fusion once the kernel is done, or check_index_errors, raises; the
    record is reset and the context lives on (the call after is right). With
    sync_index_checks the failing call itself raises."""
    w = torch.randn(1000, 64, device="cuda")
    ids = torch.randint(0, 1000, (4097,), device="cuda")
    fd = _fusion(lambda fd, i, t: fd.add_output(fd.ops.embedding(i, t)), [ids, w])
    assert torch.equal(fd.execute([ids, w])[0], w[ids])
    for bad in (-3, 1000, 2 ** 40):
        wrong = ids.clone()
        wrong[4000] = bad
        message = f"embedding: index {bad} is out of range for dim 0 of size 1000"
        fd.execute([wrong, w])
        torch.cuda.synchronize()
        with pytest.raises(IndexOutOfRange, match=message + ".*found after the call"):
            fd.execute([ids, w])
        assert torch.equal(fd.execute([ids, w])[0], w[ids])
        fd.execute([wrong, w])
        with pytest.raises(IndexOutOfRange, match=message):
            check_index_errors()
        with pytest.raises(IndexOutOfRange, match=message + r" \(valid indices are 0 to 999\)$"):
            fd.execute([wrong, w], options={"enable": ["sync_index_checks"]})
        assert torch.equal(fd.execute([ids, w])[0], w[ids])
    check_index_errors()
    torch.cuda.synchronize()


def test_cross_entropy_loss_and_gradient_in_one_kernel():
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
        one_hot = fd.ops.eq(fd.ops.broadcast_in_dim(fd.ops.iota(v), [m, v], [1]), t2)
        g = fd.ops.sub(fd.ops.div(e, s), fd.ops.cast(one_hot, F32))
        fd.add_output(fd.ops.cast(fd.ops.mul(g, 1.0 / m), BF16))
    run_and_check(fd, [x, t], kernels=1)
    loss, dx = fd.execute([x, t])
    xr = x.float().requires_grad_()
    want = torch.nn.functional.cross_entropy(xr, t, reduction="none")
    want.sum().div(m).backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(dx, xr.grad.bfloat16())


def test_embedding_of_a_large_table():
    w = torch.randn(128256, 512, device="cuda").bfloat16()
    ids = torch.randint(0, 128256, (2049,), device="cuda")
    fd = _fusion(lambda fd, i, t: fd.add_output(fd.ops.embedding(i, t)), [ids, w])
    run_and_check(fd, [ids, w], scheduler="pointwise")
    assert torch.equal(fd.execute([ids, w])[0], w[ids])

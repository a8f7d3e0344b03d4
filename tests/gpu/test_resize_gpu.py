"""slice, pad, cat, chunk and split on the GPU against float64, outputs poisoned: odd sizes, steps,
negative and clamped indices, a transposed input, RoPE and a chunked SwiGLU as one kernel, a
window of a reduction as a second segment."""
import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16 = DataType.Float, DataType.BFloat16


@pytest.mark.parametrize("starts, ends, steps", [
    ([1, 3], [1000, -2], [1, 2]), ([0, -77], [999, 5000], [3, 1]), ([-5, 0], [777, 1031], [1, 7])])
def test_slices_of_a_transposed_input(starts, ends, steps):
    x = torch.randn(1031, 777, device="cuda").t()
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        fd.add_output(fd.ops.slice(tx, starts, ends, steps))
    run_and_check(fd, [x], scheduler="pointwise")
    want = x[starts[0]:ends[0]:steps[0], starts[1]:ends[1]:steps[1]]
    assert torch.equal(fd.execute([x])[0], want)


def test_pad_and_cat():
    a, b = torch.randn(517, 3, device="cuda"), torch.randn(517, 1000, device="cuda")
    with FusionDefinition() as fd:
        ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.cat([fd.ops.pad(ta, [2, 5], -3.0), fd.ops.exp(tb)], 1))
    run_and_check(fd, [a, b], scheduler="pointwise")
    want = torch.cat([F.pad(a, [2, 5], value=-3.0), b.exp()], 1)
    torch.testing.assert_close(fd.execute([a, b])[0], want)


def test_rope_and_chunked_swiglu_are_one_kernel():
    q = torch.randn(2, 33, 4, 64, device="cuda").bfloat16()
    cos, sin = torch.randn(33, 64, device="cuda"), torch.randn(33, 64, device="cuda")
    with FusionDefinition() as fd:
        tq = fd.from_pytorch(q, static_sizes=True)
        tc, ts = fd.from_pytorch(cos), fd.from_pytorch(sin)
        x1 = fd.ops.slice(tq, [0, 0, 0, 0], [2, 33, 4, 32])
        x2 = fd.ops.slice(tq, [0, 0, 0, 32], [2, 33, 4, 64])
        rot = fd.ops.cat([-x2, x1], -1)
        at = [True, False, True, False]
        y = fd.ops.cast(tq, F32) * fd.ops.broadcast(tc, at) \
            + fd.ops.cast(rot, F32) * fd.ops.broadcast(ts, at)
        fd.add_output(fd.ops.cast(y, BF16))
    run_and_check(fd, [q, cos, sin], scheduler="pointwise")
    rot = torch.cat([-q[..., 32:], q[..., :32]], -1).float()
    want = (q.float() * cos[None, :, None] + rot * sin[None, :, None]).bfloat16()
    torch.testing.assert_close(fd.execute([q, cos, sin])[0], want)

    x = torch.randn(129, 2 * 1000, device="cuda").bfloat16()
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        g, u = fd.ops.chunk(tx, 2, 1)
        fd.add_output(fd.ops.cast(fd.ops.silu(fd.ops.cast(g, F32)) * fd.ops.cast(u, F32), BF16))
    run_and_check(fd, [x], scheduler="pointwise")


def test_split_into_uneven_sections():
    """torch.split's listed sections of an odd row (a qkv projection cut into q, k and v), one
    pointwise kernel, against torch."""
    x = torch.randn(257, 3 * 129 + 2, device="cuda")
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        q, k, v = fd.ops.split(tx, [129, 131, 129], 1)
        fd.add_output(q * fd.ops.slice(k, [0, 0], [257, 129]) + fd.ops.exp(v))
    run_and_check(fd, [x], scheduler="pointwise")
    q, k, v = torch.split(x, [129, 131, 129], 1)
    torch.testing.assert_close(fd.execute([x])[0], q * k[:, :129] + v.exp())


def test_a_normalization_of_a_slice_and_a_window_of_a_reduction():
    x = torch.randn(300, 1500, device="cuda")
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        s = fd.ops.slice(tx, [0, 7], [300, 1493])
        e = fd.ops.exp(s - fd.ops.max(s, [1], keepdim=True))
        fd.add_output(e / fd.ops.sum(e, [1], keepdim=True))
        fd.add_output(fd.ops.pad(fd.ops.sum(tx, [1]), [3, 1], 2.0))
    run_and_check(fd, [x], kernels=None, segments=(
        ("kernel", "inner_persistent"), ("kernel", "reduction"), ("kernel", "pointwise")))

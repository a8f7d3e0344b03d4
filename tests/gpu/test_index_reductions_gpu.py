"""argmax and argmin on the GPU, outputs poisoned, equal to torch exactly: rows of odd and long
sizes with ties and NaN, columns, the flattened tensor."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape, dtype", [((129, 32003), torch.bfloat16),
                                          ((1031, 777), torch.float32),
                                          ((64, 128256), torch.bfloat16)])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_rows_columns_and_all(shape, dtype, name):
    x = (torch.randn(shape, device="cuda") * 3).round().to(dtype)
    x[5, 7] = float("nan")
    fn = getattr(torch, name)
    for dim in (1, 0, None):
        with FusionDefinition() as fd:
            fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), dim))
        run_and_check(fd, [x], kernels=0)
        assert fd.last_run.kind == "kernels"
        want = fn(x) if dim is None else fn(x, dim)
        assert torch.equal(fd.execute([x])[0], want)


@pytest.mark.parametrize("dtype, keys", [(torch.float16, True), (torch.float32, True),
                                         (torch.int32, True), (torch.float64, False),
                                         (torch.int64, False)])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_signed_zeros_infinities_and_every_dtype(dtype, keys, name):
    """Rows whose extreme is tied between -0 and +0 (torch counts them equal: the first wins),
    +-inf, NaN; 16- and 32-bit values take the one-pass key reduction (one reduction kernel),
    64-bit ones the max and least index (two reductions in one normalization kernel)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randint(-2, 3, (517, 3001), device="cuda", generator=g).to(dtype)
    if dtype.is_floating_point:
        x = torch.where(x == 0, torch.where(torch.rand(x.shape, device="cuda", generator=g) < 0.5,
                                            -0.0, 0.0), x).to(dtype)
        x[1::2] = torch.where(x[1::2] == 0, 0.0, x[1::2].sign() * float("inf")).to(dtype)
        x[3, 100] = x[7, 2000] = float("nan")
    fn = getattr(torch, name)
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), 1))
    run_and_check(fd, [x], kernels=1, scheduler="reduction" if keys else "inner_persistent")
    assert torch.equal(fd.execute([x])[0], fn(x, 1))


@pytest.mark.parametrize("cols", [65536, 128256])
def test_an_argmax_beside_a_softmax_of_rows_held_in_a_cluster(cols):
    """The argmax's int64 keys reduced across a cluster of blocks (distributed shared memory)
    beside a softmax of the same rows."""
    x = (torch.randn(300, cols, device="cuda") * 4).round().bfloat16()
    x[7, 1000] = float("nan")
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                  DataType.BFloat16))
        fd.add_output(fd.ops.argmax(t, 1))
    run_and_check(fd, [x], scheduler="inner_persistent")
    assert fd.last_run.heuristics[0].cluster > 1
    assert torch.equal(fd.execute([x])[1], torch.argmax(x, 1))

"""iota, triu/tril and the causal softmax with its mask built in the kernel, on the GPU against
float64, outputs poisoned, odd sizes and a transposed layout."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype, start, step", [
    (DataType.Int, 5, 3), (DataType.Int32, -7, -2), (DataType.Float, 0.5, 0.125),
    (DataType.BFloat16, 0.0, 1.0)])
def test_iota_outputs(dtype, start, step):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.iota(100003, start, step, dtype=dtype))
    run_and_check(fd, [], scheduler="pointwise")


@pytest.mark.parametrize("op", ["triu", "tril"])
@pytest.mark.parametrize("diagonal", [-5, 0, 7])
def test_triu_tril_of_a_transposed_batch(op, diagonal):
    x = torch.randn(3, 517, 263, device="cuda").transpose(1, 2)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        fd.add_output(getattr(fd.ops, op)(tx, diagonal))
    run_and_check(fd, [x])
    y = fd.execute([x])[0]
    assert torch.equal(y, getattr(torch, op)(x, diagonal))


@pytest.mark.parametrize("shape", [(2, 3, 1000, 1000), (1, 4, 77, 2048)])
def test_causal_softmax_with_the_mask_built_in_the_kernel(shape):
    x = torch.randn(shape, device="cuda").bfloat16()
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(tx, DataType.Float)
        rows, cols = (fd.ops.iota(i.extent, dtype=DataType.Int32) for i in tx.domain.logical[2:])
        keep = fd.ops.le(fd.ops.broadcast(cols, [True, False]),
                         fd.ops.broadcast(rows, [False, True]))
        xm = fd.ops.where(keep, xf, float("-inf"))
        e = fd.ops.exp(fd.ops.sub(xm, fd.ops.max(xm, [3], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [3], keepdim=True)),
                                  DataType.BFloat16))
    run_and_check(fd, [x], scheduler="inner_persistent")
    rows = torch.arange(shape[2], device="cuda")[:, None]
    cols = torch.arange(shape[3], device="cuda")[None, :]
    want = torch.softmax(x.float().masked_fill(cols > rows, float("-inf")), -1)
    torch.testing.assert_close(fd.execute([x])[0].float(), want, atol=1e-2, rtol=1e-2)

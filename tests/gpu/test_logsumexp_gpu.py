"""logsumexp in one pass (schedule/logsumexp.py) on the GPU: max(x) and sum(exp(x - max)) as one
reduction kernel of (max, sum) keys, against float64 with outputs poisoned: the bar shape of
issue 16 (rows of 128256 bf16), rows read in one step, rows split over blocks, and the special
values the fusion as written gives (NaN for +inf or a row of -inf)."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _logsumexp(x, also_max=False):
    with FusionDefinition("lse") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        m = fd.ops.max(xf, [1], keepdim=True)
        s = fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, m)), [1], keepdim=True)
        fd.add_output(fd.ops.squeeze(fd.ops.add(fd.ops.log(s), m), [1]))
        if also_max:
            fd.add_output(m)
    return fd


@pytest.mark.parametrize("M,N", [(4096, 128256), (16384, 8192), (8, 1 << 20), (37, 1003)])
def test_one_reduction_kernel(M, N):
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 4
    fd = _logsumexp(x)
    run_and_check(fd, [x], scheduler="reduction")
    want = torch.logsumexp(x.double(), 1)
    got = fd.execute([x])[0]
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


def test_special_values():
    inf, nan = float("inf"), float("nan")
    x = torch.randn(6, 3000, device="cuda")
    x[0, 5], x[1, :], x[2, 7], x[3, 100], x[4, :], x[5, 0] = inf, -inf, -inf, nan, -1e30, 80.0
    fd = _logsumexp(x, also_max=True)
    got = fd.execute([x])
    assert fd.last_run.schedulers == ("reduction",)
    want = evaluate(fd.fusion, [x.cpu()], promote_to_double=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu().double(), w, equal_nan=True, rtol=1e-5, atol=1e-5)

"""Matmuls of one row as reductions (schedule/few_row_matmuls.py) on the GPU: against float64
with outputs poisoned, asserting the one reduction kernel that ran."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

_DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
       torch.float16: DataType.Half}


def _check(fd, ins):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, ins, kernels=1, scheduler="reduction")
    assert "a row reduction of the products" in fd.last_run.reason, fd.last_run.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,k", [(4096, 4096), (1001, 5121), (40, 72), (3000, 14336)])
def test_linear_bias_gelu_of_one_row_gpu(n, k, dtype):
    x = torch.randn(1, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) * k ** -0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    with FusionDefinition("linear_gelu") as fd:
        tx = fd.define_tensor([-1, -1], dtype=_DT[dtype])
        tw = fd.define_tensor([-1, -1], dtype=_DT[dtype])
        tb = fd.define_tensor([-1], dtype=_DT[dtype])
        fd.add_output(fd.ops.gelu(fd.ops.linear(tx, tw, tb), approximate="tanh"))
    _check(fd, [x, w, b])


@pytest.mark.parametrize("shape", [(1, 1, 2048), (2048,), (1, 2049)])
def test_linear_and_matmul_of_one_row_from_torch_gpu(shape):
    """x as torch gives it (size-1 dims in its definition, squeezed by the rewrite); matmul with
    w.t() as its second operand; two outputs."""
    k = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(999, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    with FusionDefinition("linear_two") as fd:
        y = fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w))
        fd.add_output(y)
        fd.add_output(fd.ops.relu(y))
    _check(fd, [x, w])
    with FusionDefinition("matmul_t") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(x), fd.from_pytorch(w.t())))
    _check(fd, [x, w.t()])

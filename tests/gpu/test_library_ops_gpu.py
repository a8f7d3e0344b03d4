"""Library ops (matmul, linear) on the GPU: cuBLAS through torch against float64, with the
fusion's outputs poisoned."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import MatmulOp
from pyfuser.runtime import library
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import TOLERANCE, rel_error, run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
_DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
       torch.float16: DataType.Half}


def _run(fd, ins):
    """A plan with a library segment (cuBLAS) and the epilogue's kernel, if any: no fallback."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        outs = run_and_check(fd, ins, kernels=0)
    run = fd.last_run
    assert run.kind == "kernels" and run.backend in ("cuda", ""), run
    kinds = [s.kind for s in run.segments]
    assert kinds[0] == "library" and set(kinds) <= {"library", "kernel"}, run.segments
    return outs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", [((257, 129), (129, 65)), ((3, 33, 100), (100, 17)),
                                   ((2, 1, 31, 64), (5, 64, 7)), ((129,), (129, 40))])
def test_matmul_gpu(sa, sb, dtype):
    a = torch.randn(sa, device="cuda", dtype=dtype)
    b = torch.randn(sb, device="cuda", dtype=dtype)
    with FusionDefinition("mm") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    (out,) = _run(fd, [a, b])
    assert out.shape == torch.matmul(a, b).shape and out.dtype == dtype


def _linear_gelu(k, dtype, with_bias):
    x = torch.randn(4, 127, k, device="cuda", dtype=dtype)
    w = torch.randn(200, k, device="cuda", dtype=dtype) / 10
    b = torch.randn(200, device="cuda", dtype=dtype)
    with FusionDefinition("linear_gelu") as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        tb = fd.from_pytorch(b) if with_bias else None
        y = fd.ops.gelu(fd.ops.cast(fd.ops.linear(tx, tw, tb), DataType.Float), approximate="tanh")
        fd.add_output(fd.ops.cast(y, _DT[dtype]))
    return fd, [x, w] + ([b] if with_bias else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_gelu_gpu(dtype, with_bias):
    # K = 97: rows of 194 bytes, no tensor map over them: torch's linear, then a gelu kernel.
    _run(*_linear_gelu(97, dtype, with_bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_gelu_is_one_matmul_kernel_gpu(dtype, with_bias):
    # K = 96: the matmul kernel over the batch of 4, the bias and GELU fused.
    fd, ins = _linear_gelu(96, dtype, with_bias)
    run_and_check(fd, ins, scheduler="matmul")


def test_library_op_runs_on_the_current_stream_in_fp32_accumulation():
    """fp16 operands with K = 8192: partial sums reduced in 16 bits lose digits; the library
    segment accumulates in fp32 and leaves torch's settings as it found them."""
    a = torch.randn(64, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 64, device="cuda", dtype=torch.float16)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    (mm,) = [e for e in fd.fusion.exprs() if isinstance(e, MatmulOp)]
    m = torch.backends.cuda.matmul
    before = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        (out,) = library.run_library_op(mm, [a, b])
    s.synchronize()
    assert (m.allow_fp16_reduced_precision_reduction,
            m.allow_bf16_reduced_precision_reduction) == before
    err = rel_error(out, a.double() @ b.double())
    assert err <= TOLERANCE[DataType.Half], err

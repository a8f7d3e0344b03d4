"""Normalizations over the outer dims (outer persistent) on the GPU against float64, outputs
poisoned, asserting the scheduler that ran (no reference fallback)."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DT = {"bf16": DataType.BFloat16, "fp16": DataType.Half, "fp32": DataType.Float}
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _softmax(dt, dim=0, stride_order=None, log=False):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt], stride_order=stride_order)
        xf = fd.ops.cast(x, DataType.Float)
        z = fd.ops.sub(xf, fd.ops.max(xf, [dim], keepdim=True))
        e = fd.ops.exp(z)
        s = fd.ops.sum(e, [dim], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.sub(z, fd.ops.log(s)) if log else fd.ops.div(e, s),
                                  DT[dt]))
    return fd


def _normalization(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        b = fd.define_tensor([-1], dtype=DT[dt])
        xf = fd.ops.cast(x, DataType.Float)
        var, mean = fd.ops.var_mean(xf, [0], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        y = fd.ops.add(fd.ops.mul(y, fd.ops.cast(w, DataType.Float)),
                       fd.ops.cast(b, DataType.Float))
        fd.add_output(fd.ops.cast(y, DT[dt]))
    return fd


def test_softmax_over_dim_0_of_the_bench_shape():
    fd = catalogue.define("softmax_dim0", "bf16")
    run_and_check(fd, catalogue.make_inputs("softmax_dim0", 2048, 8192, "bf16", device="cuda"),
                  scheduler="outer_persistent")
    (p,) = fd.last_run.heuristics
    assert (p.vector, p.bdimx, p.bdimy, p.persistent_batch) == (4, 4, 128, 16)
    assert p.logsumexp_keys        # the max and the sum of exp as one reduction of keys


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2047, 8200), (4095, 2040)])
def test_logsumexp_key_kernels_over_dim_0(dt, shape):
    # 16-bit columns too long to hold exp(x - max) as floats: one reduction of (max, sum) keys.
    for log in (False, True):
        fd = _softmax(dt, log=log)
        x = (torch.randn(*shape, device="cuda") * 4).to(TORCH[dt])
        run_and_check(fd, [x], scheduler="outer_persistent")
        (p,) = fd.last_run.heuristics
        assert p.logsumexp_keys and p.persistent_batch * p.vector == 64, p


@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", [(7, 5), (33, 17), (1000, 3), (1, 9), (4096, 1000),
                                   (8192, 4096), (333, 12345)])
def test_softmax_and_log_softmax_over_dim_0(dt, shape):
    for log in (False, True):
        fd = _softmax(dt, log=log)
        run_and_check(fd, [torch.randn(*shape, device="cuda").to(TORCH[dt])],
                      **_plan_of(shape[0], "pointwise"))


def _plan_of(rows: int, second: str) -> dict:
    """run_and_check's expectation: 8192 rows fit a block only 4 columns wide, under a sector
    of each row (outer_persistent._wide_enough): the split plan, a logsumexp reduction and a
    `second` pass (schedule/split_normalizations.py); fewer rows, the outer persistent kernel."""
    if rows == 8192:
        return dict(scheduler=("reduction", second), kernels=2)
    return dict(scheduler="outer_persistent")


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(7, 5), (1000, 3), (2048, 8192), (257, 4100)])
def test_normalization_over_dim_0_with_column_weights(dt, shape):
    R, C = shape
    ins = [torch.randn(R, C, device="cuda").to(TORCH[dt]),
           torch.randn(C, device="cuda").to(TORCH[dt]), torch.randn(C, device="cuda").to(TORCH[dt])]
    run_and_check(_normalization(dt), ins, scheduler="outer_persistent")


@pytest.mark.parametrize("shape", [(4096, 8192), (37, 1001)])
def test_softmax_over_dim_1_of_a_column_major_input(shape):
    fd = _softmax("bf16", dim=1, stride_order=[0, 1])
    x = torch.randn(shape[1], shape[0], device="cuda", dtype=torch.bfloat16).t()
    run_and_check(fd, [x], **_plan_of(shape[1], "transpose"))

"""Normalization forward and softmax kernels (inner persistent) against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORWARD = ["softmax", "log_softmax", "rmsnorm_fwd", "add_rmsnorm_fwd", "layernorm_fwd"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("shape", [(1, 8), (7, 1000), (3, 1023), (1000, 5120), (4096, 1024),
                                   (33, 12288), (64, 65536)])
def test_forward_bf16(name, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_persistent")


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_forward_other_dtypes(name, dtype):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, 257, 4096, dtype, device="cuda"),
                  scheduler="inner_persistent")


def test_noncontiguous_rows():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                  DataType.BFloat16))
    x = torch.randn(300, 3000, device="cuda", dtype=torch.bfloat16)[:, 100:2148]
    run_and_check(fd, [x], scheduler="inner_persistent")


def test_row_size_that_forbids_vectors():
    fd = catalogue.define("rmsnorm_fwd")
    ins = catalogue.make_inputs("rmsnorm_fwd", 100, 4099, device="cuda")
    run_and_check(fd, ins, scheduler="inner_persistent")
    assert fd.last_run.heuristics[0].vector == 1


def test_rows_too_long_for_registers_fall_back_with_warning():
    from pyfuser.runtime.executor import FallbackWarning
    fd = catalogue.define("rmsnorm_fwd")
    with pytest.warns(FallbackWarning, match="shared memory or a cluster"):
        fd.execute(catalogue.make_inputs("rmsnorm_fwd", 2, 131072, device="cuda"))
    assert fd.last_run.kind == "reference"

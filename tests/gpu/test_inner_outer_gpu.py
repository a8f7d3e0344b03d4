"""Norm backward (inner-outer persistent, multi-wave) against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("shape", [(1, 1000), (3, 1000), (1000, 1000), (1000, 5120), (4096, 1024),
                                   (16384, 4096), (2048, 16384)])
def test_backward_bf16(name, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_outer_persistent")


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_backward_other_dtypes(name, dtype):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, 333, 2048, dtype, device="cuda"),
                  scheduler="inner_outer_persistent")


def test_backward_repeated_launches_reuse_workspace_and_counter():
    # The grid-sync counter and the workspace are reused launch after launch.
    fd = catalogue.define("rmsnorm_bwd")
    for _ in range(3):
        run_and_check(fd, catalogue.make_inputs("rmsnorm_bwd", 2048, 4096, device="cuda"),
                      scheduler="inner_outer_persistent")


def test_issue_item6_fusion_with_permuted_broadcast_input():
    with FusionDefinition("item6") as fd:
        t0 = fd.define_tensor([1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float,
                              stride_order=[1, 2, 0])
        t1 = fd.ops.squeeze(t0, [0])
        t2 = fd.ops.sum(t1, [1])
        t3 = fd.ops.broadcast_in_dim(t2, [1, -1, 1], [1])
        t4 = fd.ops.add(t0, t3)
        fd.add_output(t4)
        t5 = fd.ops.squeeze(t4, [0])
        fd.add_output(fd.ops.sum(t5, [0]))
    # allocation (i1, b0, i2): the size-1 dim lies between the others in memory
    x = torch.randn(4096, 1, 4096, device="cuda").permute(1, 0, 2)
    run_and_check(fd, [x], scheduler="inner_outer_persistent")

"""Pointwise fusions of 0-dim outputs and of outputs of different ranks on the GPU, outputs
poisoned, against float64: one kernel over the largest output where the smaller ones iterate
its dims, a plan of pointwise kernels where shapes are unrelated, a one-thread kernel of
scalars, and kernels of the fusion specialized to its empty dims. The interpreter runs the same
fusions on small shapes in tests/runtime/test_pointwise_ranks.py."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from test_pointwise_ranks import (column_beside_rows, row_beside_rows,  # noqa: E402
                                  three_unrelated_outputs, where_of_scalars)

from pyfuser import FusionDefinition  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _define(build):
    with FusionDefinition() as fd:
        build(fd)
    return fd


@pytest.mark.parametrize("M,N", [(8192, 4096), (1023, 4097), (7, 1000)])
@pytest.mark.parametrize("build", [row_beside_rows, column_beside_rows])
def test_lower_rank_output_in_one_kernel(build, M, N):
    fd = _define(build)
    c = torch.randn(N if build is row_beside_rows else M, device="cuda")
    run_and_check(fd, [torch.randn(M, N, device="cuda"), c], scheduler="pointwise")
    assert fd.last_run.segments == ()


@pytest.mark.parametrize("shapes", [((4096, 786), (6, 307)), ((64, 786), (2048, 4099))])
def test_mixed_rank_plan_of_unrelated_outputs(shapes):
    (a, b), (c, d) = shapes
    fd = _define(three_unrelated_outputs)
    inputs = [torch.randn(b, a, device="cuda").to(torch.bfloat16).t(),
              torch.randn(c, d, device="cuda").double(),
              torch.tensor(1.5, device="cuda").to(torch.bfloat16)]
    run_and_check(fd, inputs, kernels=0)
    run = fd.last_run
    assert run.kind == "kernels" and len(run.segments) >= 2, run
    # The transposed bf16 input's segment is the transpose scheduler's.
    assert all(s.kind == "kernel" and s.name in ("pointwise", "transpose")
               for s in run.segments), run


def test_0_dim_fusion_is_one_thread():
    fd = _define(where_of_scalars)
    run_and_check(fd, [torch.tensor(0.5, device="cuda"), torch.tensor(-1.25, device="cuda")],
                  scheduler="pointwise")
    assert fd.last_run.heuristics[0].threads == 1


def test_empty_outputs_beside_outputs_with_elements():
    with FusionDefinition() as fd:
        for _ in range(2):
            p, g = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.sub(p, fd.ops.mul(g, 1e-3)))
    inputs = [torch.randn(0, 189, device="cuda"), torch.randn(0, 189, device="cuda"),
              torch.randn(300, 7000, device="cuda"), torch.randn(300, 7000, device="cuda")]
    run_and_check(fd, inputs, scheduler="pointwise")
    assert "no elements: allocated, not computed" in fd.last_run.reason

"""Outputs of different shapes that broadcast to one another, on the GPU against float64.

Pointwise: [M, 1] and [1, N] outputs beside the [M, N] one they broadcast to (either order), a
column expanded to [M, N] (stride 0 along N), the same in 3D. Normalizations: a LayerNorm's
weight times 2 beside y, RMSNorm's rstd broadcast back to [M, N] (broadcast_in_dim, expand), a
[1]-shaped scale's own output beside a softmax, a norm backward's row statistic expanded to
[M, N]; also in the TMA variants (a persistent grid). Reductions: the column or row the input
is scaled by beside its row or column sums, split over blockIdx.y or not, and row sums
expanded back. Outputs are poisoned before each launch, so an element no thread writes fails;
the interpreter tests (tests/lower/test_broadcast_outputs.py) check on small shapes that each
is written once. The fusions are those of tests/lower/broadcast_output_fusions.py.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from broadcast_output_fusions import FUSIONS  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POINTWISE = ["column_row_and_full", "full_first", "expanded_column", "three_d"]
NORMS = ["layernorm_weight_out", "rmsnorm_rstd_broadcast_in_dim", "rmsnorm_rstd_expand",
         "scaled_softmax_scale_out", "softmax_column_expanded",
         "norm_backward_row_statistic_expand"]


def _check(name, dt, shape):
    build, scheduler = FUSIONS[name]
    fd, inputs = build(dt, *shape, device="cuda")
    run_and_check(fd, inputs, scheduler=scheduler)


@pytest.mark.parametrize("shape", [(8192, 4096), (1023, 4097), (7, 1000), (3, 2 ** 18 + 1)])
@pytest.mark.parametrize("name", POINTWISE)
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_pointwise_outputs_that_broadcast_one_another(name, dt, shape):
    _check(name, dt, shape)


@pytest.mark.parametrize("shape", [(16384, 4096), (2048, 1024), (7, 1000), (1001, 2048),
                                   (64, 16384)])
@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_normalization_outputs_that_broadcast_the_rows(name, dt, shape):
    _check(name, dt, shape)


@pytest.mark.parametrize("variant", ["tma_inner_persistent", "ws_inner_persistent"])
@pytest.mark.parametrize("name", ["layernorm_weight_out", "scaled_softmax_scale_out",
                                  "rmsnorm_rstd_expand"])
@pytest.mark.parametrize("dt,shape", [("bf16", (2048, 4096)), ("bf16", (1001, 2048)),
                                      ("fp32", (777, 2048))])
def test_persistent_grid_outputs_beside_the_rows(name, variant, dt, shape):
    """The TMA variants: a persistent grid takes the rows in grid-stride turns; the outputs
    computed outside that loop are written by its first block."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build(dt, *shape, device="cuda")
    run_and_check(fd, inputs, scheduler=scheduler, options={"enable": [variant]})
    p = fd.last_run.heuristics[0]
    assert p.stages >= 2 and p.warp_specialized == (variant == "ws_inner_persistent"), p.reason


REDUCTION_SHAPES = {
    "row_sums_and_column_out": [(4096, 4096), (8, 2 ** 20), (3, 2 ** 20 + 3)],
    "column_sums_and_row_out": [(4096, 4096), (2 ** 20, 8), (2 ** 18 + 1, 16)],
    "column_sums_and_column_out": [(4096, 4096), (2 ** 20, 8), (2 ** 18 + 1, 16)],
    "row_sums_expanded": [(4096, 4096), (8, 2 ** 20), (3, 2 ** 20 + 3)],
    "row_sums_and_row_out": [(4096, 4096), (8, 2 ** 20), (3, 2 ** 20 + 3)],
}


@pytest.mark.parametrize("name,shape", [(n, s) for n, shapes in REDUCTION_SHAPES.items()
                                        for s in shapes])
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_reduction_outputs_beside_the_reduction(name, dt, shape):
    """Beside row or column sums split over blockIdx.y (a grid reduction): the column or row
    the input is scaled by, and the sums expanded back."""
    _check(name, dt, shape)

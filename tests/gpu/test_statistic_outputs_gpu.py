"""Row statistics returned as outputs, on the GPU against float64.

The training forward of a normalization returns its statistics (RMSNorm's rstd, LayerNorm's
mean and rstd, var_mean and var over rows, softmax's row max and logsumexp), keepdim ([M, 1])
or squeezed ([M]); the norm backward takes them back as [M, 1] or [M] inputs. Outputs are
poisoned before each launch, so a row whose statistic no thread writes (or writes at another
row's index) fails. The fusions are those of tests/lower/statistic_fusions.py, which the
interpreter tests run on small shapes.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from statistic_fusions import FORWARD, forward, norm_backward  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# 4096 x 65536: rows split over a cluster of blocks; 7 x 1000: odd sizes.
SHAPES = [(16384, 4096), (2048, 4096), (16384, 1024), (4096, 65536), (7, 1000)]
FORCED = {"tma": {"enable": ["tma_inner_persistent"]}, "ws": {"enable": ["ws_inner_persistent"]}}


def _check_forward(name, dtype, keepdim, shape, options=None):
    fd, inputs = forward(name, dtype, keepdim, *shape, device="cuda")
    run_and_check(fd, inputs, scheduler="inner_persistent", options=options)
    return fd.last_run.heuristics[0]


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", list(FORWARD))
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_statistics_bf16(name, keepdim, shape):
    p = _check_forward(name, "bf16", keepdim, shape)
    _check_long_rows(name, shape, p)


def _check_long_rows(name, shape, p):
    """Rows of 65536 take a cluster, but a softmax (read twice in all once its max and sum of
    exp are one pass) the looped variant (measured faster, session 20)."""
    if shape[1] == 65536 and name == "softmax_stats":
        assert p.looped and p.cluster == 1, p
    else:
        assert (p.cluster > 1) == (shape[1] == 65536), p


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", list(FORWARD))
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", [(2048, 4096), (4096, 65536), (7, 1000), (8192, 4096)])
def test_forward_statistics_other_dtypes(name, dtype, keepdim, shape):
    p = _check_forward(name, dtype, keepdim, shape)
    _check_long_rows(name, shape, p)


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", ["rmsnorm_rstd", "layernorm_stats", "softmax_stats"])
@pytest.mark.parametrize("variant", list(FORCED))
@pytest.mark.parametrize("dtype,shape", [("bf16", (2048, 4096)), ("bf16", (1001, 2048)),
                                         ("fp32", (777, 2048))])
def test_forward_statistics_persistent_grid(name, keepdim, variant, dtype, shape):
    """The TMA variants: a persistent grid takes the row groups in grid-stride turns."""
    p = _check_forward(name, dtype, keepdim, shape, FORCED[variant])
    assert p.stages >= 2 and p.warp_specialized == (variant == "ws"), p.reason


@pytest.mark.parametrize("keepdim", [True, False], ids=["M1", "M"])
@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("dtype,shape", [("bf16", (16384, 4096)), ("bf16", (2048, 4096)),
                                         ("bf16", (16384, 1024)), ("bf16", (4096, 65536)),
                                         ("bf16", (7, 1000)), ("fp16", (2048, 4096)),
                                         ("fp32", (2048, 4096)), ("fp32", (7, 1000))])
def test_norm_backward_with_statistic_inputs(name, keepdim, dtype, shape):
    fd, inputs = norm_backward(name, dtype, keepdim, *shape, device="cuda")
    run_and_check(fd, inputs, scheduler="inner_outer_persistent")
    assert (fd.last_run.heuristics[0].cluster > 1) == (shape[1] == 65536)


@pytest.mark.parametrize("rows", [1, 8])
def test_var_of_one_element_rows_of_a_recomputed_product_is_nan(rows):
    """var(relu(x) * w, correction=1) over rows of one element is 0 / 0, NaN as torch gives.
    The kernel computes the product twice (for the sum and for x - mean); were either copy
    contracted into an FMA with its consumer, x - mean would be the product's rounding error
    and the row +-inf (fuzz 20261127:735). Both copies are printed as pf::mul_rn."""
    from statistic_fusions import var_of_a_recomputed_product
    fd, inputs = var_of_a_recomputed_product(256 * rows, device="cuda")
    _, var = run_and_check(fd, inputs, kernels=1)
    assert var.isnan().all(), var[~var.isnan()][:8]

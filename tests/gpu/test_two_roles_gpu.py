"""One tensor read in two roles, on the GPU against float64 (outputs poisoned before each
launch, so an element no thread writes fails).

x.squeeze(1) - x for x [N, 1] (fuzz triage P1: the kernel wrote the diagonal only, x[i] - x[i],
and left garbage elsewhere), outer products, a vector added as a row and as a column, x + x.T,
and the same patterns inside a softmax, a LayerNorm, a norm backward and row or column sums.
The second role reads a copy of its computation from an alias input (schedule/roles.py); the
interpreter tests (tests/lower/test_two_roles.py) check on small shapes that each output
element is written once. The fusions are those of tests/lower/two_role_fusions.py.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from pyfuser.testing import run_and_check  # noqa: E402
from two_role_fusions import FUSIONS  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POINTWISE = ["squeezed_minus_column", "squeezed_equals_column",
             "squeezed_minus_column_and_column_out", "outer_product", "outer_product_of_exp",
             "bias_along_both_dims", "plus_transpose"]
ROWS = ["softmax_of_row_and_column_bias", "layernorm_weight_as_row_and_column",
        "norm_backward_weight_as_row_and_column", "row_sums_of_plus_transpose",
        "column_sums_of_times_transpose"]


def _check(name, dt, N):
    build, scheduler = FUSIONS[name]
    fd, inputs = build(dt, N, device="cuda")
    run_and_check(fd, inputs, scheduler=scheduler)


@pytest.mark.parametrize("N", [5, 32, 1001, 4096])
@pytest.mark.parametrize("name", POINTWISE)
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_pointwise_kernel_computes_each_role(name, dt, N):
    _check(name, dt, N)


@pytest.mark.parametrize("N", [37, 1024, 4096])
@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_row_and_reduction_kernels_compute_each_role(name, dt, N):
    _check(name, dt, N)


def test_triage_repro():
    """The P1 repro as reported, on the GPU: garbage off the diagonal before."""
    from pyfuser import FusionDefinition
    from pyfuser.ir.dtype import DataType
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.sub(fd.ops.squeeze(x, [1]), x))
    x = torch.tensor([[10.], [20.], [30.], [40.], [50.]], device="cuda")
    (d,) = fd.execute([x], options={"enable": ["poison_outputs"]})
    assert fd.last_run.kind == "kernels", fd.last_run
    assert torch.equal(d, x.squeeze(1)[None, :] - x)

"""Pointwise fusions that iterate the output's elements through broadcasts of a wider dtype,
expanded dims broadcast over new dims and reshapes, on the GPU against float64 (the fusions of
tests/lower/broadcast_reshape_fusions.py; the interpreter tests, on small shapes, also check
that each element is written once). Outputs are poisoned before each launch, so an element no
thread writes fails."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from broadcast_reshape_fusions import FUSIONS  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape", [(8192, 4096), (1023, 4097), (7, 1000), (3, 2 ** 18 + 1)])
@pytest.mark.parametrize("name", sorted(FUSIONS))
def test_fusion(name, shape):
    fd, inputs = FUSIONS[name](*shape, device="cuda")
    run_and_check(fd, inputs, scheduler="pointwise")

"""Fusions a scheduler used to accept and fail on, or that none took (fuzz triage P2:
normalizations over a fusion-internal permute, kept size-1 dims; inner-outer reductions of
permuted views; P3: reductions over expanded dims; P4: one-row [1, N] tensors beside the rows;
P14: a fusion of one element), on the GPU
against float64. The fusions are those of tests/schedule/acceptance_fusions.py (RUN), whose
interpreter tests are tests/schedule/test_scheduler_acceptance.py. Outputs are poisoned before
each launch, so an element no thread writes fails.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schedule"))
from acceptance_fusions import RUN  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name,dt,shape", [(name, dt, shape) for name, e in RUN.items()
                                           for shape in e[3] for dt in ("fp32", "bf16")])
def test_runs_as_one_kernel_and_matches_float64(name, dt, shape):
    build, scheduler, _, _ = RUN[name]
    fd, inputs = build(dt, *shape, device="cuda")
    run_and_check(fd, inputs, scheduler=scheduler)

"""top-k on the GPU: the library segment (torch.topk) after a kernel, at vocabulary width,
outputs poisoned; values and indices equal torch's."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_topk_after_a_kernel_at_vocabulary_width():
    # Distinct float32 values (n < 2^24): torch orders tied values as it likes, and
    # run_and_check's reference runs topk in float64, the plan in float32.
    n = 64 * 128256
    x = (torch.randperm(n, device="cuda").float() / n).reshape(64, 128256)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        values, indices = fd.ops.topk(fd.ops.mul(tx, 2.0), 50, 1)
        fd.add_output(values)
        fd.add_output(indices)
    run_and_check(fd, [x], kernels=0)
    assert [(s.kind, s.name) for s in fd.last_run.segments] == [
        ("kernel", "pointwise"), ("library", "topk")]
    v, i = fd.execute([x])
    want = torch.topk(x * 2.0, 50, 1)
    assert torch.equal(v, want.values) and torch.equal(i, want.indices)

"""top-k on the GPU: the library segment (torch.topk) between kernels, at vocabulary width,
outputs poisoned; values and indices equal torch's."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_topk_of_softmax_at_vocabulary_width():
    n = 64 * 128256
    x = (torch.randperm(n, device="cuda").float() / n).reshape(64, 128256).bfloat16()
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
    assert torch.equal(v, want.values) and torch.equal(x.gather(1, i) * 2.0, want.values)

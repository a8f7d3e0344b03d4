"""argmax and argmin on the GPU, outputs poisoned, equal to torch exactly: rows of odd and long
sizes with ties and NaN, columns, the flattened tensor."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape, dtype", [((129, 32003), torch.bfloat16),
                                          ((1031, 777), torch.float32),
                                          ((64, 128256), torch.bfloat16)])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_rows_columns_and_all(shape, dtype, name):
    x = (torch.randn(shape, device="cuda") * 3).round().to(dtype)
    x[5, 7] = float("nan")
    fn = getattr(torch, name)
    for dim in (1, 0, None):
        with FusionDefinition() as fd:
            fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), dim))
        run_and_check(fd, [x], kernels=0)
        assert fd.last_run.kind == "kernels"
        want = fn(x) if dim is None else fn(x, dim)
        assert torch.equal(fd.execute([x])[0], want)

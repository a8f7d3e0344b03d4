"""Empty tensors and refused inputs on the GPU: what users met on the H100 (RMSNorm of 0 rows read
through a null pointer, "illegal memory access", and every later CUDA call in the process
failed; a 0-column tensor was refused as not contiguous; a bare tensor was read by its rows).
Each case is followed by a normal kernel run in the same process, which fails if the CUDA
context died. The same cases run on the CPU in tests/runtime/test_empty_tensors.py and
tests/runtime/test_input_validation.py."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, InputError, catalogue
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _context_is_alive():
    """A kernel launched after the case still runs and is right (a dead context fails here)."""
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = [t.cuda() for t in catalogue.make_inputs("rmsnorm_fwd", 33, 1000, "bf16", seed=1)]
    run_and_check(fd, inputs)
    torch.cuda.synchronize()


def _run_quietly(fd, inputs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        outs = fd.execute(inputs)
    torch.cuda.synchronize()
    return outs, [str(w.message) for w in seen if issubclass(w.category, FallbackWarning)]


@pytest.mark.parametrize("name", ["rmsnorm_fwd", "layernorm_fwd", "softmax"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_norm_of_no_rows_launches_nothing(name, dtype):
    fd = catalogue.define(name, dtype)
    small = catalogue.make_inputs(name, 3, 24, dtype, seed=0)
    inputs = [torch.randn([{3: 0}.get(d, d) for d in t.shape]).to(t.dtype).cuda() for t in small]
    outs, fallbacks = _run_quietly(fd, inputs)
    assert not fallbacks, fallbacks
    assert fd.last_run.kind == "kernels" and fd.last_run.num_kernels == 0, fd.last_run
    want = catalogue.get(name).torch_reference([t.cpu() for t in inputs], 1e-6)
    for o, w in zip(outs, want):
        assert o.device == inputs[0].device and o.shape == w.shape
    _context_is_alive()


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_of_no_rows_gives_zero_weight_grads(name):
    """dw (and db) sum over no rows: zeros, written by a kernel of the fusion specialized to
    what has elements (runtime/empty_dims.py: dx has none, the sums are fills of 0)."""
    fd = catalogue.define(name, "fp32")
    small = catalogue.make_inputs(name, 3, 5, "fp32", seed=0)
    inputs = [torch.randn([{3: 0, 5: 24}.get(d, d) for d in t.shape]).cuda() for t in small]
    outs, fallbacks = _run_quietly(fd, inputs)
    assert fd.last_run.kind == "kernels" and fd.last_run.num_kernels >= 1, fd.last_run
    assert "over a dim of size 0: a fill of 0" in fd.last_run.reason, fd.last_run
    assert not fallbacks and not fd.last_run.internal_error
    want = catalogue.get(name).torch_reference([t.cpu() for t in inputs], 1e-6)
    for o, w in zip(outs, want):
        assert o.device == inputs[0].device and o.shape == w.shape
        torch.testing.assert_close(o.cpu(), w)
    _context_is_alive()


@pytest.mark.parametrize("shape", [(7, 0), (0, 7), (0, 0)])
def test_pointwise_of_empty_tensors(shape):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(fd.ops.add(a, b)))
    a = torch.randn(shape).cuda()
    b = torch.randn(shape).cuda().t().contiguous().t()  # another empty layout
    (out,), fallbacks = _run_quietly(fd, [a, b])
    assert not fallbacks and out.shape == shape and out.device == a.device
    assert fd.last_run.num_kernels == 0, fd.last_run
    _context_is_alive()


def test_a_bare_cuda_tensor_is_refused_and_the_next_call_runs():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(x, 2.0))
    x = torch.randn(1, 4).cuda()
    with pytest.raises(InputError, match="list"):
        fd.execute(x)
    (out,) = fd.execute([x[0]])
    torch.testing.assert_close(out, x[0] * 2)
    _context_is_alive()

"""In-place outputs (fd.add_output(t, alias_input=x)) and output memory orders
(fd.ops.stride_order) on the GPU, with outputs poisoned, against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape", [(1, 7), (1023, 4097), (4096, 4096)])
def test_adamw_step_in_place_gpu(shape):
    with FusionDefinition("adamw") as fd:
        p, g, m, v = (fd.define_tensor([-1, -1], dtype=DataType.Float) for _ in range(4))
        m2 = fd.ops.add(fd.ops.mul(m, 0.9), fd.ops.mul(g, 0.1))
        v2 = fd.ops.add(fd.ops.mul(v, 0.999), fd.ops.mul(fd.ops.mul(g, g), 0.001))
        upd = fd.ops.add(fd.ops.div(fd.ops.div(m2, 0.271), fd.ops.add(
            fd.ops.sqrt(fd.ops.div(v2, 0.003)), 1e-8)), fd.ops.mul(p, 0.01))
        fd.add_output(fd.ops.sub(p, fd.ops.mul(upd, 1e-3)), alias_input=p)
        fd.add_output(m2, alias_input=m)
        fd.add_output(v2, alias_input=v)
    ins = [torch.randn(shape, device="cuda") for _ in range(3)] + [torch.rand(shape, device="cuda")]
    ptrs = [t.data_ptr() for t in ins]
    outs = run_and_check(fd, ins, scheduler="pointwise")
    assert outs == [] and [t.data_ptr() for t in ins] == ptrs


@pytest.mark.parametrize("dtype", [DataType.BFloat16, DataType.Float])
def test_channels_last_output_gpu(dtype):
    tdt = torch.bfloat16 if dtype == DataType.BFloat16 else torch.float32
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=dtype)
        y = fd.ops.relu(fd.ops.cast(x, DataType.Float))
        fd.add_output(fd.ops.stride_order(fd.ops.cast(y, dtype), [3, 0, 2, 1]))
    xs = torch.randn(8, 64, 33, 57, device="cuda", dtype=tdt)
    (out,) = run_and_check(fd, [xs], scheduler="transpose")
    assert out.is_contiguous(memory_format=torch.channels_last)

"""Plans of several kernels on the GPU: later calls of a plan run the segment plans it bound at
its first call, and write its small intermediates and in-place outputs into buffers it keeps per
stream (runtime/plan.py). Outputs poisoned, compared with float64 at every call.
"""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16 = DataType.Float, DataType.BFloat16
PER_CHANNEL = [True, False, True, True]
SEGMENTS = (("kernel", "reduction"), ("kernel", "reduction"), ("kernel", "pointwise"))


def _batchnorm_fwd(x, momentum=0.1):
    """BatchNorm training forward, running statistics updated in place: three kernels (the
    mean, the variance, the output), [C] intermediates and two in-place outputs."""
    n = x.numel() // x.shape[1]
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        tw, tb, trm, trv = (fd.define_tensor([x.shape[1]]) for _ in range(4))
        xf = fd.ops.cast(tx, F32)
        var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        y = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(mean, PER_CHANNEL)),
                       fd.ops.broadcast(fd.ops.mul(rstd, tw), PER_CHANNEL))
        fd.add_output(fd.ops.cast(fd.ops.add(y, fd.ops.broadcast(tb, PER_CHANNEL)), BF16))
        fd.add_output(rstd)
        fd.add_output(fd.ops.add(fd.ops.mul(trm, 1 - momentum), fd.ops.mul(mean, momentum)),
                      alias_input=trm)
        fd.add_output(fd.ops.add(fd.ops.mul(trv, 1 - momentum),
                                 fd.ops.mul(fd.ops.mul(var, n / (n - 1)), momentum)),
                      alias_input=trv)
    return fd


def _inputs(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g).bfloat16()
    return [x] + [torch.rand(shape[1], device="cuda", generator=g) + 0.5 for _ in range(4)]


@pytest.mark.parametrize("shape", [(4, 24, 7, 9), (32, 256, 56, 56)])
def test_a_plan_called_again_reuses_its_buffers_and_stays_right(shape):
    fd = _batchnorm_fwd(_inputs(shape, 0)[0])
    for seed in range(3):       # new values, same signature: the bound plan
        run_and_check(fd, _inputs(shape, seed), kernels=3, segments=SEGMENTS)
    (plan,) = fd._executor._plans.values()
    assert plan.bound is not None
    # The [C] intermediates and the two in-place outputs go to buffers the plan keeps.
    reused = sum(len(specs) for _, specs in plan.reused.values())
    assert reused >= 4, plan.reused
    (buffers,) = plan._reuse.values()
    ptrs = [t.data_ptr() for step in buffers if step for t in step if t is not None]
    run_and_check(fd, _inputs(shape, 7), kernels=3, segments=SEGMENTS)
    (again,) = plan._reuse.values()
    assert [t.data_ptr() for step in again if step for t in step if t is not None] == ptrs


def test_a_plan_on_another_stream_gets_buffers_of_its_own():
    shape = (8, 40, 5, 11)
    fd = _batchnorm_fwd(_inputs(shape, 0)[0])
    for seed in (1, 3):         # the first call makes the plan, the second takes buffers
        run_and_check(fd, _inputs(shape, seed), kernels=3, segments=SEGMENTS)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        inputs = _inputs(shape, 2)
        run_and_check(fd, inputs, kernels=3, segments=SEGMENTS)
    torch.cuda.current_stream().wait_stream(side)
    (plan,) = fd._executor._plans.values()
    first, second = plan._reuse.values()
    ptrs = [{t.data_ptr() for step in b if step for t in step if t is not None}
            for b in (first, second)]
    assert ptrs[0] and not ptrs[0] & ptrs[1]

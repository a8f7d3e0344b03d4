"""Plans of several kernels on the GPU: later calls of a plan run the segment plans it bound at
its first call, and write its small intermediates and in-place outputs into buffers it keeps per
stream (runtime/plan.py). Outputs poisoned, compared with float64 at every call.
"""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.rewritten_plan import RewrittenPlan
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16 = DataType.Float, DataType.BFloat16
PER_CHANNEL = [True, False, True, True]
SEGMENTS = (("kernel", "reduction"), ("kernel", "pointwise"))


def _batchnorm_fwd(x, momentum=0.1):
    """BatchNorm training forward, running statistics updated in place: two kernels (the mean
    and the variance in one pass, schedule/one_pass_variance.py; the output), [C]
    intermediates and two in-place outputs."""
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


def _segmented_plan(fd):
    """The plan of several segments fd's last call ran: the split's, which runs through an
    executor of its own (schedule/split_normalizations.py)."""
    (plan,) = fd._executor._plans.values()
    assert isinstance(plan, RewrittenPlan), plan
    (plan,) = plan.executor._plans.values()
    return plan


@pytest.mark.parametrize("shape", [(4, 24, 7, 9), (32, 256, 56, 56)])
def test_a_plan_called_again_reuses_its_buffers_and_stays_right(shape):
    fd = _batchnorm_fwd(_inputs(shape, 0)[0])
    for seed in range(3):       # new values, same signature: the bound plan
        run_and_check(fd, _inputs(shape, seed), kernels=2, segments=SEGMENTS)
    plan = _segmented_plan(fd)
    assert plan.bound is not None
    # The [C] intermediates go to buffers the plan keeps (the in-place outputs are the
    # rewritten fusion's plain ones, copied into their inputs by fd's executor).
    reused = sum(len(specs) for _, specs in plan.reused.values())
    assert reused >= 2, plan.reused
    (buffers,) = plan._reuse.values()
    ptrs = [t.data_ptr() for step in buffers if step for t in step if t is not None]
    run_and_check(fd, _inputs(shape, 7), kernels=2, segments=SEGMENTS)
    (again,) = plan._reuse.values()
    assert [t.data_ptr() for step in again if step for t in step if t is not None] == ptrs


def test_a_plan_on_another_stream_gets_buffers_of_its_own():
    shape = (8, 40, 5, 11)
    fd = _batchnorm_fwd(_inputs(shape, 0)[0])
    for seed in (1, 3):         # the first call makes the plan, the second takes buffers
        run_and_check(fd, _inputs(shape, seed), kernels=2, segments=SEGMENTS)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        inputs = _inputs(shape, 2)
        run_and_check(fd, inputs, kernels=2, segments=SEGMENTS)
    torch.cuda.current_stream().wait_stream(side)
    plan = _segmented_plan(fd)
    first, second = plan._reuse.values()
    ptrs = [{t.data_ptr() for step in b if step for t in step if t is not None}
            for b in (first, second)]
    assert ptrs[0] and not ptrs[0] & ptrs[1]


def _batchnorm_bwd(x):
    """BatchNorm training backward (dx in x's memory format, dw, db) from the saved mean and
    rstd: x_hat is forwarded into both segments, sum(dy) and sum(dy * x_hat) share one kernel."""
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and x.dim() == 4 \
        and not x.is_contiguous()
    n = x.numel() // x.shape[1]
    with FusionDefinition() as fd:
        tx, tdy = fd.from_pytorch(x), fd.from_pytorch(x)
        tw, tm, tr = (fd.define_tensor([x.shape[1]]) for _ in range(3))
        xf, dyf = fd.ops.cast(tx, F32), fd.ops.cast(tdy, F32)
        xhat = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(tm, PER_CHANNEL)),
                          fd.ops.broadcast(tr, PER_CHANNEL))
        db = fd.ops.sum(dyf, [0, 2, 3])
        dw = fd.ops.sum(fd.ops.mul(dyf, xhat), [0, 2, 3])
        inner = fd.ops.sub(fd.ops.sub(dyf, fd.ops.broadcast(fd.ops.mul(db, 1.0 / n), PER_CHANNEL)),
                           fd.ops.mul(xhat, fd.ops.broadcast(fd.ops.mul(dw, 1.0 / n),
                                                             PER_CHANNEL)))
        dx = fd.ops.cast(fd.ops.mul(inner, fd.ops.broadcast(fd.ops.mul(tr, tw), PER_CHANNEL)),
                         BF16)
        fd.add_output(fd.ops.stride_order(dx, [3, 0, 2, 1]) if channels_last else dx)
        fd.add_output(dw)
        fd.add_output(db)
    return fd


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("shape", [(3, 40, 9, 13), (32, 256, 56, 56)])
def test_batchnorm_backward_runs_a_reduction_kernel_and_a_pointwise_kernel(shape, channels_last):
    g = torch.Generator(device="cuda").manual_seed(11)
    x, dy = (torch.randn(shape, device="cuda", generator=g).bfloat16() for _ in range(2))
    if channels_last:
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    mean = x.float().mean((0, 2, 3))
    rstd = torch.rsqrt(x.float().var((0, 2, 3), unbiased=False) + 1e-5)
    w = torch.rand(shape[1], device="cuda", generator=g) + 0.5
    fd = _batchnorm_bwd(x)
    if channels_last and shape[0] * shape[2] * shape[3] < 4096:
        # The image's rows fit on chip: the outer persistent scheduler takes it whole.
        run_and_check(fd, [x, dy, w, mean, rstd], scheduler="outer_persistent")
    else:
        run_and_check(fd, [x, dy, w, mean, rstd], kernels=2,
                      segments=(("kernel", "reduction"), ("kernel", "pointwise")))
    if channels_last:
        assert fd.execute([x, dy, w, mean, rstd])[0].is_contiguous(
            memory_format=torch.channels_last)

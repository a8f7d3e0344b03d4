"""Helpers shared by the segmentation tests (test_segmented_plans, test_segmentation_cache)."""
from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.ir.dtype import DataType


def refuse_full_reductions(monkeypatch):
    """Every scheduler takes every single op now; to test reference segments, the reduction
    scheduler is made to refuse full reductions as it did before it had a schedule for them.
    The test also takes the `isolated_cache` fixture, so that the refusal is not kept on disk."""
    from pyfuser.schedule.schedulers import reduction
    takes = reduction.can_schedule

    def refusing(fusion):
        ok, why = takes(fusion)
        return (False, "a full reduction (refused by this test)") if why.startswith("full") \
            else (ok, why)
    monkeypatch.setattr(reduction, "can_schedule", refusing)


def batchnorm_backward(stride_order=None, scale=0.01) -> FusionDefinition:
    """dx, dw, db of BatchNorm2d training from the saved mean and rstd (tools/bench_issue16's
    fusion): two segments in NCHW; in channels-last, one outer persistent kernel, or two
    segments where that scheduler is refused."""
    per_channel = [True, False, True, True]
    with FusionDefinition() as fd:
        x, dy = (fd.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16,
                                  stride_order=stride_order) for _ in range(2))
        w, mean, rstd = (fd.define_tensor([-1]) for _ in range(3))
        xf, dyf = fd.ops.cast(x, DataType.Float), fd.ops.cast(dy, DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(mean, per_channel)),
                          fd.ops.broadcast(rstd, per_channel))
        db = fd.ops.sum(dyf, [0, 2, 3])
        dw = fd.ops.sum(fd.ops.mul(dyf, xhat), [0, 2, 3])
        inner = fd.ops.sub(fd.ops.sub(dyf, fd.ops.broadcast(fd.ops.mul(db, scale), per_channel)),
                           fd.ops.mul(xhat, fd.ops.broadcast(fd.ops.mul(dw, scale), per_channel)))
        dx = fd.ops.mul(inner, fd.ops.broadcast(fd.ops.mul(rstd, w), per_channel))
        dx = fd.ops.cast(dx, DataType.BFloat16)
        fd.add_output(fd.ops.stride_order(dx, stride_order) if stride_order else dx)
        fd.add_output(dw)
        fd.add_output(db)
    return fd

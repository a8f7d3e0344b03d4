"""BatchNorm's statistics reduction alone (the sum over N, H, W of cast(x), x [32, 256, 56, 56]
bf16, NCHW or channels-last) under forced reduction heuristics, on the GPU:

    PYTHONPATH=. python tools/sweep_bn_stats.py "grid_split=2" "grid_split=4, bdimx=256" ...
    PYTHONPATH=. python tools/sweep_bn_stats.py --backward "vector=4" ...
    PYTHONPATH=. python tools/sweep_bn_stats.py --one-pass "bdimx=32, bdimy=8" ...

Each argument is the default heuristic with those fields replaced. GB/s count x read once.
--backward: BatchNorm backward's two sums instead, sum(dy) and sum(dy * (x - mean) * rstd)
from the saved fp32 mean and rstd [C] (one kernel, two reductions); GB/s count x and dy.
--one-pass: the forward's one-pass statistics (schedule/one_pass_variance.py), the float64
sums of x and x * x in one kernel; GB/s count x.
--nhwc: the channels-last image alone; --batch=N: N images instead of 32 (what is fixed per
launch shows at small N).
"""
import dataclasses
import sys

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers.reduction import ReductionParams  # noqa: F401 - for eval


def _backward_sums(x):
    dy = torch.randn_like(x)
    mean, rstd = x.float().mean((0, 2, 3)), torch.rand(x.shape[1], device="cuda") + 0.5
    per_channel = [True, False, True, True]
    with FusionDefinition() as fd:
        tx, tdy, tm, tr = (fd.from_pytorch(t) for t in (x, dy, mean, rstd))
        dyf = fd.ops.cast(tdy, DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(tx, DataType.Float),
                                     fd.ops.broadcast(tm, per_channel)),
                          fd.ops.broadcast(tr, per_channel))
        fd.add_output(fd.ops.sum(dyf, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xhat), [0, 2, 3]))
    ref = dy.float().sum((0, 2, 3))
    return fd, [x, dy, mean, rstd], ref, 2 * x.numel() * 2


def _one_pass_sums(x):
    per_channel = [0, 2, 3]
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        xd = fd.ops.cast(tx, DataType.Double)
        fd.add_output(fd.ops.sum(xd, per_channel))
        fd.add_output(fd.ops.sum(fd.ops.mul(xd, xd), per_channel))
    return fd, [x], x.double().sum((0, 2, 3)), x.numel() * 2


def main(variants, backward=False, one_pass=False) -> int:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    batch = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--batch=")), 32))
    for channels_last in ((True,) if "--nhwc" in sys.argv else (False, True)):
        x = torch.randn(batch, 256, 56, 56, device="cuda").bfloat16()
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if backward:
            fd, inputs, ref, nbytes = _backward_sums(x)
        elif one_pass:
            fd, inputs, ref, nbytes = _one_pass_sums(x)
        else:
            with FusionDefinition() as fd:
                tx = fd.from_pytorch(x)
                fd.add_output(fd.ops.sum(fd.ops.cast(tx, DataType.Float), [0, 2, 3]))
            inputs, ref, nbytes = [x], x.float().sum((0, 2, 3)), x.numel() * 2
        fd.execute(inputs)
        default = fd.last_run.heuristics[0]
        layout = "NHWC" if channels_last else "NCHW"
        for text in [None] + list(variants):
            h = None if text is None else eval(f"dataclasses.replace(default, {text})",
                                               globals(), {"default": default})
            opt = {"heuristic": h} if h is not None else None
            try:
                out = fd.execute(inputs, options=opt)[0]
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                ms = _bench(lambda: fd.execute(inputs, options=opt))
            except Exception as e:      # noqa: BLE001 - a variant the scheduler refuses
                print(f"{layout} {text}: {type(e).__name__}: {e}"[:200])
                continue
            used = fd.last_run.heuristics[0]
            kernels = fd.kernels(last_run=True)
            rep = kernels[0].module.ptxas if kernels and kernels[0].module is not None else None
            regs = (f"{rep.registers} registers, {rep.spill_store_bytes} B spilled; "
                    if rep is not None else "")
            print(f"{layout} {text or 'default'}: {nbytes / ms / 1e6:.0f} GB/s, "
                  f"{ms * 1e3:.1f} us, err {err:.1e}; {regs}{used.describe()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main([a for a in sys.argv[1:] if not a.startswith("--")],
                          backward="--backward" in sys.argv, one_pass="--one-pass" in sys.argv))

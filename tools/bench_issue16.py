"""The bars of the issue "A scheduler for every reduction pattern" that the catalogue does not
hold, same run as eager and torch.compile (GPU machine), or their plans on the CPU:

    PYTHONPATH=. python tools/bench_issue16.py            # GPU: times and GB/s
    PYTHONPATH=. python tools/bench_issue16.py --explain  # CPU: each fusion's plan (H100 table)
    PYTHONPATH=. python tools/bench_issue16.py groupnorm  # the cases whose name holds a word

BatchNorm2d training forward (y bf16, save_mean, save_rstd, running statistics updated in place)
and backward (dx, dw, db) of [32, 256, 56, 56] in NCHW and channels-last, fp32 weight and bias;
GroupNorm(32) forward of [8, 320, 64, 64]; logsumexp over rows of [4096, 128256]; the column
sum of an [8192, 16384] column-major tensor; softmax of a transposed [4096, 8192] input. GB/s
count each tensor read or written once (the floor); times: tools/bench_cases.py (interleaved
rounds of triton's do_bench, which clears the L2 before each run; the median ratio).
"""
from __future__ import annotations

import sys

import bench_cases
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.catalogue import CHANNELS_LAST

BF16, F32 = DataType.BFloat16, DataType.Float
EPS, MOMENTUM = 1e-5, 0.1
PER_CHANNEL = [True, False, True, True]     # a [C] tensor broadcast over N, H, W


def _image(device, channels_last, seed=0):
    g = torch.Generator(device=device).manual_seed(seed) if device != "meta" else None
    shape = (32, 256, 56, 56)
    x = (torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g)
         if device != "meta" else torch.empty(shape, device=device, dtype=torch.bfloat16))
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _channel(device, value=None, seed=1):
    if device == "meta":
        return torch.empty(256, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    v = torch.rand(256, device=device, generator=g) + 0.5
    return v.fill_(value) if value is not None else v


def batchnorm_fwd(device, channels_last):
    x = _image(device, channels_last)
    w, b = _channel(device, seed=1), _channel(device, seed=2)
    rm, rv = _channel(device, 0.0), _channel(device, 1.0)
    n = x.numel() // x.shape[1]
    with FusionDefinition("batchnorm_fwd") as fd:
        tx, tw, tb, trm, trv = (fd.from_pytorch(t) for t in (x, w, b, rm, rv))
        xf = fd.ops.cast(tx, F32)
        var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0)
        rstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
        scale = fd.ops.mul(rstd, tw)
        y = fd.ops.add(fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(mean, PER_CHANNEL)),
                                  fd.ops.broadcast(scale, PER_CHANNEL)),
                       fd.ops.broadcast(tb, PER_CHANNEL))
        y = fd.ops.cast(y, BF16)
        # Written in the input's memory format, as torch's batch_norm does.
        fd.add_output(fd.ops.stride_order(y, CHANNELS_LAST) if channels_last else y)
        fd.add_output(mean)
        fd.add_output(rstd)
        fd.add_output(fd.ops.add(fd.ops.mul(trm, 1 - MOMENTUM), fd.ops.mul(mean, MOMENTUM)),
                      alias_input=trm)
        unbiased = fd.ops.mul(var, n / (n - 1))
        fd.add_output(fd.ops.add(fd.ops.mul(trv, 1 - MOMENTUM), fd.ops.mul(unbiased, MOMENTUM)),
                      alias_input=trv)
    inputs = [x, w, b, rm, rv]

    def eager():
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=MOMENTUM, eps=EPS)
    return fd, inputs, eager, 4 * x.numel()


def batchnorm_bwd(device, channels_last):
    x = _image(device, channels_last)
    dy = _image(device, channels_last, seed=3)
    w = _channel(device, seed=1)
    if device == "meta":
        mean, rstd = _channel(device), _channel(device)
    else:
        mean = x.float().mean((0, 2, 3))
        rstd = torch.rsqrt(x.float().var((0, 2, 3), unbiased=False) + EPS)
    n = x.numel() // x.shape[1]
    with FusionDefinition("batchnorm_bwd") as fd:
        tx, tdy, tw, tm, tr = (fd.from_pytorch(t) for t in (x, dy, w, mean, rstd))
        xf, dyf = fd.ops.cast(tx, F32), fd.ops.cast(tdy, F32)
        xhat = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(tm, PER_CHANNEL)),
                          fd.ops.broadcast(tr, PER_CHANNEL))
        db = fd.ops.sum(dyf, [0, 2, 3])
        dw = fd.ops.sum(fd.ops.mul(dyf, xhat), [0, 2, 3])
        k = fd.ops.mul(tr, tw)
        inner = fd.ops.sub(fd.ops.sub(dyf, fd.ops.broadcast(fd.ops.mul(db, 1.0 / n), PER_CHANNEL)),
                           fd.ops.mul(xhat, fd.ops.broadcast(fd.ops.mul(dw, 1.0 / n),
                                                             PER_CHANNEL)))
        dx = fd.ops.cast(fd.ops.mul(inner, fd.ops.broadcast(k, PER_CHANNEL)), BF16)
        fd.add_output(fd.ops.stride_order(dx, CHANNELS_LAST) if channels_last else dx)
        fd.add_output(dw)
        fd.add_output(db)
    inputs = [x, dy, w, mean, rstd]

    def eager():
        return torch.ops.aten.native_batch_norm_backward(
            dy, x, w, None, None, mean, rstd, True, EPS, [True, True, True])
    return fd, inputs, eager, 6 * x.numel()


def groupnorm_fwd(device):
    N, C, H, W, G = 8, 320, 64, 64, 32
    x = (torch.randn(N, C, H, W, device=device, dtype=torch.bfloat16) if device != "meta"
         else torch.empty(N, C, H, W, device=device, dtype=torch.bfloat16))
    w, b = (torch.rand(C, device=device) + 0.5 if device != "meta" else
            torch.empty(C, device=device) for _ in range(2))
    with FusionDefinition("groupnorm_fwd") as fd:
        tx, tw, tb = (fd.from_pytorch(t) for t in (x, w, b))
        xg = fd.ops.reshape(fd.ops.cast(tx, F32), [N, G, C // G * H * W])
        var, mean = fd.ops.var_mean(xg, [2], correction=0, keepdim=True)
        yg = fd.ops.mul(fd.ops.sub(xg, mean), fd.ops.rsqrt(fd.ops.add(var, EPS)))
        y = fd.ops.reshape(yg, [N, C, H, W])
        y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(tw, PER_CHANNEL)),
                       fd.ops.broadcast(tb, PER_CHANNEL))
        fd.add_output(fd.ops.cast(y, BF16))
    inputs = [x, w, b]
    # torch's group_norm takes weights of the input's dtype.
    w16, b16 = w.to(torch.bfloat16), b.to(torch.bfloat16)

    def eager():
        return F.group_norm(x, G, w16, b16, EPS)
    return fd, inputs, eager, 4 * x.numel()


def logsumexp(device):
    M, N = 4096, 128256
    x = (torch.randn(M, N, device=device, dtype=torch.bfloat16) if device != "meta"
         else torch.empty(M, N, device=device, dtype=torch.bfloat16))
    with FusionDefinition("logsumexp") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        m = fd.ops.max(xf, [1], keepdim=True)
        s = fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, m)), [1], keepdim=True)
        fd.add_output(fd.ops.squeeze(fd.ops.add(fd.ops.log(s), m), [1]))

    def eager():
        return torch.logsumexp(x.float(), dim=1)
    return fd, [x], eager, 2 * x.numel()


def colsum_colmajor(device):
    x = (torch.randn(16384, 8192, device=device, dtype=torch.bfloat16) if device != "meta"
         else torch.empty(16384, 8192, device=device, dtype=torch.bfloat16)).t()
    with FusionDefinition("colsum_colmajor") as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), F32), [0]))

    def eager():
        return x.float().sum(0)
    return fd, [x], eager, 2 * x.numel()


def softmax_transposed(device):
    x = (torch.randn(8192, 4096, device=device, dtype=torch.bfloat16) if device != "meta"
         else torch.empty(8192, 4096, device=device, dtype=torch.bfloat16)).t()
    with FusionDefinition("softmax_transposed") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), BF16))

    def eager():
        return torch.softmax(x.float(), dim=1).to(torch.bfloat16)
    return fd, [x], eager, 4 * x.numel()


def batchnorm_fwd_nchw(device):
    """The NCHW forward alone (tools/host_timing_gpu.py --name bench_issue16:batchnorm_fwd_nchw)."""
    return batchnorm_fwd(device, False)


def batchnorm_fwd_nhwc(device):
    """The channels-last forward alone (tools/profile_gpu.sh bench_issue16:batchnorm_fwd_nhwc -)."""
    return batchnorm_fwd(device, True)


def batchnorm_bwd_nhwc(device):
    """The channels-last backward alone (tools/profile_case.py bench_issue16:batchnorm_bwd_nhwc)."""
    return batchnorm_bwd(device, True)


CASES = {
    "batchnorm_fwd NCHW": lambda d: batchnorm_fwd(d, False),
    "batchnorm_fwd NHWC": lambda d: batchnorm_fwd(d, True),
    "batchnorm_bwd NCHW": lambda d: batchnorm_bwd(d, False),
    "batchnorm_bwd NHWC": lambda d: batchnorm_bwd(d, True),
    "groupnorm_fwd [8,320,64,64]": groupnorm_fwd,
    "logsumexp [4096,128256]": logsumexp,
    "colsum col-major [8192,16384]": colsum_colmajor,
    "softmax transposed [4096,8192]": softmax_transposed,
}


if __name__ == "__main__":
    cases = bench_cases.selected(CASES, sys.argv[1:])
    raise SystemExit(bench_cases.explain(cases) if "--explain" in sys.argv
                     else bench_cases.bench(cases))

"""Fusions that return row statistics, and their inputs: shared by the interpreter tests
(tests/lower/test_statistic_outputs.py) and the GPU tests (tests/gpu/test_statistic_outputs_gpu.py).

Forward: RMSNorm with rstd, LayerNorm with mean and rstd, var_mean and var over rows, RMSNorm
whose rstd is returned cast and after a broadcast, softmax with its row max and logsumexp; each
with keepdim statistics ([M, 1]) or squeezed ones ([M]). Backward: RMSNorm / LayerNorm backward
taking rstd (and mean) as [M, 1] inputs or as [M] inputs broadcast in the fusion.
"""
from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition

DT = {"fp32": DataType.Float, "bf16": DataType.BFloat16, "fp16": DataType.Half}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
F32 = DataType.Float


def _stat(fd, t, keepdim):
    """A [M, 1] statistic as an output: as is (keepdim) or squeezed to [M]."""
    fd.add_output(t if keepdim else fd.ops.squeeze(t, [1]))


def rmsnorm_rstd(dt, keepdim):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), 1e-6))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(xf, rstd), fd.ops.cast(w, F32)), DT[dt]))
        _stat(fd, rstd, keepdim)
    return fd


def layernorm_stats(dt, keepdim):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        b = fd.define_tensor([-1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), fd.ops.cast(w, F32)),
                       fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(y, DT[dt]))
        _stat(fd, mean, keepdim)
        _stat(fd, rstd, keepdim)
    return fd


def var_mean_rows(dt, keepdim):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        var, mean = fd.ops.var_mean(x, [1], keepdim=keepdim)
        fd.add_output(var)
        fd.add_output(mean)
    return fd


def var_rows(dt, keepdim):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        fd.add_output(fd.ops.var(x, [1], keepdim=keepdim))
    return fd


def rmsnorm_rstd_cast_and_broadcast(dt, keepdim):
    """rstd [M] computed without keepdim, broadcast for the row, and returned cast to the input
    dtype and (times 2) after the broadcast ([M, 1]) or before it ([M])."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1]), 1e-6))
        rb = fd.ops.broadcast(rstd, [False, True])
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(xf, rb), fd.ops.cast(w, F32)), DT[dt]))
        fd.add_output(fd.ops.cast(rstd, DT[dt]))
        fd.add_output(fd.ops.mul(rb if keepdim else rstd, 2.0))
    return fd


def softmax_stats(dt, keepdim):
    """softmax, its row max and its logsumexp."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        m = fd.ops.max(xf, [1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(xf, m))
        s = fd.ops.sum(e, [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.div(e, s), DT[dt]))
        _stat(fd, m, keepdim)
        _stat(fd, fd.ops.add(fd.ops.log(s), m), keepdim)
    return fd


# name -> (builder, number of inputs: the rows, then weight vectors)
FORWARD = {"rmsnorm_rstd": (rmsnorm_rstd, 2), "layernorm_stats": (layernorm_stats, 3),
           "var_mean_rows": (var_mean_rows, 1), "var_rows": (var_rows, 1),
           "rmsnorm_rstd_cast": (rmsnorm_rstd_cast_and_broadcast, 2),
           "softmax_stats": (softmax_stats, 1)}


def forward(name, dt, keepdim, M, N, device="cpu", seed=0):
    """(FusionDefinition, inputs) of forward fusion `name`."""
    build, n_inputs = FORWARD[name]
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(M, N, generator=g)]
    inputs += [torch.randn(N, generator=g) for _ in range(n_inputs - 1)]
    return build(dt, keepdim), [x.to(device=device, dtype=TORCH[dt]) for x in inputs]


def norm_backward(name, dt, keepdim, M, N, device="cpu", seed=0):
    """(FusionDefinition, inputs) of `rmsnorm_bwd` or `layernorm_bwd` taking rstd (and mean) as
    [M, 1] inputs (keepdim) or as [M] inputs broadcast in the fusion."""
    g = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(M, N, generator=g).to(TORCH[dt]) for _ in range(2))
    w = torch.randn(N, generator=g).to(TORCH[dt])
    var, mean = torch.var_mean(x.float(), 1, correction=0, keepdim=keepdim)
    rstd = torch.rsqrt(var + 1e-5)
    layer = name == "layernorm_bwd"
    with FusionDefinition() as fd:
        tx, tdy = (fd.define_tensor([-1, -1], dtype=DT[dt]) for _ in range(2))
        tw = fd.define_tensor([-1], dtype=DT[dt])

        def stat():
            if keepdim:
                return fd.define_tensor([-1, 1], dtype=F32)
            return fd.ops.broadcast(fd.define_tensor([-1], dtype=F32), [False, True])
        tmean = stat() if layer else None
        trstd = stat()
        xf, dyf = fd.ops.cast(tx, F32), fd.ops.cast(tdy, F32)
        xhat = fd.ops.mul(fd.ops.sub(xf, tmean) if layer else xf, trstd)
        gw = fd.ops.mul(dyf, fd.ops.cast(tw, F32))
        d = fd.ops.sub(gw, fd.ops.mul(xhat, fd.ops.mean(fd.ops.mul(gw, xhat), [1], keepdim=True)))
        if layer:
            d = fd.ops.sub(d, fd.ops.mean(gw, [1], keepdim=True))
        fd.add_output(fd.ops.cast(fd.ops.mul(d, trstd), DT[dt]))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), DT[dt]))
        if layer:
            fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), DT[dt]))
    inputs = [x, dy, w] + ([mean] if layer else []) + [rstd]
    return fd, [t.to(device) for t in inputs]


def var_of_a_recomputed_product(rows: int, device="cpu"):
    """var(relu(x) * w, [1], correction=1) over rows of one element (0 / 0: NaN, as torch
    gives it) beside mean(x, [0]): the kernel computes relu(x) * w twice, for the sum and for
    x - mean (fuzz 20261127:735). Returns (fd, [x [rows, 1] fp16, w [1, 1] fp32])."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1, generator=g).half().to(device)
    w = torch.randn(1, 1, generator=g).to(device)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Half)
        t2 = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Float)
        fd.add_output(fd.ops.mean(t0, [0]))
        fd.add_output(fd.ops.var(fd.ops.mul(fd.ops.relu(t0), t2), [1], correction=1))
    return fd, [x, w]

"""Fusions whose outputs have different shapes that broadcast to one another, and their inputs:
shared by the interpreter tests (tests/lower/test_broadcast_outputs.py) and the GPU tests
(tests/gpu/test_broadcast_outputs_gpu.py).

Each builder takes (dt, M, N, device) and returns (FusionDefinition, inputs). The main output is
[M, N] (or [M, N, K]); beside it, outputs of fewer elements that broadcast to it: an [M, 1]
column and a [1, N] row of inputs, a [1, 1] scalar-like tensor, a [N] weight times 2, a row
statistic broadcast back to [M, N] through broadcast_in_dim or expand (stride 0 along N: one
element per row in memory), a [1]-shaped input with its own output; beside a reduction, the
column or row its input is scaled by, and the reduction expanded back.
"""
from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition

DT = {"fp32": DataType.Float, "bf16": DataType.BFloat16, "fp16": DataType.Half}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
F32 = DataType.Float


def _randn(shapes, dt, device, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device=device, dtype=TORCH[dt]) for s in shapes]


# Pointwise ---------------------------------------------------------------------------------------
def column_row_and_full(dt, M, N, device="cpu", seed=0, full_first=False):
    """exp(c) [M, 1], -r [1, N] and a * c + r [M, N] (which broadcasts both): the [M, N] output
    first or last."""
    inputs = _randn([(M, 1), (1, N), (M, N)], dt, device, seed)
    with FusionDefinition() as fd:
        c = fd.define_tensor([-1, 1], dtype=DT[dt])
        r = fd.define_tensor([1, -1], dtype=DT[dt])
        a = fd.define_tensor([-1, -1], dtype=DT[dt])
        cf, rf, af = (fd.ops.cast(t, F32) for t in (c, r, a))
        outs = [fd.ops.exp(cf), fd.ops.neg(rf), fd.ops.add(fd.ops.mul(af, cf), rf)]
        for o in (outs[::-1] if full_first else outs):
            fd.add_output(fd.ops.cast(o, DT[dt]))
    return fd, inputs


def full_first(dt, M, N, device="cpu", seed=0):
    return column_row_and_full(dt, M, N, device, seed, full_first=True)


def expanded_column(dt, M, N, device="cpu", seed=0):
    """x * exp(c) [M, N] and exp(c) expanded to [M, N] (stride 0 along N)."""
    inputs = _randn([(M, 1), (M, N)], dt, device, seed)
    with FusionDefinition() as fd:
        c = fd.define_tensor([-1, 1], dtype=DT[dt])
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        e = fd.ops.exp(fd.ops.cast(c, F32))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(x, F32), e), DT[dt]))
        fd.add_output(fd.ops.expand(e, [M, N]))
    return fd, inputs


def three_d(dt, M, N, device="cpu", seed=0):
    """exp(a) [M, 1, K], c * a + b [M, N, K] and -b [1, N, 1], K = 8."""
    inputs = _randn([(M, 1, 8), (1, N, 1), (M, N, 8)], dt, device, seed)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 1, -1], dtype=DT[dt])
        b = fd.define_tensor([1, -1, 1], dtype=DT[dt])
        c = fd.define_tensor([-1, -1, -1], dtype=DT[dt])
        af, bf, cf = (fd.ops.cast(t, F32) for t in (a, b, c))
        fd.add_output(fd.ops.exp(af))
        fd.add_output(fd.ops.add(fd.ops.mul(cf, af), bf))
        fd.add_output(fd.ops.neg(bf))
    return fd, inputs


# Normalization forward (inner persistent) --------------------------------------------------------
def layernorm_weight_out(dt, M, N, device="cpu", seed=0):
    """LayerNorm y [M, N] and its weight times 2 ([N], float)."""
    inputs = _randn([(M, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        xf, wf = fd.ops.cast(x, F32), fd.ops.cast(w, F32)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))), wf)
        fd.add_output(fd.ops.cast(y, DT[dt]))
        fd.add_output(fd.ops.mul(wf, 2.0))
    return fd, inputs


def rmsnorm_rstd_broadcast_in_dim(dt, M, N, device="cpu", seed=0):
    """RMSNorm y [M, N] and its rstd [M] broadcast to [M, N] with broadcast_in_dim."""
    inputs = _randn([(M, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1]), 1e-6))
        rb = fd.ops.broadcast_in_dim(rstd, [M, N], [0])
        fd.add_output(fd.ops.cast(fd.ops.mul(xf, rb), DT[dt]))
        fd.add_output(rb)
    return fd, inputs


def rmsnorm_rstd_expand(dt, M, N, device="cpu", seed=0):
    """RMSNorm y [M, N] and its rstd [M, 1] expanded to [M, N]."""
    inputs = _randn([(M, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), 1e-6))
        fd.add_output(fd.ops.cast(fd.ops.mul(xf, rstd), DT[dt]))
        fd.add_output(fd.ops.expand(rstd, [M, N]))
    return fd, inputs


def scaled_softmax_scale_out(dt, M, N, device="cpu", seed=0):
    """softmax(x * s) [M, N] with s a [1]-shaped input, and s * 3 ([1])."""
    inputs = _randn([(M, N), (1,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        s = fd.define_tensor([1], dtype=DT[dt])
        sf = fd.ops.cast(s, F32)
        z = fd.ops.mul(fd.ops.cast(x, F32), sf)
        e = fd.ops.exp(fd.ops.sub(z, fd.ops.max(z, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), DT[dt]))
        fd.add_output(fd.ops.mul(sf, 3.0))
    return fd, inputs


def softmax_column_expanded(dt, M, N, device="cpu", seed=0):
    """softmax(x * c) [M, N] and exp(c) expanded to [M, N], c an [M, 1] input: the expanded
    output's loops are split like the row's (its vector split too), over one element."""
    inputs = _randn([(M, N), (M, 1)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        c = fd.define_tensor([-1, 1], dtype=DT[dt])
        cf = fd.ops.cast(c, F32)
        z = fd.ops.mul(fd.ops.cast(x, F32), cf)
        e = fd.ops.exp(fd.ops.sub(z, fd.ops.max(z, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), DT[dt]))
        fd.add_output(fd.ops.expand(fd.ops.exp(cf), [M, N]))
    return fd, inputs


# Normalization backward (inner-outer persistent) -------------------------------------------------
def norm_backward_row_statistic_expand(dt, M, N, device="cpu", seed=0):
    """An RMSNorm-backward-like fusion: dx [M, N], dw [N], and the row statistic
    mean(gw * x) [M, 1] expanded to [M, N]."""
    inputs = _randn([(M, N), (M, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        dy = fd.define_tensor([-1, -1], dtype=DT[dt])
        w = fd.define_tensor([-1], dtype=DT[dt])
        xf, dyf, wf = (fd.ops.cast(t, F32) for t in (x, dy, w))
        gw = fd.ops.mul(dyf, wf)
        m = fd.ops.mean(fd.ops.mul(gw, xf), [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.sub(gw, fd.ops.mul(xf, m)), DT[dt]))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xf), [0]), DT[dt]))
        fd.add_output(fd.ops.expand(m, [M, N]))
    return fd, inputs


# Reductions (no broadcast back) ----------------------------------------------------------------
def row_sums_and_column_out(dt, M, N, device="cpu", seed=0):
    """sum(x * c, 1) [M] and exp(c) [M, 1] of the column c the rows are scaled by."""
    inputs = _randn([(M, N), (M, 1)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        c = fd.define_tensor([-1, 1], dtype=DT[dt])
        cf = fd.ops.cast(c, F32)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(x, F32), cf), [1]))
        fd.add_output(fd.ops.exp(cf))
    return fd, inputs


def column_sums_and_row_out(dt, M, N, device="cpu", seed=0):
    """sum(x + b, 0) [1, N] (keepdim) and b * 2 [1, N] of the row b added to every row."""
    inputs = _randn([(M, N), (1, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        b = fd.define_tensor([1, -1], dtype=DT[dt])
        bf = fd.ops.cast(b, F32)
        fd.add_output(fd.ops.sum(fd.ops.add(fd.ops.cast(x, F32), bf), [0], keepdim=True))
        fd.add_output(fd.ops.mul(bf, 2.0))
    return fd, inputs


def column_sums_and_column_out(dt, M, N, device="cpu", seed=0):
    """sum(x * c, 0) [N] and exp(c) [M, 1]: the column iterates the reduced dim."""
    inputs = _randn([(M, N), (M, 1)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        c = fd.define_tensor([-1, 1], dtype=DT[dt])
        cf = fd.ops.cast(c, F32)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(x, F32), cf), [0]))
        fd.add_output(fd.ops.exp(cf))
    return fd, inputs


def row_sums_and_row_out(dt, M, N, device="cpu", seed=0):
    """sum(x * b, 1) [M] and b * 2 [1, N]: the row iterates the reduced dim."""
    inputs = _randn([(M, N), (1, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        b = fd.define_tensor([1, -1], dtype=DT[dt])
        bf = fd.ops.cast(b, F32)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(x, F32), bf), [1]))
        fd.add_output(fd.ops.mul(bf, 2.0))
    return fd, inputs


def row_sums_expanded(dt, M, N, device="cpu", seed=0):
    """sum(x, 1) [M, 1] (keepdim) and the same expanded to [M, N]."""
    inputs = _randn([(M, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        s = fd.ops.sum(fd.ops.cast(x, F32), [1], keepdim=True)
        fd.add_output(s)
        fd.add_output(fd.ops.expand(s, [M, N]))
    return fd, inputs


# name -> (builder, scheduler)
FUSIONS = {
    "column_row_and_full": (column_row_and_full, "pointwise"),
    "full_first": (full_first, "pointwise"),
    "expanded_column": (expanded_column, "pointwise"),
    "three_d": (three_d, "pointwise"),
    "layernorm_weight_out": (layernorm_weight_out, "inner_persistent"),
    "rmsnorm_rstd_broadcast_in_dim": (rmsnorm_rstd_broadcast_in_dim, "inner_persistent"),
    "rmsnorm_rstd_expand": (rmsnorm_rstd_expand, "inner_persistent"),
    "scaled_softmax_scale_out": (scaled_softmax_scale_out, "inner_persistent"),
    "softmax_column_expanded": (softmax_column_expanded, "inner_persistent"),
    "norm_backward_row_statistic_expand": (norm_backward_row_statistic_expand,
                                           "inner_outer_persistent"),
    "row_sums_and_column_out": (row_sums_and_column_out, "reduction"),
    "column_sums_and_row_out": (column_sums_and_row_out, "reduction"),
    "column_sums_and_column_out": (column_sums_and_column_out, "reduction"),
    "row_sums_and_row_out": (row_sums_and_row_out, "reduction"),
    "row_sums_expanded": (row_sums_expanded, "reduction"),
}

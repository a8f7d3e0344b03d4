"""Fusions that read one tensor in two roles, and their inputs: shared by the interpreter tests
(tests/lower/test_two_roles.py) and the GPU tests (tests/gpu/test_two_roles_gpu.py).

In each, one tensor's dim lines up with two different dims of one consumer: x [N, 1] squeezed
and broadcast to a row, beside x itself as a column (fuzz triage P1); a vector as a row and as
a column (outer products, a bias added along both dims, a LayerNorm weight used both ways); a
square matrix beside its transpose. The roles need a copy each (schedule/roles.py); a kernel
that computed one register value for both wrote the diagonal only.

Each builder takes (dt, N, device, seed) and returns (FusionDefinition, inputs); FUSIONS maps a
name to (builder, the scheduler that takes it).
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


def _row(fd, v):
    return fd.ops.broadcast(v, [True, False])


def _column(fd, v):
    return fd.ops.broadcast(v, [False, True])


# Pointwise ---------------------------------------------------------------------------------------
def squeezed_minus_column(dt, N, device="cpu", seed=0):
    """x.squeeze(1) - x for x [N, 1]: [N, N], element (i, j) = x[j] - x[i] (triage P1)."""
    inputs = _randn([(N, 1)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        fd.add_output(fd.ops.cast(fd.ops.sub(fd.ops.squeeze(xf, [1]), xf), DT[dt]))
    return fd, inputs


def squeezed_equals_column(dt, N, device="cpu", seed=0):
    """x.squeeze(1) == x for x [N, 1] of few distinct values: a bool [N, N] with equal pairs off
    the diagonal (fuzz case 8:881, where they came out False)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (N, 1), generator=g).to(device=device, dtype=TORCH[dt])
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 1], dtype=DT[dt])
        fd.add_output(fd.ops.eq(fd.ops.squeeze(t, [1]), t))
    return fd, [x]


def squeezed_minus_column_and_column_out(dt, N, device="cpu", seed=0):
    """x.squeeze(1) - x [N, N] beside x * 2 [N, 1]: the column's own output in the same loop."""
    inputs = _randn([(N, 1)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DT[dt])
        xf = fd.ops.cast(x, F32)
        fd.add_output(fd.ops.cast(fd.ops.sub(fd.ops.squeeze(xf, [1]), xf), DT[dt]))
        fd.add_output(fd.ops.cast(fd.ops.mul(xf, 2.0), DT[dt]))
    return fd, inputs


def outer_product(dt, N, device="cpu", seed=0):
    """a[:, None] * a[None, :] for a [N]."""
    inputs = _randn([(N,)], dt, device, seed)
    with FusionDefinition() as fd:
        a = fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32)
        fd.add_output(fd.ops.cast(fd.ops.mul(_column(fd, a), _row(fd, a)), DT[dt]))
    return fd, inputs


def outer_product_of_exp(dt, N, device="cpu", seed=0):
    """e[:, None] - e[None, :] for e = exp(a): an intermediate, not an input, in two roles."""
    inputs = _randn([(N,)], dt, device, seed)
    with FusionDefinition() as fd:
        e = fd.ops.exp(fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32))
        fd.add_output(fd.ops.cast(fd.ops.sub(_column(fd, e), _row(fd, e)), DT[dt]))
    return fd, inputs


def bias_along_both_dims(dt, N, device="cpu", seed=0):
    """x + v[None, :] + v[:, None] for x [N, N], v [N]."""
    inputs = _randn([(N, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        v = fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.add(x, _row(fd, v)), _column(fd, v)), DT[dt]))
    return fd, inputs


def plus_transpose(dt, N, device="cpu", seed=0):
    """exp(x) + exp(x).T beside exp(x) * 2, for x [N, N]."""
    inputs = _randn([(N, N)], dt, device, seed)
    with FusionDefinition() as fd:
        e = fd.ops.exp(fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32))
        fd.add_output(fd.ops.cast(fd.ops.add(e, fd.ops.permute(e, [1, 0])), DT[dt]))
        fd.add_output(fd.ops.cast(fd.ops.mul(e, 2.0), DT[dt]))
    return fd, inputs


# Normalizations ----------------------------------------------------------------------------------
def softmax_of_row_and_column_bias(dt, N, device="cpu", seed=0):
    """softmax(x * v[None, :] + v[:, None], dim 1) for x [N, N], v [N]."""
    inputs = _randn([(N, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        v = fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32)
        y = fd.ops.add(fd.ops.mul(x, _row(fd, v)), _column(fd, v))
        e = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), DT[dt]))
    return fd, inputs


def layernorm_weight_as_row_and_column(dt, N, device="cpu", seed=0):
    """LayerNorm(x) * w[None, :] + w[:, None] for x [N, N], w [N]."""
    inputs = _randn([(N, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        w = fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32)
        var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
        xhat = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        y = fd.ops.add(fd.ops.mul(xhat, _row(fd, w)), _column(fd, w))
        fd.add_output(fd.ops.cast(y, DT[dt]))
    return fd, inputs


def norm_backward_weight_as_row_and_column(dt, N, device="cpu", seed=0):
    """g = dy * w[None, :] + w[:, None]; dx = g - x * sum(g * x, 1) and dw = sum(dy * x, 0): a
    norm-backward shape whose weight is also a column."""
    inputs = _randn([(N, N), (N, N), (N,)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        dy = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        w = fd.ops.cast(fd.define_tensor([-1], dtype=DT[dt]), F32)
        g = fd.ops.add(fd.ops.mul(dy, _row(fd, w)), _column(fd, w))
        s = fd.ops.sum(fd.ops.mul(g, x), [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.sub(g, fd.ops.mul(x, s)), DT[dt]))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dy, x), [0]), DT[dt]))
    return fd, inputs


# Reductions --------------------------------------------------------------------------------------
def row_sums_of_plus_transpose(dt, N, device="cpu", seed=0):
    """sum(x + x.T, 1) for x [N, N]."""
    inputs = _randn([(N, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.add(x, fd.ops.permute(x, [1, 0])), [1]),
                                  DT[dt]))
    return fd, inputs


def column_sums_of_times_transpose(dt, N, device="cpu", seed=0):
    """sum(x * x.T, 0) for x [N, N]."""
    inputs = _randn([(N, N)], dt, device, seed)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DT[dt]), F32)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(x, fd.ops.permute(x, [1, 0])), [0]),
                                  DT[dt]))
    return fd, inputs


FUSIONS = {
    "squeezed_minus_column": (squeezed_minus_column, "pointwise"),
    "squeezed_equals_column": (squeezed_equals_column, "pointwise"),
    "squeezed_minus_column_and_column_out": (squeezed_minus_column_and_column_out, "pointwise"),
    "outer_product": (outer_product, "pointwise"),
    "outer_product_of_exp": (outer_product_of_exp, "pointwise"),
    "bias_along_both_dims": (bias_along_both_dims, "pointwise"),
    # exp(x) + exp(x).T reads x along both dims: the copy read transposed takes the tiles.
    "plus_transpose": (plus_transpose, "transpose"),
    "softmax_of_row_and_column_bias": (softmax_of_row_and_column_bias, "inner_persistent"),
    "layernorm_weight_as_row_and_column": (layernorm_weight_as_row_and_column,
                                           "inner_persistent"),
    "norm_backward_weight_as_row_and_column": (norm_backward_weight_as_row_and_column,
                                               "inner_outer_persistent"),
    "row_sums_of_plus_transpose": (row_sums_of_plus_transpose, "reduction"),
    "column_sums_of_times_transpose": (column_sums_of_times_transpose, "reduction"),
}

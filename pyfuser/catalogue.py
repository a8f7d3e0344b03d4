"""Named fusions the repo ships: tests, `explain`, `bench` and the README use them.

Each entry builds a FusionDefinition for a shape (M, N) and dtype, makes matching random inputs,
computes the same outputs with hand-written torch (float32 math), and counts the fewest bytes the
op must move (the counts of ../shared/ANCHORS.md, so GB/s compare with the peers' table).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .frontend import FusionDefinition
from .ir.dtype import DataType, parse_dtype, to_torch

F32 = DataType.Float
# fd.ops.stride_order's ranks for an NCHW tensor laid out NHWC (C innermost).
CHANNELS_LAST = [3, 0, 2, 1]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    description: str
    build: Callable            # (fd, dtype, eps) -> None, defines inputs/ops/outputs
    make_inputs: Callable      # (M, N, torch_dtype, device, generator) -> list
    torch_reference: Callable  # (inputs, eps) -> list of outputs
    min_bytes: Callable        # (M, N, elem_bytes) -> int
    # The scheduler that takes the whole fusion (pointwise | transpose | reduction |
    # inner_persistent | outer_persistent | inner_outer_persistent), or "plan": segmented into
    # kernels of several schedulers.
    kind: str


def _rand(shape, dtype, device, gen, scale=1.0):
    import torch
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def _f(fd, t):
    return fd.ops.cast(t, F32)


# Definitions ----------------------------------------------------------------------------------
def _gelu_bias(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    b = fd.define_tensor([-1], dtype=dt)
    y = fd.ops.gelu(fd.ops.add(_f(fd, x), _f(fd, b)), approximate="tanh")
    fd.add_output(fd.ops.cast(y, dt))


def _silu_mul(fd, dt, eps):
    a = fd.define_tensor([-1, -1], dtype=dt)
    b = fd.define_tensor([-1, -1], dtype=dt)
    fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.silu(_f(fd, a)), _f(fd, b)), dt))


def _row_sum(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    fd.add_output(fd.ops.cast(fd.ops.sum(_f(fd, x), [1]), dt))


def _col_sum(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    fd.add_output(fd.ops.cast(fd.ops.sum(_f(fd, x), [0]), dt))


def _mse_mean(fd, dt, eps):
    p = fd.define_tensor([-1, -1], dtype=dt)
    t = fd.define_tensor([-1, -1], dtype=dt)
    d = fd.ops.sub(_f(fd, p), _f(fd, t))
    fd.add_output(fd.ops.cast(fd.ops.mean(fd.ops.mul(d, d)), dt))


# The largest finite float8 e4m3 value: x * (448 / amax) fills the fp8 range. This fusion keeps
# the bf16 output its byte counts and measurements were made with; FUSIONS.md's fp8_quant, with
# the e4m3 cast and amax out, is in tests/test_fusions_kinds.py and tools/bench_issue18.py.
FP8_E4M3_MAX = 448.0


def _amax_scale(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    xf = _f(fd, x)
    amax = fd.ops.max(fd.ops.abs(xf))
    fd.add_output(fd.ops.cast(fd.ops.mul(xf, fd.ops.div(FP8_E4M3_MAX, amax)), dt))


def _softmax_parts(fd, dt, dim=1):
    x = fd.define_tensor([-1, -1], dtype=dt)
    xf = _f(fd, x)
    m = fd.ops.max(xf, [dim], keepdim=True)
    z = fd.ops.sub(xf, m)
    e = fd.ops.exp(z)
    s = fd.ops.sum(e, [dim], keepdim=True)
    return z, e, s


def _softmax(fd, dt, eps):
    # One reciprocal per row and a multiply per element, as fast softmax kernels do; within
    # an ulp of e / s.
    _, e, s = _softmax_parts(fd, dt)
    fd.add_output(fd.ops.cast(fd.ops.mul(e, fd.ops.reciprocal(s)), dt))


def _softmax_dim0(fd, dt, eps):
    # Over the rows: each column is normalized, the reduced dim outermost in memory.
    _, e, s = _softmax_parts(fd, dt, dim=0)
    fd.add_output(fd.ops.cast(fd.ops.mul(e, fd.ops.reciprocal(s)), dt))


def _log_softmax(fd, dt, eps):
    z, _, s = _softmax_parts(fd, dt)
    fd.add_output(fd.ops.cast(fd.ops.sub(z, fd.ops.log(s)), dt))


def _rms(fd, xf, eps):
    ms = fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True)
    return fd.ops.rsqrt(fd.ops.add(ms, eps))


def _rmsnorm_fwd(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    w = fd.define_tensor([-1], dtype=dt)
    xf = _f(fd, x)
    y = fd.ops.mul(fd.ops.mul(xf, _rms(fd, xf, eps)), _f(fd, w))
    fd.add_output(fd.ops.cast(y, dt))


def _add_rmsnorm_fwd(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    res = fd.define_tensor([-1, -1], dtype=dt)
    w = fd.define_tensor([-1], dtype=dt)
    h = fd.ops.add(_f(fd, x), _f(fd, res))
    y = fd.ops.mul(fd.ops.mul(h, _rms(fd, h, eps)), _f(fd, w))
    fd.add_output(fd.ops.cast(y, dt))
    fd.add_output(fd.ops.cast(h, dt))


def _rmsnorm_bwd(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    dy = fd.define_tensor([-1, -1], dtype=dt)
    w = fd.define_tensor([-1], dtype=dt)
    rstd = fd.define_tensor([-1, 1], dtype=F32)
    xhat = fd.ops.mul(_f(fd, x), rstd)
    g = fd.ops.mul(_f(fd, dy), _f(fd, w))
    c = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
    dx = fd.ops.mul(fd.ops.sub(g, fd.ops.mul(xhat, c)), rstd)
    dw = fd.ops.sum(fd.ops.mul(_f(fd, dy), xhat), [0])
    fd.add_output(fd.ops.cast(dx, dt))
    fd.add_output(fd.ops.cast(dw, dt))


def _layernorm_fwd(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    w = fd.define_tensor([-1], dtype=dt)
    b = fd.define_tensor([-1], dtype=dt)
    xf = _f(fd, x)
    var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
    rstd = fd.ops.rsqrt(fd.ops.add(var, eps))
    y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), _f(fd, w)), _f(fd, b))
    fd.add_output(fd.ops.cast(y, dt))


def _layernorm_bwd(fd, dt, eps):
    x = fd.define_tensor([-1, -1], dtype=dt)
    dy = fd.define_tensor([-1, -1], dtype=dt)
    w = fd.define_tensor([-1], dtype=dt)
    mean = fd.define_tensor([-1, 1], dtype=F32)
    rstd = fd.define_tensor([-1, 1], dtype=F32)
    xhat = fd.ops.mul(fd.ops.sub(_f(fd, x), mean), rstd)
    dyf = _f(fd, dy)
    g = fd.ops.mul(dyf, _f(fd, w))
    c1 = fd.ops.mean(g, [1], keepdim=True)
    c2 = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
    dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(g, c1), fd.ops.mul(xhat, c2)), rstd)
    dw = fd.ops.sum(fd.ops.mul(dyf, xhat), [0])
    db = fd.ops.sum(dyf, [0])
    fd.add_output(fd.ops.cast(dx, dt))
    fd.add_output(fd.ops.cast(dw, dt))
    fd.add_output(fd.ops.cast(db, dt))


def _nchw_to_nhwc(fd, dt, eps):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=dt)
    fd.add_output(fd.ops.stride_order(x, CHANNELS_LAST))


def _scale_shift_relu_cl(fd, dt, eps):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=dt)
    scale = fd.define_tensor([-1], dtype=F32)
    shift = fd.define_tensor([-1], dtype=F32)
    per_channel = [True, False, True, True]
    y = fd.ops.add(fd.ops.mul(_f(fd, x), fd.ops.broadcast(scale, per_channel)),
                   fd.ops.broadcast(shift, per_channel))
    fd.add_output(fd.ops.stride_order(fd.ops.cast(fd.ops.relu(y), dt), CHANNELS_LAST))


# Inputs ---------------------------------------------------------------------------------------
# The image fusions take (M, N) = (pixels B * H * W, channels C): an NCHW image
# [M / 3136, N, 56, 56] when 56 * 56 divides M (the issue's [32, 256, 56, 56] is (100352, 256)),
# else [1, N, 1, M].
def _image_shape(M, N):
    return (M // 3136, N, 56, 56) if M % 3136 == 0 else (1, N, 1, M)


def _in_image(M, N, dt, dev, g):
    return [_rand(_image_shape(M, N), dt, dev, g)]


def _in_image_scale_shift(M, N, dt, dev, g):
    import torch
    return [_rand(_image_shape(M, N), dt, dev, g), _rand((N,), torch.float32, dev, g),
            _rand((N,), torch.float32, dev, g)]


def _in_x(M, N, dt, dev, g):
    return [_rand((M, N), dt, dev, g)]


def _in_x_b(M, N, dt, dev, g):
    return [_rand((M, N), dt, dev, g), _rand((N,), dt, dev, g)]


def _in_x_y(M, N, dt, dev, g):
    return [_rand((M, N), dt, dev, g), _rand((M, N), dt, dev, g)]


def _in_x_res_w(M, N, dt, dev, g):
    return [_rand((M, N), dt, dev, g), _rand((M, N), dt, dev, g), _rand((N,), dt, dev, g)]


def _in_ln_fwd(M, N, dt, dev, g):
    return [_rand((M, N), dt, dev, g), _rand((N,), dt, dev, g), _rand((N,), dt, dev, g)]


def _in_rms_bwd(M, N, dt, dev, g, eps=1e-6):
    import torch
    x, dy, w = _rand((M, N), dt, dev, g), _rand((M, N), dt, dev, g), _rand((N,), dt, dev, g)
    rstd = torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + eps)
    return [x, dy, w, rstd]


def _in_ln_bwd(M, N, dt, dev, g, eps=1e-6):
    import torch
    x, dy, w = _rand((M, N), dt, dev, g), _rand((M, N), dt, dev, g), _rand((N,), dt, dev, g)
    var, mean = torch.var_mean(x.float(), 1, correction=0, keepdim=True)
    return [x, dy, w, mean, torch.rsqrt(var + eps)]


# Hand-written torch references (float32 math) ---------------------------------------------------
def _t_gelu_bias(i, eps):
    import torch.nn.functional as F
    return [F.gelu(i[0].float() + i[1].float(), approximate="tanh").to(i[0].dtype)]


def _t_silu_mul(i, eps):
    import torch.nn.functional as F
    return [(F.silu(i[0].float()) * i[1].float()).to(i[0].dtype)]


def _t_row_sum(i, eps):
    return [i[0].float().sum(1).to(i[0].dtype)]


def _t_col_sum(i, eps):
    return [i[0].float().sum(0).to(i[0].dtype)]


def _t_mse_mean(i, eps):
    return [((i[0].float() - i[1].float()) ** 2).mean().to(i[0].dtype)]


def _t_amax_scale(i, eps):
    x = i[0].float()
    return [(x * (FP8_E4M3_MAX / x.abs().amax())).to(i[0].dtype)]


def _t_softmax(i, eps):
    return [i[0].float().softmax(-1).to(i[0].dtype)]


def _t_softmax_dim0(i, eps):
    return [i[0].float().softmax(0).to(i[0].dtype)]


def _t_log_softmax(i, eps):
    return [i[0].float().log_softmax(-1).to(i[0].dtype)]


def _t_rms_fwd(i, eps):
    import torch.nn.functional as F
    x, w = i
    return [F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype)]


def _t_add_rms_fwd(i, eps):
    import torch.nn.functional as F
    x, r, w = i
    h = x.float() + r.float()
    return [F.rms_norm(h, (x.shape[-1],), w.float(), eps).to(x.dtype), h.to(x.dtype)]


def _t_rms_bwd(i, eps):
    x, dy, w, rstd = i
    xhat = x.float() * rstd
    g = dy.float() * w.float()
    dx = (g - xhat * (g * xhat).mean(1, keepdim=True)) * rstd
    dw = (dy.float() * xhat).sum(0)
    return [dx.to(x.dtype), dw.to(w.dtype)]


def _t_ln_fwd(i, eps):
    import torch.nn.functional as F
    x, w, b = i
    return [F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps).to(x.dtype)]


def _t_ln_bwd(i, eps):
    x, dy, w, mean, rstd = i
    xhat = (x.float() - mean) * rstd
    g = dy.float() * w.float()
    dx = (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True)) * rstd
    return [dx.to(x.dtype), (dy.float() * xhat).sum(0).to(w.dtype), dy.float().sum(0).to(w.dtype)]


def _t_nchw_to_nhwc(i, eps):
    import torch
    return [i[0].contiguous(memory_format=torch.channels_last)]


def _t_scale_shift_relu_cl(i, eps):
    import torch
    x, scale, shift = i
    y = (x.float() * scale[None, :, None, None] + shift[None, :, None, None]).relu()
    return [y.to(x.dtype).contiguous(memory_format=torch.channels_last)]


# Fewest bytes (ANCHORS.md) ------------------------------------------------------------------------
def _b_fwd(M, N, e):
    return 2 * M * N * e + N * e


def _b_bwd(M, N, e):
    return 3 * M * N * e + 2 * N * e + 4 * M


ENTRIES: dict[str, Entry] = {e.name: e for e in [
    Entry("gelu_bias", "gelu_tanh(x + bias), bias broadcast over rows", _gelu_bias, _in_x_b,
          _t_gelu_bias, lambda M, N, e: 2 * M * N * e + N * e, "pointwise"),
    Entry("silu_mul", "silu(a) * b (SwiGLU gate)", _silu_mul, _in_x_y, _t_silu_mul,
          lambda M, N, e: 3 * M * N * e, "pointwise"),
    Entry("row_sum", "sum over dim 1", _row_sum, _in_x, _t_row_sum,
          lambda M, N, e: M * N * e + M * e, "reduction"),
    Entry("col_sum", "sum over dim 0", _col_sum, _in_x, _t_col_sum,
          lambda M, N, e: M * N * e + N * e, "reduction"),
    Entry("mse_mean", "mean((p - t)^2) over all elements (a full reduction)", _mse_mean, _in_x_y,
          _t_mse_mean, lambda M, N, e: 2 * M * N * e + e, "reduction"),
    Entry("amax_scale", "x * (448 / amax(|x|)), amax over all elements: a full reduction, then "
          "a pointwise kernel", _amax_scale, _in_x, _t_amax_scale,
          lambda M, N, e: 2 * M * N * e, "plan"),
    Entry("softmax", "softmax over dim 1", _softmax, _in_x, _t_softmax,
          lambda M, N, e: 2 * M * N * e, "inner_persistent"),
    Entry("softmax_dim0", "softmax over dim 0", _softmax_dim0, _in_x, _t_softmax_dim0,
          lambda M, N, e: 2 * M * N * e, "outer_persistent"),
    Entry("log_softmax", "log_softmax over dim 1", _log_softmax, _in_x, _t_log_softmax,
          lambda M, N, e: 2 * M * N * e, "inner_persistent"),
    Entry("rmsnorm_fwd", "RMSNorm forward: x * rsqrt(mean(x^2) + eps) * w", _rmsnorm_fwd,
          _in_x_b, _t_rms_fwd, _b_fwd, "inner_persistent"),
    Entry("add_rmsnorm_fwd", "h = x + residual; RMSNorm(h) * w; outputs y and h",
          _add_rmsnorm_fwd, _in_x_res_w, _t_add_rms_fwd,
          lambda M, N, e: 4 * M * N * e + N * e, "inner_persistent"),
    Entry("rmsnorm_bwd", "RMSNorm backward: dx and dw from x, dy, w, rstd", _rmsnorm_bwd,
          _in_rms_bwd, _t_rms_bwd, _b_bwd, "inner_outer_persistent"),
    Entry("layernorm_fwd", "LayerNorm forward: (x - mean) * rstd * w + b", _layernorm_fwd,
          _in_ln_fwd, _t_ln_fwd, _b_fwd, "inner_persistent"),
    Entry("layernorm_bwd", "LayerNorm backward: dx, dw, db from x, dy, w, mean, rstd",
          _layernorm_bwd, _in_ln_bwd, _t_ln_bwd, lambda M, N, e: _b_bwd(M, N, e) + 4 * M,
          "inner_outer_persistent"),
    Entry("nchw_to_nhwc", "NCHW -> NHWC copy of an image [M / 3136, N, 56, 56] (channels-last "
          "output)", _nchw_to_nhwc, _in_image, _t_nchw_to_nhwc, lambda M, N, e: 2 * M * N * e,
          "transpose"),
    Entry("scale_shift_relu_cl", "relu(x * scale[C] + shift[C]) of an NCHW image, written "
          "channels-last (fp32 scale and shift)", _scale_shift_relu_cl, _in_image_scale_shift,
          _t_scale_shift_relu_cl, lambda M, N, e: 2 * M * N * e + 8 * N, "transpose"),
]}


def names() -> list[str]:
    return list(ENTRIES)


def unknown(requested) -> str:
    """"" when every name in `requested` is in the catalogue; else the message naming what is
    not, and what is."""
    missing = [n for n in requested if n not in ENTRIES]
    if not missing:
        return ""
    return (f"unknown fusion {', '.join(map(repr, missing))}; the catalogue has "
            f"{', '.join(ENTRIES)} (`python -m pyfuser explain list` describes them)")


def get(name: str) -> Entry:
    try:
        return ENTRIES[name]
    except KeyError:
        raise KeyError(f"unknown fusion {name!r}; the catalogue has {', '.join(ENTRIES)}") from None


def define(name: str, dtype="bf16", eps: float = 1e-6) -> FusionDefinition:
    """The catalogue fusion `name` as a FusionDefinition (shapes are symbolic)."""
    entry = get(name)
    dt = parse_dtype(dtype)
    with FusionDefinition(name) as fd:
        entry.build(fd, dt, eps)
    return fd


def make_inputs(name: str, M: int, N: int, dtype="bf16", device="cpu", seed: int | None = None):
    import torch
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % (2 ** 31))
    return get(name).make_inputs(M, N, to_torch(parse_dtype(dtype)), device, gen)

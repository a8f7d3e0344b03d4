"""The 38 fusion kinds of ../shared/FUSIONS.md through `explain`, on the CPU (issue 15's bar).

Every kind whose ops pyfuser has is defined here as users would write it, at the shapes and
dtypes FUSIONS.md gives, and explained for the H100 from `meta` tensors (nothing is allocated).
Its plan must have no reference segment, except the kinds whose scheduler the issue on
reduction patterns (16) adds: full reductions, outer-dim normalizations, transposes. For those,
`explain` must name why the reference runs them. Kinds whose ops do not exist yet are listed in
OPS_MISSING with the ops they wait for, not left out. The plans of several segments also run on
the kernel-IR interpreter at small shapes, against float64.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from collections.abc import Callable

import pytest
import torch

from pyfuser import DataType, FusionDefinition

BF16, F32, BOOL = DataType.BFloat16, DataType.Float, DataType.Bool
EPS = 1e-6


def _meta(shape, dtype=torch.bfloat16, stride=None):
    if stride is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _f(fd, t):
    return fd.ops.cast(t, F32)


def _bf(fd, t):
    return fd.ops.cast(t, BF16)


# Normalizations ---------------------------------------------------------------------------------
def rmsnorm_fwd(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    w = fd.define_tensor([-1], dtype=F32)
    xf = _f(fd, x)
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), EPS))
    fd.add_output(_bf(fd, fd.ops.mul(fd.ops.mul(xf, rstd), w)))
    fd.add_output(rstd)


def rmsnorm_bwd(fd):
    x, dy = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    w = fd.define_tensor([-1], dtype=F32)
    rstd = fd.define_tensor([-1, 1], dtype=F32)
    xhat = fd.ops.mul(_f(fd, x), rstd)
    dyf = _f(fd, dy)
    g = fd.ops.mul(dyf, w)
    c = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
    fd.add_output(_bf(fd, fd.ops.mul(fd.ops.sub(g, fd.ops.mul(xhat, c)), rstd)))
    fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]))


def layernorm_fwd(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    w, b = (fd.define_tensor([-1], dtype=F32) for _ in range(2))
    xf = _f(fd, x)
    var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
    rstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
    y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), w), b)
    fd.add_output(_bf(fd, y))
    fd.add_output(mean)
    fd.add_output(rstd)


def layernorm_bwd(fd):
    x, dy = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    w = fd.define_tensor([-1], dtype=F32)
    mean, rstd = (fd.define_tensor([-1, 1], dtype=F32) for _ in range(2))
    xhat = fd.ops.mul(fd.ops.sub(_f(fd, x), mean), rstd)
    dyf = _f(fd, dy)
    g = fd.ops.mul(dyf, w)
    c1 = fd.ops.mean(g, [1], keepdim=True)
    c2 = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
    dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(g, c1), fd.ops.mul(xhat, c2)), rstd)
    fd.add_output(_bf(fd, dx))
    fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]))
    fd.add_output(fd.ops.sum(dyf, [0]))


def add_rmsnorm(fd):
    x, res = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    w = fd.define_tensor([-1], dtype=F32)
    h = _bf(fd, fd.ops.add(x, res))
    hf = _f(fd, h)
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(hf, hf), [1], keepdim=True), EPS))
    fd.add_output(_bf(fd, fd.ops.mul(fd.ops.mul(hf, rstd), w)))
    fd.add_output(h)


def var_mean(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    var, mean = fd.ops.var_mean(_f(fd, x), [1], correction=1)
    fd.add_output(var)
    fd.add_output(mean)


def l2_normalize(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    xf = _f(fd, x)
    norm = fd.ops.sqrt(fd.ops.sum(fd.ops.mul(xf, xf), [1], keepdim=True))
    fd.add_output(_bf(fd, fd.ops.div(xf, fd.ops.maximum(norm, 1e-12))))


def _batchnorm_fwd(fd, channels_last: bool):
    order = [3, 0, 2, 1] if channels_last else None
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16, stride_order=order)
    w, b, running_mean, running_var = (fd.define_tensor([-1], dtype=F32) for _ in range(4))
    xf = _f(fd, x)
    var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0)
    rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))

    def per_channel(t):
        return fd.ops.broadcast(t, [True, False, True, True])

    xhat = fd.ops.mul(fd.ops.sub(xf, per_channel(mean)), per_channel(rstd))
    y = _bf(fd, fd.ops.add(fd.ops.mul(xhat, per_channel(w)), per_channel(b)))
    fd.add_output(fd.ops.stride_order(y, order) if channels_last else y)
    # Running statistics, updated in place with momentum 0.1; the running variance is the
    # unbiased one (n / (n - 1)), as torch's BatchNorm.
    n = x.domain.logical[0].extent
    count = fd.ops.mul(fd.ops.mul(n, x.domain.logical[2].extent), x.domain.logical[3].extent)
    unbiased = fd.ops.div(fd.ops.mul(var, count), fd.ops.sub(count, 1))
    fd.add_output(fd.ops.add(fd.ops.mul(running_mean, 0.9), fd.ops.mul(mean, 0.1)),
                  alias_input=running_mean)
    fd.add_output(fd.ops.add(fd.ops.mul(running_var, 0.9), fd.ops.mul(unbiased, 0.1)),
                  alias_input=running_var)
    fd.add_output(mean)
    fd.add_output(rstd)


def batchnorm_fwd_nchw(fd):
    _batchnorm_fwd(fd, channels_last=False)


def batchnorm_fwd_nhwc(fd):
    _batchnorm_fwd(fd, channels_last=True)


def groupnorm_fwd(fd, N=8, C=320, H=64, W=64, G=32):
    # Static shapes, as FUSIONS.md says (smaller ones for the interpreter below).
    x = fd.define_tensor([N, C, H, W], dtype=BF16)
    w, b = (fd.define_tensor([C], dtype=F32) for _ in range(2))
    xg = fd.ops.reshape(_f(fd, x), [N, G, C // G * H * W])
    var, mean = fd.ops.var_mean(xg, [2], correction=0, keepdim=True)
    rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
    xhat = fd.ops.reshape(fd.ops.mul(fd.ops.sub(xg, mean), rstd), [N, C, H, W])

    def per_channel(t):
        return fd.ops.broadcast(t, [True, False, True, True])

    y = fd.ops.add(fd.ops.mul(xhat, per_channel(w)), per_channel(b))
    fd.add_output(_bf(fd, y))
    fd.add_output(fd.ops.squeeze(mean, [2]))
    fd.add_output(fd.ops.squeeze(rstd, [2]))


# Softmax ----------------------------------------------------------------------------------------
def _softmax_last(fd, z):
    m = fd.ops.max(z, [-1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(z, m))
    return fd.ops.div(e, fd.ops.sum(e, [-1], keepdim=True))


def softmax_scale_mask(fd):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
    mask = fd.define_tensor([-1, 1, -1, -1], dtype=BF16)
    z = fd.ops.add(fd.ops.mul(_f(fd, x), 1 / math.sqrt(128)), _f(fd, mask))
    fd.add_output(_bf(fd, _softmax_last(fd, z)))


def softmax_causal(fd):
    # The tril mask built in the kernel from two iotas (column <= row).
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
    rows, cols = (fd.ops.iota(i.extent, dtype=DataType.Int32) for i in x.domain.logical[2:])
    mask = fd.ops.broadcast(cols, [True, False]) <= fd.ops.broadcast(rows, [False, True])
    z = fd.ops.where(mask, fd.ops.mul(_f(fd, x), 1 / math.sqrt(128)), float("-inf"))
    fd.add_output(_bf(fd, _softmax_last(fd, z)))


def cross_entropy_fwd(fd):
    # loss = lse - x[target]: the target's logit read by take_along_axis in the row kernel.
    x = fd.define_tensor([-1, -1], dtype=BF16)
    target = fd.define_tensor([-1], dtype=DataType.Int)
    xf = _f(fd, x)
    m = fd.ops.max(xf, [1], keepdim=True)
    lse = fd.ops.log(fd.ops.sum(fd.ops.exp(xf - m), [1], keepdim=True)) + m
    picked = fd.ops.take_along_axis(xf, fd.ops.broadcast(target, [False, True]), 1)
    fd.add_output(fd.ops.squeeze(lse - picked, [1]))
    fd.add_output(fd.ops.squeeze(lse, [1]))


def argmax_rows(fd):
    # One max reduction of (value, index) keys: the rows read once (runtime/arg_key.py).
    x = fd.define_tensor([-1, -1], dtype=BF16)
    fd.add_output(fd.ops.argmax(x, 1))


def bias_dropout_residual(fd):
    # residual + dropout(x + bias, p=0.1), the mask an output; the seed and offset drawn from
    # torch's generator on each execute.
    x, residual = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    bias = fd.define_tensor([-1], dtype=BF16)
    h = _f(fd, x) + fd.ops.broadcast(_f(fd, bias), [True, False])
    keep = fd.ops.lt(fd.ops.rand_like(h), 0.9)
    fd.add_output(_bf(fd, fd.ops.where(keep, h * (1 / 0.9), 0.0) + _f(fd, residual)))
    fd.add_output(keep)


def cumsum(fd):
    # Running sums of the sorted probabilities (top-p sampling): a block-scan kernel, each row
    # of 128256 split over a cluster of 8 blocks.
    x = fd.define_tensor([-1, -1], dtype=F32)
    fd.add_output(fd.ops.cumsum(x, 1))


def topk(fd):
    # The 50 largest logits of each row and their indices: a library segment (torch.topk), since
    # a row of 128256 is more than the top-k kernel holds in one block.
    x = fd.define_tensor([-1, -1], dtype=BF16)
    values, indices = fd.ops.topk(x, 50, -1)
    fd.add_output(values)
    fd.add_output(indices)


def embedding(fd):
    table = fd.define_tensor([-1, -1], dtype=BF16)
    ids = fd.define_tensor([-1], dtype=DataType.Int)
    fd.add_output(fd.ops.embedding(ids, table))


def cross_entropy_bwd(fd):
    # dx = (softmax(x) - onehot(target)) * dloss, the softmax from the forward's lse and the
    # one-hot from an iota over the vocabulary.
    x = fd.define_tensor([-1, -1], dtype=BF16)
    target = fd.define_tensor([-1], dtype=DataType.Int)
    lse = fd.define_tensor([-1], dtype=F32)
    dloss = fd.define_scalar(dtype=DataType.Double)
    vocab = fd.ops.iota(x.domain.logical[1].extent, dtype=DataType.Int)
    onehot = fd.ops.cast(fd.ops.eq(fd.ops.broadcast(vocab, [True, False]),
                                   fd.ops.broadcast(target, [False, True])), F32)
    p = fd.ops.exp(_f(fd, x) - fd.ops.broadcast(lse, [False, True]))
    fd.add_output(_bf(fd, (p - onehot) * dloss))


def swiglu_fwd_chunked(fd):
    gu = fd.define_tensor([8192, 28672], dtype=BF16)
    gate, up = fd.ops.chunk(gu, 2, 1)
    fd.add_output(_bf(fd, fd.ops.silu(_f(fd, gate)) * _f(fd, up)))


def rope(fd):
    # rotate_half(q) = cat(-q[..., 64:], q[..., :64]) through slice and cat.
    q = fd.define_tensor([4, 2048, 32, 128], dtype=BF16)
    cos, sin = (fd.define_tensor([2048, 128], dtype=F32) for _ in range(2))
    x1 = fd.ops.slice(q, [0, 0, 0, 0], [4, 2048, 32, 64])
    x2 = fd.ops.slice(q, [0, 0, 0, 64], [4, 2048, 32, 128])
    rot = fd.ops.cat([-x2, x1], -1)
    per_position = [True, False, True, False]
    y = _f(fd, q) * fd.ops.broadcast(cos, per_position) \
        + _f(fd, rot) * fd.ops.broadcast(sin, per_position)
    fd.add_output(_bf(fd, y))


def softmax_dim0(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    xf = _f(fd, x)
    m = fd.ops.max(xf, [0], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, m))
    fd.add_output(_bf(fd, fd.ops.div(e, fd.ops.sum(e, [0], keepdim=True))))


def mean_all(fd):
    p, t = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    d = fd.ops.sub(_f(fd, p), _f(fd, t))
    fd.add_output(_bf(fd, fd.ops.mean(fd.ops.mul(d, d))))


# Activations and element-wise -----------------------------------------------------------------
def swiglu_fwd(fd):
    gate, up = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    fd.add_output(_bf(fd, fd.ops.mul(fd.ops.silu(_f(fd, gate)), _f(fd, up))))


def swiglu_bwd(fd):
    dy, gate, up = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(3))
    dyf, g, u = _f(fd, dy), _f(fd, gate), _f(fd, up)
    sig = fd.ops.sigmoid(g)
    silu = fd.ops.mul(g, sig)
    # d silu(g) / dg = sig * (1 + g * (1 - sig))
    dsilu = fd.ops.mul(sig, fd.ops.add(fd.ops.mul(g, fd.ops.sub(1.0, sig)), 1.0))
    fd.add_output(_bf(fd, fd.ops.mul(fd.ops.mul(dyf, u), dsilu)))
    fd.add_output(_bf(fd, fd.ops.mul(dyf, silu)))


def gelu_tanh_fwd(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    fd.add_output(_bf(fd, fd.ops.gelu(_f(fd, x), approximate="tanh")))


def gelu_tanh_bwd(fd):
    dy, x = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    xf = _f(fd, x)
    k, c = math.sqrt(2 / math.pi), 0.044715
    x2 = fd.ops.mul(xf, xf)
    t = fd.ops.tanh(fd.ops.mul(fd.ops.mul(xf, fd.ops.add(fd.ops.mul(x2, c), 1.0)), k))
    left = fd.ops.mul(fd.ops.add(t, 1.0), 0.5)
    dinner = fd.ops.mul(fd.ops.add(fd.ops.mul(x2, 3 * c), 1.0), k)
    right = fd.ops.mul(fd.ops.mul(fd.ops.mul(xf, 0.5), fd.ops.sub(1.0, fd.ops.mul(t, t))), dinner)
    fd.add_output(_bf(fd, fd.ops.mul(_f(fd, dy), fd.ops.add(left, right))))


def clamp(fd):
    x = fd.define_tensor([-1, -1], dtype=BF16)
    lo, hi = (fd.define_scalar(dtype=DataType.Double) for _ in range(2))
    fd.add_output(fd.ops.minimum(fd.ops.maximum(x, lo), hi))


def threshold_bwd(fd):
    x, dy = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    fd.add_output(fd.ops.where(fd.ops.gt(x, 0.0), dy, 0.0))


def masked_fill_where(fd):
    mask = fd.define_tensor([-1, -1, 1], dtype=BOOL)
    x = fd.define_tensor([-1, -1, -1], dtype=BF16)
    fd.add_output(fd.ops.where(mask, x, 0.0))


def nchw_channel_bcast(fd):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
    scale, shift = (fd.define_tensor([-1], dtype=F32) for _ in range(2))

    def per_channel(t):
        return fd.ops.broadcast(t, [True, False, True, True])

    y = fd.ops.add(fd.ops.mul(_f(fd, x), per_channel(scale)), per_channel(shift))
    fd.add_output(_bf(fd, fd.ops.relu(y)))


def _adamw(fd, n_params: int):
    lr, beta1, beta2, eps, wd, bc1, bc2 = (fd.define_scalar(dtype=DataType.Double)
                                           for _ in range(7))
    for _ in range(n_params):
        p, g, m, v = (fd.define_tensor([-1], dtype=F32) for _ in range(4))
        m2 = fd.ops.add(fd.ops.mul(m, beta1), fd.ops.mul(g, fd.ops.sub(1.0, beta1)))
        v2 = fd.ops.add(fd.ops.mul(v, beta2), fd.ops.mul(fd.ops.mul(g, g), fd.ops.sub(1.0, beta2)))
        denom = fd.ops.add(fd.ops.sqrt(fd.ops.div(v2, bc2)), eps)
        step = fd.ops.mul(fd.ops.div(fd.ops.div(m2, bc1), denom), lr)
        decayed = fd.ops.mul(p, fd.ops.sub(1.0, fd.ops.mul(lr, wd)))
        fd.add_output(fd.ops.sub(decayed, step))
        fd.add_output(m2)
        fd.add_output(v2)


def adamw_step(fd):
    _adamw(fd, 1)


def adamw_multi_tensor(fd):
    _adamw(fd, 3)


_ADAM_SCALARS = [1e-3, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001]


# fp8 ------------------------------------------------------------------------------------------
FP8_E4M3_MAX = 448.0


def fp8_quant(fd):
    """Current scaling: amax of the whole tensor, scale = 448 / amax, x * scale clamped to
    +-448 and cast to e4m3fn (the clamp, which recipes write so that the cast saturates
    whatever the cast's own rule, is a no-op here: |x * scale| <= 448); amax is an output, the
    scaling factor of the next step."""
    x = fd.define_tensor([-1, -1], dtype=BF16)
    xf = _f(fd, x)
    amax = fd.ops.max(fd.ops.abs(xf))
    scaled = fd.ops.mul(xf, fd.ops.div(FP8_E4M3_MAX, amax))
    clamped = fd.ops.minimum(fd.ops.maximum(scaled, -FP8_E4M3_MAX), FP8_E4M3_MAX)
    fd.add_output(fd.ops.cast(clamped, DataType.Float8_e4m3fn))
    fd.add_output(amax)


# Library ops and their epilogues ----------------------------------------------------------------
def linear_bias_gelu(fd):
    x, w = (fd.define_tensor([-1, -1], dtype=BF16) for _ in range(2))
    b = fd.define_tensor([-1], dtype=BF16)
    fd.add_output(fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh"))


def attn_scores_qkT(fd):
    q, k = (fd.define_tensor([-1, -1, -1, -1], dtype=BF16) for _ in range(2))
    scores = fd.ops.matmul(q, fd.ops.permute(k, [0, 1, 3, 2]))
    fd.add_output(fd.ops.mul(scores, 1 / math.sqrt(128)))


# Permutes ---------------------------------------------------------------------------------------
def permute_bshd_bhsd(fd):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
    fd.add_output(fd.ops.mul(fd.ops.permute(x, [0, 2, 1, 3]), 1 / math.sqrt(128)))


def permute_nchw_nhwc(fd):
    x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
    fd.add_output(fd.ops.permute(x, [0, 2, 3, 1]))


# The table --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kind:
    build: Callable
    inputs: Callable           # () -> the FUSIONS.md inputs, as meta tensors and scalars
    segments: tuple            # the plan's expected (kind, name) per segment


IP, IOP, RED, PW, OP, TR = (("kernel", n) for n in (
    "inner_persistent", "inner_outer_persistent", "reduction", "pointwise", "outer_persistent",
    "transpose"))
REF = ("reference", "reference")

_CHW = [32, 256, 56, 56]
_CHANNELS_LAST = (256 * 56 * 56, 1, 56 * 256, 256)
_SCORES = [4, 32, 2048, 2048]
_ADAM_MULTI_SIZES = (4096 * 4096, 4096, 14336 * 4096)

KINDS: dict[str, Kind] = {
    "rmsnorm_fwd": Kind(rmsnorm_fwd, lambda: [_meta([8192, 4096]), _meta([4096], torch.float32)],
                        (IP,)),
    "rmsnorm_bwd": Kind(rmsnorm_bwd, lambda: [
        _meta([8192, 4096]), _meta([8192, 4096]), _meta([4096], torch.float32),
        _meta([8192, 1], torch.float32)], (IOP,)),
    "layernorm_fwd": Kind(layernorm_fwd, lambda: [
        _meta([8192, 4096]), _meta([4096], torch.float32), _meta([4096], torch.float32)], (IP,)),
    "layernorm_bwd": Kind(layernorm_bwd, lambda: [
        _meta([8192, 4096]), _meta([8192, 4096]), _meta([4096], torch.float32),
        _meta([8192, 1], torch.float32), _meta([8192, 1], torch.float32)], (IOP,)),
    "softmax_scale_mask": Kind(softmax_scale_mask, lambda: [
        _meta(_SCORES), _meta([4, 1, 2048, 2048])], (IP,)),
    "softmax_causal": Kind(softmax_causal, lambda: [_meta(_SCORES)], (IP,)),
    # The loss alone: a one-pass logsumexp (schedule/logsumexp.py), a reduction kernel.
    "cross_entropy_fwd": Kind(cross_entropy_fwd, lambda: [
        _meta([8192, 128256]), _meta([8192], torch.int64)], (RED,)),
    "argmax_rows": Kind(argmax_rows, lambda: [_meta([8192, 128256])], (RED,)),
    "bias_dropout_residual": Kind(bias_dropout_residual, lambda: [
        _meta([8192, 4096]), _meta([8192, 4096]), _meta([4096])], (PW,)),
    "cumsum": Kind(cumsum, lambda: [_meta([64, 128256], torch.float32)],
                   (("kernel", "scan"),)),
    # The top-k kernel's heuristic refuses rows of 128256 (more than one block holds):
    # execute() plans the segment again as the library op, torch.topk.
    "topk": Kind(topk, lambda: [_meta([64, 128256])], (("kernel", "topk"),)),
    "embedding": Kind(embedding, lambda: [_meta([128256, 4096]), _meta([8192], torch.int64)],
                      (PW,)),
    "cross_entropy_bwd": Kind(cross_entropy_bwd, lambda: [
        _meta([8192, 128256]), _meta([8192], torch.int64), _meta([8192], torch.float32),
        1.0 / 8192], (PW,)),
    "swiglu_fwd_chunked": Kind(swiglu_fwd_chunked, lambda: [_meta([8192, 28672])], (PW,)),
    "rope": Kind(rope, lambda: [_meta([4, 2048, 32, 128]), _meta([2048, 128], torch.float32),
                                _meta([2048, 128], torch.float32)], (PW,)),
    "swiglu_fwd": Kind(swiglu_fwd, lambda: [_meta([8192, 14336])] * 2, (PW,)),
    "swiglu_bwd": Kind(swiglu_bwd, lambda: [_meta([8192, 14336])] * 3, (PW,)),
    "gelu_tanh_fwd": Kind(gelu_tanh_fwd, lambda: [_meta([8192, 16384])], (PW,)),
    "gelu_tanh_bwd": Kind(gelu_tanh_bwd, lambda: [_meta([8192, 16384])] * 2, (PW,)),
    "adamw_step": Kind(adamw_step, lambda: _ADAM_SCALARS + [
        _meta([58_720_256], torch.float32)] * 4, (PW,)),
    "adamw_multi_tensor": Kind(adamw_multi_tensor, lambda: _ADAM_SCALARS + [
        _meta([n], torch.float32) for n in _ADAM_MULTI_SIZES for _ in range(4)], (PW,) * 3),
    # The amax, a full reduction, then a pointwise kernel that reads x again (the cast of x is
    # forwarded: no float32 copy of x between them) with the amax broadcast.
    "fp8_quant": Kind(fp8_quant, lambda: [_meta([8192, 4096])], (RED, PW)),
    # The mean and the variance in one pass (float64 sums of x and x^2, schedule/
    # one_pass_variance.py; the running statistics updated in the reduction kernel's epilogue:
    # [C] inputs of fewer dims), then y.
    "batchnorm_fwd_nchw": Kind(batchnorm_fwd_nchw, lambda: [_meta(_CHW)] + [
        _meta([256], torch.float32)] * 4, (RED, PW)),
    "batchnorm_fwd_nhwc": Kind(batchnorm_fwd_nhwc, lambda: [_meta(_CHW, stride=_CHANNELS_LAST)]
                               + [_meta([256], torch.float32)] * 4, (OP,)),
    # The reshape of x to [N, G, C/G*H*W] is a view of x (no kernel): the statistics and the
    # output read x's bf16 bytes, not an fp32 copy.
    "groupnorm_fwd": Kind(groupnorm_fwd, lambda: [
        _meta([8, 320, 64, 64]), _meta([320], torch.float32), _meta([320], torch.float32)],
        (("view", "view"), IP, PW)),
    "softmax_dim0": Kind(softmax_dim0, lambda: [_meta([2048, 8192])], (OP,)),
    # One full-reduction kernel: (p - t)^2 its prologue, the division by the count and the
    # cast its rank-0 epilogue.
    "mean_all": Kind(mean_all, lambda: [_meta([8192, 4096])] * 2, (RED,)),
    "var_mean": Kind(var_mean, lambda: [_meta([8192, 4096])], (IP,)),
    "add_rmsnorm": Kind(add_rmsnorm, lambda: [
        _meta([8192, 4096]), _meta([8192, 4096]), _meta([4096], torch.float32)], (IP,)),
    "linear_bias_gelu": Kind(linear_bias_gelu, lambda: [
        _meta([8192, 4096]), _meta([16384, 4096]), _meta([16384])],
        (("kernel", "matmul"),)),
    # The permute of k is a view of its memory (read by the matmul alone); the matmul of 4-D
    # operands with its scale is one kernel (4-D tensor maps, B K-major).
    "attn_scores_qkT": Kind(attn_scores_qkT, lambda: [_meta([4, 32, 2048, 128])] * 2,
                            (("view", "view"), ("kernel", "matmul"))),
    "l2_normalize": Kind(l2_normalize, lambda: [_meta([8192, 1024])], (IP,)),
    "clamp": Kind(clamp, lambda: [_meta([8192, 14336]), -1.0, 1.0], (PW,)),
    "threshold_bwd": Kind(threshold_bwd, lambda: [_meta([8192, 14336])] * 2, (PW,)),
    "masked_fill_where": Kind(masked_fill_where, lambda: [
        _meta([4, 2048, 1], torch.bool), _meta([4, 2048, 4096])], (PW,)),
    "nchw_channel_bcast": Kind(nchw_channel_bcast, lambda: [
        _meta(_CHW), _meta([256], torch.float32), _meta([256], torch.float32)], (PW,)),
    "permute_bshd_bhsd": Kind(permute_bshd_bhsd, lambda: [_meta([4, 2048, 32, 128])], (PW,)),
    "permute_nchw_nhwc": Kind(permute_nchw_nhwc, lambda: [_meta(_CHW)], (TR,)),
}

# Kinds that wait for ops pyfuser does not have yet (the ops issues, 17/18): the fd.ops names
# (or DataType members) they need, each checked absent below, and the line the docs table shows.
OPS_MISSING: dict[str, tuple] = {}

# Kinds whose scheduler the issue on reduction patterns (16) adds. Their plan has reference
# segments, and each reference segment's reason (`why`, also the segmentation's text) must
# name this refusal of the reduction scheduler.
# None left: mean_all is a full-reduction kernel, and BatchNorm's sums over N, H, W are
# reduction kernels scheduled from the memory order (an inner reduction of the merged N*H*W in
# NCHW, an outer one keeping C in channels-last), with pointwise kernels around them.
REDUCTION_PATTERNS: dict[str, str] = {}

# The 38 kinds of ../shared/FUSIONS.md, in its order.
FUSION_KINDS = (
    "rmsnorm_fwd", "rmsnorm_bwd", "layernorm_fwd", "layernorm_bwd", "softmax_scale_mask",
    "softmax_causal", "cross_entropy_fwd", "cross_entropy_bwd", "swiglu_fwd",
    "swiglu_fwd_chunked", "swiglu_bwd", "gelu_tanh_fwd", "gelu_tanh_bwd",
    "bias_dropout_residual", "rope", "adamw_step", "adamw_multi_tensor", "fp8_quant",
    "batchnorm_fwd_nchw", "batchnorm_fwd_nhwc", "groupnorm_fwd", "softmax_dim0", "mean_all",
    "argmax_rows", "cumsum", "embedding", "topk", "var_mean", "add_rmsnorm",
    "linear_bias_gelu", "attn_scores_qkT", "l2_normalize", "clamp", "threshold_bwd",
    "masked_fill_where", "nchw_channel_bcast", "permute_bshd_bhsd", "permute_nchw_nhwc",
)
FUSIONS_MD = pathlib.Path(__file__).resolve().parents[2] / "shared" / "FUSIONS.md"


def define(name: str) -> FusionDefinition:
    with FusionDefinition(name) as fd:
        KINDS[name].build(fd)
    return fd


def explain(name: str):
    return define(name).explain(KINDS[name].inputs(), device="h100")


# Tests ------------------------------------------------------------------------------------------
def test_every_kind_is_defined_or_waits_for_named_ops():
    assert len(FUSION_KINDS) == 38 and len(set(FUSION_KINDS)) == 38
    assert set(KINDS).isdisjoint(OPS_MISSING)
    assert sorted(set(KINDS) | set(OPS_MISSING)) == sorted(FUSION_KINDS)
    assert set(REDUCTION_PATTERNS) <= set(KINDS)
    if FUSIONS_MD.exists():
        listed = re.findall(r"^- \*\*(\w+)\*\*:", FUSIONS_MD.read_text(), re.MULTILINE)
        assert tuple(listed) == FUSION_KINDS


def test_missing_ops_are_still_missing():
    """When an op lands, its kind moves to KINDS: this fails until the table says so. (Every
    kind has its ops since float8 landed: OPS_MISSING is empty, and a parametrized form of this
    test was skipped for want of parameters.)"""
    fd = FusionDefinition()
    for name, (ops, _) in OPS_MISSING.items():
        present = [op for op in ops if hasattr(fd.ops, op) or hasattr(DataType, op)]
        assert not present, f"{name}: {present} exist now; define {name} in KINDS"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_kind_gets_a_plan_from_explain(name):
    plan = explain(name)
    assert tuple((s.kind, s.name) for s in plan.segments) == KINDS[name].segments
    for s in plan.segments:
        if s.refused:
            # Its heuristic refuses these shapes (BatchNorm of a channels-last image: the column
            # tiles would leave most SMs idle): execute() plans the segment again without that
            # scheduler, in kernels.
            # A top-k's row past one block: the library segment, torch.topk.
            # (A split rewrite's own executor offers it to every scheduler: refused again
            # there, its plan is one level further.)
            again = [(x.kind, x.name) for x in s.again.segments_run]
            assert again and all(k in ("kernel", "library") and n != s.name or
                                 (k, n) == ("library", "topk") for k, n in again), again
            continue
        assert (s.kernel is not None) == (s.kind == "kernel")
    refs = [s for s in plan.segments if s.kind == "reference"]
    if name not in REDUCTION_PATTERNS:
        assert not refs
        return
    assert refs, f"{name} needs no reduction pattern now; remove it from REDUCTION_PATTERNS"
    why = REDUCTION_PATTERNS[name]
    for s in refs:
        # explain names the refusal: in the segment's reason, among the schedulers that
        # rejected it (the reduction scheduler's own line), and in the printed plan.
        assert f"reduction: {why}" in s.why
        assert ("reduction", why) in s.rejected
        assert f"segment {s.index}: reference" in str(plan)
        assert "execute() runs this segment with the reference evaluator" in str(plan)


def test_explain_allocates_nothing():
    """Every tensor of the plans is a meta tensor: no FUSIONS.md shape is allocated."""
    plan = explain("softmax_scale_mask")
    assert all(x.is_meta for x in KINDS["softmax_scale_mask"].inputs())
    (seg,) = plan.segments
    assert seg.inputs == ("T0 [4, 32, 2048, 2048] bfloat16", "T1 [4, 1, 2048, 2048] bfloat16")
    assert seg.outputs[0].endswith("[4, 32, 2048, 2048] bfloat16")


# Plans with several segments, on the interpreter against float64 at small shapes: what explain
# describes is what runs (the segmenter reads no shapes, so the segments are the same).
def _r(*shape, dtype=torch.bfloat16, gen):
    return torch.randn(*shape, generator=gen).to(dtype)


def _bn_inputs(gen, channels_last=False):
    x = _r(4, 8, 5, 6, gen=gen)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    return [x] + [_r(8, dtype=torch.float32, gen=gen) for _ in range(3)] + [
        torch.rand(8, generator=gen) + 0.5]


def _fp8_quant_inputs(gen):
    # Some elements past 448 / amax * |x| are impossible; the clamp matters when amax is a
    # runtime value the scale was not computed from (here it never clamps, as in the recipe).
    return [_r(24, 40, gen=gen) * 3]


def _adam_inputs(gen):
    return _ADAM_SCALARS + [
        t for n in (40, 3, 70) for t in [_r(n, dtype=torch.float32, gen=gen) for _ in range(3)]
        + [torch.rand(n, generator=gen)]]


SMALL_INPUTS = {
    "adamw_multi_tensor": _adam_inputs,
    "batchnorm_fwd_nchw": _bn_inputs,
    "batchnorm_fwd_nhwc": lambda gen: _bn_inputs(gen, channels_last=True),
    "groupnorm_fwd": lambda gen: [_r(2, 64, 4, 4, gen=gen), _r(64, dtype=torch.float32, gen=gen),
                                  _r(64, dtype=torch.float32, gen=gen)],
    "softmax_dim0": lambda gen: [_r(24, 40, gen=gen)],
    "fp8_quant": _fp8_quant_inputs,
    "linear_bias_gelu": lambda gen: [_r(72, 32, gen=gen), _r(24, 32, gen=gen), _r(24, gen=gen)],
    "attn_scores_qkT": lambda gen: [_r(2, 3, 16, 8, gen=gen), _r(2, 3, 16, 8, gen=gen)],
}


def test_small_inputs_cover_every_plan_of_several_segments():
    # Also kinds that became one kernel (softmax over dim 0 and channels-last BatchNorm:
    # outer_persistent), which still run here.
    assert {n for n, k in KINDS.items() if len(k.segments) > 1} <= set(SMALL_INPUTS)


@pytest.mark.filterwarnings("ignore::pyfuser.runtime.executor.FallbackWarning")
@pytest.mark.parametrize("name", sorted(SMALL_INPUTS))
def test_plan_of_several_segments_runs_on_the_interpreter(name):
    from pyfuser.testing import run_and_check

    with FusionDefinition(name) as fd:
        if name == "groupnorm_fwd":
            groupnorm_fwd(fd, N=2, C=64, H=4, W=4)
        else:
            KINDS[name].build(fd)
    inputs = SMALL_INPUTS[name](torch.Generator().manual_seed(0))
    options = {"enable": ["interpret"], "device": "h100"}
    segments = KINDS[name].segments
    if len(segments) == 1 and segments[0][0] == "kernel":      # one kernel, no plan
        run_and_check(fd, inputs, scheduler=segments[0][1], options=options)
    else:
        run_and_check(fd, inputs, kernels=0, segments=segments, options=options)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_new_process_replays_the_segmentation_from_the_disk_cache(name, tmp_path, monkeypatch):
    """The segmenter's decision kept in the disk cache (runtime/kernel_cache.py) gives a new
    definition of the kind the same segments without the merge search (a new process whose
    kernels are on disk pays no search before their look-ups)."""
    from pyfuser.runtime.executor import _DiskDecisions
    from pyfuser.schedule import segmenter

    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)

    def segmented():
        fd = define(name)
        return segmenter.segment(fd.fusion, None, _DiskDecisions(fd.fusion, None))
    first = segmented()

    def no_search(grouping):
        raise AssertionError("the merge search ran on a disk hit")
    monkeypatch.setattr(segmenter._Grouping, "merge_kernels", no_search)
    again = segmented()
    assert str(again) == str(first) and again.decision == first.decision
    assert [s.scheduler for s in again.segments] == [s.scheduler for s in first.segments]

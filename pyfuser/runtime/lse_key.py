"""logsumexp keys on the host (the reference evaluator and the interpreter); lse_key,
lse_combine, lse_max and lse_sum in codegen/runtime_src/math.cuh are the kernels' copy.

A key is an int64 holding a running (m, s) of float32s, m's bits low and s's high: m the largest
element so far, s the sum of exp(x - m) over them. An element's key is (x, 1), no elements are
(-inf, 0) (IDENTITY), and two keys combine as (max(ma, mb), sa * exp(ma - M) + sb * exp(mb - M))
with one exp: the larger m's s plus the other's scaled by exp(-|ma - mb|), a difference that is
NaN (two -inf, two +inf, a NaN m) taken as 0. lse_sum gives NaN where m is +inf, NaN, or -inf
with s not 0, as the two-pass form does (exp(inf - inf), exp(-inf - -inf)). The kernels' exp is
ex2.approx.ftz (a scale below 2^-126 is 0 there, a denormal here: far below the sum's rounding).
"""
from __future__ import annotations

import torch

from ..ir.exprs import LSE_IDENTITY as IDENTITY    # (m, s) = (-inf, 0)

_LOW = 0xFFFFFFFF
_NAN = float("nan")


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A float32 tensor's bits as int64s in [0, 2^32)."""
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & _LOW


def pack(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (_bits(s) << 32) | _bits(m)


def unpack(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, s) of int64 keys, float32."""
    key = key.to(torch.int64)
    low = key & _LOW
    low = (low - ((low & 0x80000000) << 1)).to(torch.int32)
    return low.view(torch.float32), (key >> 32).to(torch.int32).view(torch.float32)


def lse_key(x: torch.Tensor) -> torch.Tensor:
    m = x.to(torch.float32)
    return pack(m, torch.ones_like(m))


def lse_combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The keys a and b combined, elementwise, in float32 as the kernels do."""
    a, b = torch.as_tensor(a, dtype=torch.int64), torch.as_tensor(b, dtype=torch.int64)
    (ma, sa), (mb, sb) = unpack(a), unpack(b)
    d = (mb - ma).to(torch.float32)
    e = torch.exp(torch.where(torch.isnan(d), 0.0, -d.abs()))
    s = torch.where(d > 0, sa * e + sb, sb * e + sa)
    return pack(torch.maximum(ma, mb), s)


def fold_lanes(acc: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    """acc combined with the key of each row of `lanes` ([..., L] float32) at once, as
    math.cuh's lse_fold_lanes: m the row's largest value (NaN if one is NaN), s the sum of
    exp(lane - m) in float32; a row of -inf is (-inf, L), the count the per-element keys give."""
    lanes = lanes.to(torch.float32)
    m = torch.amax(lanes, dim=-1)              # NaN where a lane is NaN
    none = m == float("-inf")
    shift = torch.where(none, 0.0, m)
    s = torch.exp(lanes - shift.unsqueeze(-1)).sum(dim=-1, dtype=torch.float32)
    s = torch.where(none, float(lanes.shape[-1]), s)
    return lse_combine(acc, pack(m, s))


def lse_max(key: torch.Tensor) -> torch.Tensor:
    return unpack(key)[0]


def lse_sum(key: torch.Tensor) -> torch.Tensor:
    m, s = unpack(key)
    undefined = (m == float("inf")) | torch.isnan(m) | ((m == float("-inf")) & (s != 0))
    return torch.where(undefined, _NAN, s).to(torch.float32)


def lse_reduce(key: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """The keys reduced over `dims` (the reference evaluator's rule: the sum in float64, the
    result rounded to a float32 key); over no elements, IDENTITY."""
    if not dims:
        return key
    if any(key.shape[d] == 0 for d in dims):
        kept = [n for d, n in enumerate(key.shape) if d not in dims]
        return torch.full(kept, IDENTITY, dtype=torch.int64, device=key.device)
    m, s = unpack(key)
    real = key != IDENTITY
    m64 = torch.where(real, m.to(torch.float64), float("-inf"))
    top = torch.amax(m64, dim=dims, keepdim=True)
    terms = torch.where(real, s.to(torch.float64) * torch.exp(m64 - top), 0.0)
    return pack(torch.amax(m64, dim=dims), torch.sum(terms, dim=dims))

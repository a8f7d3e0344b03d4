"""The arg keys of an argmax / argmin in one pass, on the host (the reference evaluator and the
interpreter); pf::arg_max_key in codegen/runtime_src/math.cuh is the kernels' copy of the rule.

An element's key is an int64: the value's order as a signed int32 in the high 32 bits (a
float32's bits with the magnitude bits of negatives flipped; -0 as +0, which torch counts
equal; NaN above every number, as torch's argmax and argmin both return the first NaN),
inverted for argmin, and 2^32 - 1 - index in the low 32 bits. The max of a row's keys is then
the key of its first largest (argmax) or first smallest (argmin) element.
"""
from __future__ import annotations

import torch

_LOW = 0xFFFFFFFF
_INT32_MAX = 0x7FFFFFFF


def arg_key(value: torch.Tensor, index: torch.Tensor, largest: bool) -> torch.Tensor:
    """The keys of `value` (float32-representable floats, or int32 range ints) at `index`."""
    if value.dtype.is_floating_point:
        f = value.to(torch.float32)
        bits = f.view(torch.int32)
        bits = torch.where(bits == -2 ** 31, 0, bits)          # -0 orders as +0
        order = bits ^ ((bits >> 31) & _INT32_MAX)
        if not largest:
            order = ~order
        order = torch.where(torch.isnan(f), _INT32_MAX, order)
    else:
        order = value.to(torch.int32)
        if not largest:
            order = ~order
    index = torch.as_tensor(index, device=order.device).to(torch.int64)
    return (order.to(torch.int64) << 32) | (_LOW - index)


def arg_key_index(key: torch.Tensor) -> torch.Tensor:
    """The index an arg key holds."""
    return _LOW - (key & _LOW)


def topk_in_order(x: torch.Tensor, k: int, dim: int, largest: bool) -> tuple:
    """torch.topk's (values, indices) with its order made definite, the order the top-k kernel
    gives (pf::block_topk_x): largest (smallest) first, of equal values the lowest index first
    (-0 equals +0), NaN above every number. torch.topk leaves the order of equal values open."""
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)

"""Replace variables in kernel expressions (used by passes that peel or collapse loops)."""
from __future__ import annotations

import dataclasses

from ..kir import nodes as K


def substitute(e, mapping: dict):
    """A copy of expression `e` with each Var (or Special, e.g. threadIdx.y) in `mapping`
    replaced, constants folded."""
    if isinstance(e, (K.Var, K.Special)):
        return mapping.get(e, e)
    if isinstance(e, K.Bin):
        a, b = substitute(e.a, mapping), substitute(e.b, mapping)
        fn = {"+": K.add, "-": K.sub, "*": K.mul, "/": K.div, "%": K.mod,
              "ceilDiv": K.ceil_div, "<": K.lt, "==": K.eq, "&&": K.and_}.get(e.op)
        return fn(a, b) if fn else K.Bin(e.op, a, b)
    if isinstance(e, K.TensorIndex):
        return dataclasses.replace(e, index=substitute(e.index, mapping))
    if isinstance(e, K.Not):
        return K.Not(substitute(e.a, mapping))
    if isinstance(e, K.Select):
        return K.Select(substitute(e.cond, mapping), substitute(e.a, mapping), substitute(e.b, mapping))
    return e

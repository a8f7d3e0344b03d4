"""Interval bounds of kernel index expressions, to drop predicates that always hold.

With constant extents (a schedule specialized on a row length), `(j * 512 + tid) * 8 < 65536`
holds for every loop point: j < 16, tid < 512. Proving it removes the comparison, and the
registers its operands would occupy. Unknown values (runtime extents, a blockIdx whose grid
dimension a launch hint fixes) make any expression containing them unbounded, so only what is
certain is dropped; a blockIdx whose grid dimension is its loops' one constant extent (the
blocks of a cluster along blockIdx.y) is bounded like a thread index.
"""
from __future__ import annotations

from ..kir import nodes as K


def bounds(e, ranges: dict):
    """(lo, hi) inclusive bounds of an integer expression, or None if unbounded."""
    if isinstance(e, K.Const):
        return (e.value, e.value) if isinstance(e.value, int) and not isinstance(e.value, bool) else None
    if isinstance(e, (K.Var, K.Special)):
        key = e.name if isinstance(e, K.Special) else e
        return ranges.get(key)
    if isinstance(e, K.Bin):
        a, b = bounds(e.a, ranges), bounds(e.b, ranges)
        if a is None or b is None:
            return None
        if e.op == "+":
            return (a[0] + b[0], a[1] + b[1])
        if e.op == "-":
            return (a[0] - b[1], a[1] - b[0])
        if e.op == "*":
            vals = [x * y for x in a for y in b]
            return (min(vals), max(vals))
        if e.op == "/" and b[0] > 0 and a[0] >= 0:
            return (a[0] // b[1], a[1] // b[0])
        if e.op == "%" and b[0] > 0 and a[0] >= 0:
            return (0, min(a[1], b[1] - 1))
        if e.op == "ceilDiv" and b[0] > 0 and a[0] >= 0:
            return (-(-a[0] // b[1]), -(-a[1] // b[0]))
    return None


def always_true(cond, ranges: dict) -> bool:
    if isinstance(cond, K.Const):
        return cond.value is True
    if isinstance(cond, K.Bin):
        if cond.op == "&&":
            return always_true(cond.a, ranges) and always_true(cond.b, ranges)
        a, b = bounds(cond.a, ranges), bounds(cond.b, ranges)
        if a is None or b is None:
            return False
        if cond.op == "<":
            return a[1] < b[0]
        if cond.op == "<=":
            return a[1] <= b[0]
    return False


def simplify_predicate(cond, ranges: dict):
    """cond with every conjunct that always holds removed."""
    if isinstance(cond, K.Bin) and cond.op == "&&":
        return K.and_(simplify_predicate(cond.a, ranges), simplify_predicate(cond.b, ranges))
    return K.Const(True, "bool") if always_true(cond, ranges) else cond

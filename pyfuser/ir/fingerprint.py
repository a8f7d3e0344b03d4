"""A canonical serialization of a fusion: equal for two equal definitions, different for any
change of ops, dtypes, constants, shapes, layouts or structure. The kernel cache keys on it
(runtime/kernel_cache.plan_key), so it must hold everything that can change a kernel.

Generic by construction: every attribute of every Val and Expr reachable from the fusion's
inputs and outputs is written out (new op kinds and attributes are covered without changes
here), Vals by their order of first appearance rather than their names or ids (which depend
on what else was defined before), and the bookkeeping that does not describe the computation
(uses, names, the owning fusion, per-fusion name counters) left out.
"""
from __future__ import annotations

import enum
import hashlib
import json

from .base import Expr, Val

# Attributes that are bookkeeping, not meaning (_walked: Fusion.exprs()'s kept walk).
_SKIP = frozenset({"fusion", "name", "uses", "definition", "_counters", "_walked"})


class _Writer:
    def __init__(self):
        self.numbers: dict[int, int] = {}
        self.pending: list = []
        self.vals: list = []

    def ref(self, v: Val) -> list:
        n = self.numbers.get(id(v))
        if n is None:
            n = self.numbers[id(v)] = len(self.numbers)
            self.pending.append(v)
        return ["val", n]

    def value(self, x):
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return ["float", repr(x)]
        if isinstance(x, Val):
            return self.ref(x)
        if isinstance(x, enum.Enum):
            return [type(x).__name__, x.name]
        if isinstance(x, (list, tuple)):
            return [self.value(v) for v in x]
        if isinstance(x, dict):
            return ["dict", [[self.value(k), self.value(v)] for k, v in x.items()]]
        if isinstance(x, (set, frozenset)):
            items = [self.value(v) for v in x]
            return ["set", sorted(items, key=lambda i: json.dumps(i))]
        if isinstance(x, Expr):
            return self.expr(x)
        attrs = getattr(x, "__dict__", None)
        if attrs is None and hasattr(x, "__slots__"):
            attrs = {k: getattr(x, k) for k in x.__slots__ if hasattr(x, k)}
        if attrs is None:
            return ["repr", type(x).__name__, repr(x)]
        return [type(x).__name__, self.attrs(attrs)]

    def attrs(self, attrs: dict) -> list:
        return [[k, self.value(v)] for k, v in sorted(attrs.items()) if k not in _SKIP]

    def expr(self, e: Expr) -> list:
        return ["expr", type(e).__name__, self.attrs(vars(e))]

    def val(self, v: Val) -> list:
        d = v.definition
        return [type(v).__name__, self.attrs(vars(v)), None if d is None else self.expr(d)]

    def drain(self) -> None:
        while self.pending:
            v = self.pending.pop(0)
            self.vals.append(self.val(v))


def fusion_text(fusion) -> str:
    """The canonical serialization (JSON text)."""
    w = _Writer()
    head = [w.ref(v) for v in fusion.inputs], [w.ref(v) for v in fusion.outputs]
    rest = w.attrs({k: v for k, v in vars(fusion).items() if k not in ("inputs", "outputs")})
    w.drain()
    return json.dumps([head, rest, w.vals], separators=(",", ":"))


def fusion_fingerprint(fusion) -> str:
    """SHA-256 of fusion_text."""
    return hashlib.sha256(fusion_text(fusion).encode()).hexdigest()

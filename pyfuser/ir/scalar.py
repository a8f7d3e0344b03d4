"""Scalars: constants, runtime inputs and symbolic integer expressions (extents, indices).

Extents of symbolic tensor sizes are Scalars named `i0, i1, ...`; splitting an IterDomain makes
derived Scalars such as `ceilDiv(i0, 128)`. Arithmetic on Scalars folds constants and drops
identities so that printed extents stay readable and constant extents stay Python ints.
"""
from __future__ import annotations

import math
import operator

from .base import Expr, Val
from .dtype import DataType, default_scalar_type


class Scalar(Val):
    """A scalar: constant (`value` set), named runtime input, or derived by a ScalarOp."""

    name_kind = "s"

    def __init__(self, dtype: DataType, value=None, fusion=None, symbol: str | None = None):
        super().__init__(fusion)
        self.dtype = dtype
        self.value = value
        # `symbol` names runtime scalars in printed IR and generated code (e.g. "i3").
        self.symbol = symbol

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def is_symbolic_input(self) -> bool:
        return self.value is None and self.definition is None

    def __repr__(self) -> str:
        return scalar_str(self)

    # Integer arithmetic used by domain math; operands may be Scalars or ints. With a tensor
    # (a scalar of a FusionDefinition times a tensor) the tensor's operator takes it.
    def __add__(self, o):
        return add(self, o) if _is_number(o) else NotImplemented

    def __radd__(self, o):
        return add(o, self) if _is_number(o) else NotImplemented

    def __sub__(self, o):
        return sub(self, o) if _is_number(o) else NotImplemented

    def __rsub__(self, o):
        return sub(o, self) if _is_number(o) else NotImplemented

    def __mul__(self, o):
        return mul(self, o) if _is_number(o) else NotImplemented

    def __rmul__(self, o):
        return mul(o, self) if _is_number(o) else NotImplemented


def _is_number(x) -> bool:
    return isinstance(x, (Scalar, int, float))


class ScalarOp(Expr):
    """out = op(a, b) on integer scalars: add, sub, mul, div, ceilDiv, mod, max, min."""

    SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}
    PY = {
        "add": operator.add,
        "sub": operator.sub,
        "mul": operator.mul,
        "div": operator.floordiv,
        "mod": operator.mod,
        "ceilDiv": lambda a, b: -(-a // b),
        "max": max,
        "min": min,
    }

    def __init__(self, op: str, out: Scalar, a: Scalar, b: Scalar):
        assert op in self.PY, op
        self.op = op
        super().__init__([a, b], [out])


def as_scalar(x, dtype: DataType | None = None) -> Scalar:
    if isinstance(x, Scalar):
        return x
    if isinstance(x, (bool, int, float)):
        return Scalar(dtype or default_scalar_type(x), x)
    raise TypeError(f"expected a Scalar or a Python number, got {type(x).__name__}")


def const_value(x):
    """The Python value of a constant Scalar or number, else None."""
    if isinstance(x, Scalar):
        return x.value
    return x


def _binary(op: str, a, b) -> Scalar:
    a, b = as_scalar(a, DataType.Int), as_scalar(b, DataType.Int)
    va, vb = a.value, b.value
    if va is not None and vb is not None:
        return Scalar(DataType.Int, ScalarOp.PY[op](va, vb))
    # Identities keep printed extents short: x*1, x+0, x/1, ceilDiv(x, 1).
    if op in ("mul", "div", "ceilDiv") and vb == 1:
        return a
    if op == "mul" and va == 1:
        return b
    if op in ("add", "sub") and vb == 0:
        return a
    if op == "add" and va == 0:
        return b
    if op == "mul" and (va == 0 or vb == 0):
        return Scalar(DataType.Int, 0)
    if op == "mod" and vb == 1:
        return Scalar(DataType.Int, 0)
    if op in ("max", "min") and a is b:
        return a
    out = Scalar(DataType.Int)
    ScalarOp(op, out, a, b)
    return out


def add(a, b):
    return _binary("add", a, b)


def sub(a, b):
    return _binary("sub", a, b)


def mul(a, b):
    return _binary("mul", a, b)


def div(a, b):
    return _binary("div", a, b)


def ceil_div(a, b):
    return _binary("ceilDiv", a, b)


def mod(a, b):
    return _binary("mod", a, b)


def smax(a, b):
    return _binary("max", a, b)


def smin(a, b):
    return _binary("min", a, b)


def product(values) -> Scalar:
    out = as_scalar(1, DataType.Int)
    for v in values:
        out = mul(out, v)
    return out


def same_value(a, b) -> bool:
    """True if two scalars are known equal: the same object, equal constants, or the same
    operation on operands known equal."""
    if a is b:
        return True
    va, vb = const_value(a), const_value(b)
    if va is not None and vb is not None:
        return va == vb
    if isinstance(a, Scalar) and isinstance(b, Scalar) and a.definition and b.definition:
        da, db = a.definition, b.definition
        return da.op == db.op and all(same_value(x, y) for x, y in zip(da.inputs, db.inputs))
    return False


def evaluate(x, bindings: dict) -> int | float | bool:
    """Value of a scalar given values for its symbolic inputs (`bindings`: Scalar -> value)."""
    if not isinstance(x, Scalar):
        return x
    if x.value is not None:
        return x.value
    if x in bindings:
        return bindings[x]
    d = x.definition
    if d is None:
        raise KeyError(f"no value bound for scalar {scalar_str(x)}")
    a, b = (evaluate(i, bindings) for i in d.inputs)
    v = ScalarOp.PY[d.op](a, b)
    bindings[x] = v
    return v


def symbolic_inputs(x) -> list[Scalar]:
    """The runtime-input scalars an expression depends on."""
    out: list[Scalar] = []
    stack = [x]
    while stack:
        s = stack.pop()
        if not isinstance(s, Scalar) or s.value is not None:
            continue
        if s.definition is None:
            if s not in out:
                out.append(s)
        else:
            stack.extend(s.definition.inputs)
    return out


def scalar_str(x) -> str:
    if not isinstance(x, Scalar):
        return repr(x)
    if x.value is not None:
        v = x.value
        if isinstance(v, float):
            if math.isinf(v) or math.isnan(v):
                return str(v)
            return repr(v)
        return str(v).lower() if isinstance(v, bool) else str(v)
    if x.definition is None:
        return x.symbol or f"s{x.name}"
    d = x.definition
    if not isinstance(d, ScalarOp):
        op = getattr(d, "op", None)
        name = getattr(op, "value", type(d).__name__)
        if name == "cast":
            name = f"cast<{x.dtype.ir_name}>"
        return f"{name}({', '.join(scalar_str(i) for i in d.inputs)})"
    a, b = (scalar_str(i) for i in d.inputs)
    if d.op in ScalarOp.SYMBOLS:
        return f"({a} {ScalarOp.SYMBOLS[d.op]} {b})"
    return f"{d.op}({a}, {b})"

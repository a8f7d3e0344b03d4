"""slice, pad, cat and chunk as windows (ir.exprs.WindowOp) of the tensors they read.

A window reads its source from global memory (a fusion input, or what an earlier segment wrote),
so building one does three things before it makes a WindowOp:
- a window of a window reads the first one's source through both (one WindowOp: a pad of a
  slice of an input is one offset read with a guard);
- a window of an element-wise op (unary, binary, where) is the op of its operands' windows: a
  slice of `x * w` reads x and w at the slice's offset, and `cat([-x2, x1])` of RoPE reads q
  twice, each read an offset into q, in one kernel;
- where that stops (a reduction, a reshape, an expanded dim the window moves along), the
  WindowOp reads the tensor as it is, and the segmenter ends a segment at it.
Guards (a pad's out-of-range part) read `fill` in the window; a window pushed through an op
applies the op to the guarded reads and then selects the pad value with an iota mask, since
op(fill) need not be the pad value.
"""
from __future__ import annotations

from ..ir import arith
from ..ir import scalar as S
from ..ir.dtype import DataType
from ..ir.exprs import BinaryOp, DimWindow, UnaryOp, WhereOp, WindowOp
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView

_ELEMENTWISE = (UnaryOp, BinaryOp, WhereOp)


def _int_or_scalar(x):
    """A constant Scalar as its int, else x."""
    v = S.const_value(x)
    return v if isinstance(v, int) else x


def _add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return S.add(a, b)


def _mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return S.mul(a, b)


def compose(outer: DimWindow | None, inner: DimWindow | None) -> DimWindow | None:
    """The window that reads `inner`'s source where `outer` reads inner's result: outer's j
    reads inner's j' = o2 + s2 * j, which reads the source at o1 + s1 * j'. inner's guards on
    j' become guards on j; outer's guards stay."""
    if outer is None:
        return inner
    if inner is None:
        return outer
    guards = tuple((_add(a, _mul(b, outer.offset)), b * outer.step, lo, hi)
                   for a, b, lo, hi in inner.guards)
    return DimWindow(_add(inner.offset, _mul(inner.step, outer.offset)),
                     inner.step * outer.step, outer.guards + guards)


def window(ops, x: TensorView, windows: list, extents: list, fill,
           exact_fill: bool = True) -> TensorView:
    """x read through `windows` (a DimWindow or None per logical dim), with `extents` for the
    windowed dims and `fill` where a guard fails (a Python number or a Scalar of x's dtype).
    `exact_fill=False`: any value may stand where a guard fails (an operand of a window pushed
    through an op, whose result the mask after the op replaces there)."""
    guarded = any(w is not None and w.guards for w in windows)
    d = x.definition
    if isinstance(d, WindowOp):
        # One read of the first window's source through both windows. Where both have guards
        # with different fills (a cat of a padded tensor), the read takes the inner fill and a
        # mask of the outer guards selects the outer one.
        inner_guarded = any(w is not None and w.guards for w in d.windows)
        outer_fill_apart = guarded and inner_guarded and not _same_fill(d.fill, fill)
        outer = [None if w is None else DimWindow(w.offset, w.step) if outer_fill_apart else w
                 for w in windows]
        y = window(ops, d.src, [compose(o, i) for o, i in zip(outer, d.windows)],
                   extents, d.fill if inner_guarded else fill)
        return _select_fill(ops, y, windows, extents, fill) if outer_fill_apart and exact_fill \
            else y
    if isinstance(d, _ELEMENTWISE) and _pushable(x, windows):
        operands = [_operand_window(ops, v, windows, extents) for v in d.inputs]
        y = redo(d, operands)
        return _select_fill(ops, y, windows, extents, fill) if guarded and exact_fill else y
    return arith.window(x, windows, extents, fill)


def _pushable(x: TensorView, windows) -> bool:
    """Whether each tensor operand of x's op either has the windowed dims (as iterations) or
    broadcasts them without an expanded extent (a broadcast stays one: every out index reads
    its one element)."""
    for v in x.definition.inputs:
        if not isinstance(v, TensorView):
            continue
        dims = v.domain.logical_no_reductions
        if len(dims) != len(windows):
            return False
        for i, w in zip(dims, windows):
            if w is not None and i.is_broadcast and i.expanded_extent is not None:
                return False
    return True


def _operand_window(ops, v, windows, extents):
    """An operand of a pushed window: read through the windows of the dims it iterates; the
    dims it broadcasts stay broadcasts (their one element serves every index)."""
    if not isinstance(v, TensorView):
        return v
    dims = v.domain.logical_no_reductions
    ws = [None if i.is_broadcast else w for i, w in zip(dims, windows)]
    if all(w is None for w in ws):
        return v
    return window(ops, v, ws, [n if w is not None else i.user_extent
                               for w, n, i in zip(ws, extents, dims)], zero_of(v.dtype),
                  exact_fill=False)


def zero_of(dtype: DataType):
    """The zero of a dtype as a Python value: a pad's default value, the fill of a cat's parts
    and of a pushed window's operands (any value serves there: the mask after the op replaces
    what it becomes)."""
    return False if dtype.is_boolean else 0


def _same_fill(a, b) -> bool:
    va = S.const_value(a)
    return va is not None and va == S.const_value(b)


def redo(d, operands) -> TensorView:
    """d's op on new operands, with d's output dtype."""
    out = d.outputs[0]
    if isinstance(d, UnaryOp):
        return arith.unary(d.op, operands[0], out.dtype)
    if isinstance(d, BinaryOp):
        return arith.binary(d.op, operands[0], operands[1], out.dtype)
    return arith.where(operands[0], operands[1], operands[2], out.dtype)


def index_dtype(*values) -> DataType:
    """Int32 for an iota (and the comparisons on it) when every value it meets is a constant
    that fits with room to spare, else Int: 32-bit integer math per element costs half of
    64-bit on the GPU."""
    consts = [S.const_value(v) for v in values]
    if all(isinstance(c, int) and abs(c) < 2 ** 30 for c in consts):
        return DataType.Int32
    return DataType.Int


def dim_index(ops, n, dim: int, rank: int, dtype: DataType) -> TensorView:
    """The index along `dim` (of extent n) of a rank-`rank` tensor: an iota broadcast over the
    other dims."""
    j = ops.iota(n, dtype=dtype)
    return ops.broadcast(j, [m != dim for m in range(rank)]) if rank > 1 else j


def concat(ops, xs: list, dim: int) -> TensorView:
    """torch.cat of tensors of one rank and dtype along `dim`: each is read through a window
    over the whole result (a pad), and an iota along `dim` picks whose part each element is.
    The where chain takes each part only inside its own range, so what a part holds outside it
    (a pushed window's op of the fill) is never read: its windows need no mask."""
    rank = len(xs[0].domain.logical_no_reductions)
    sizes = [_int_or_scalar(t.domain.logical_no_reductions[dim].user_extent) for t in xs]
    total = 0
    for n in sizes:
        total = _add(total, n)
    out, start = None, 0
    for t, n in zip(xs, sizes):
        extents = [i.user_extent for i in t.domain.logical_no_reductions]
        extents[dim] = total
        windows = [None] * rank
        windows[dim] = DimWindow(_mul(start, -1), 1, ((_mul(start, -1), 1, 0, n),))
        part = window(ops, t, windows, extents, zero_of(t.dtype), exact_fill=False)
        if out is None:
            out = part
        else:
            j = dim_index(ops, total, dim, rank, index_dtype(total, start))
            out = ops.where(ops.lt(j, start), out, part)
        start = _add(start, n)
    return out


def guard_mask(ops, windows, extents, rank: int):
    """The bool tensor (broadcast over unguarded dims) that holds where every guard holds."""
    mask = None
    for k, (w, n) in enumerate(zip(windows, extents)):
        if w is None or not w.guards:
            continue
        j = dim_index(ops, n, k, rank, index_dtype(n, *(x for g in w.guards for x in g)))
        for a, b, lo, hi in w.guards:
            v = j if b == 1 else ops.mul(j, b)
            if S.const_value(a) != 0:
                v = ops.add(v, a)
            inside = ops.logical_and(ops.ge(v, lo), ops.lt(v, hi))
            mask = inside if mask is None else ops.logical_and(mask, inside)
    return mask


def _select_fill(ops, y: TensorView, windows, extents, fill) -> TensorView:
    mask = guard_mask(ops, windows, extents, len(windows))
    return ops.where(mask, y, fill if isinstance(fill, (TensorView, Scalar)) else
                     Scalar(y.dtype, fill if not y.dtype.is_floating else float(fill)))

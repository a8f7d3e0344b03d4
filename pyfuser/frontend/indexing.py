"""take_along_axis, gather, index_select and embedding as gathers (ir.exprs.GatherOp); scatter,
scatter_add and index_add (one-hot compares, ir.exprs.ScatterOp).

A gather reads its source from global memory (a fusion input, or what an earlier segment wrote)
at the index tensor's values. Where the source is an element-wise op of one tensor (a cast of
bf16 logits to float, a scale), the gather reads that tensor and the op is applied to what it
read: gather(f(x)) is f(gather(x)), one kernel where reading f(x) would end a segment at it.
Where an index is out of range the kernel reports it (runtime/index_check.py) and no value is
used, so f(0) there does not matter.
"""
from __future__ import annotations

from ..ir import arith
from ..ir import scalar as S
from ..ir.dtype import DataType, default_scalar_type
from ..ir.exprs import BinaryOp, UnaryOp, WhereOp
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView
from . import resize
from .resize import redo


def gather(x: TensorView, index: TensorView, dim: int, src_dims, broadcast: bool,
           what: str) -> TensorView:
    """x read at `index` (arith.gather's arguments), pushed through element-wise ops of x whose
    other operands are scalars."""
    d = x.definition
    if isinstance(d, (UnaryOp, BinaryOp, WhereOp)):
        tensors = [v for v in d.inputs if isinstance(v, TensorView)]
        if len(tensors) == 1 and _same_dims(tensors[0], x):
            inner = gather(tensors[0], index, dim, src_dims, broadcast, what)
            return redo(d, [inner if v is tensors[0] else v for v in d.inputs])
    return arith.gather(what, x, index, dim, src_dims, broadcast)


def _same_dims(a: TensorView, b: TensorView) -> bool:
    """Whether a's dims are b's (as an element-wise op's only tensor operand's are)."""
    da, db = a.domain.logical_no_reductions, b.domain.logical_no_reductions
    return len(da) == len(db) and all(i.is_broadcast == j.is_broadcast for i, j in zip(da, db))


# Scatters ---------------------------------------------------------------------------------------
# torch.scatter of a value into x at one index per row (a one-hot: cross-entropy's dlogits) is an
# element-wise op: out[.., j, ..] = (j == index[.., 0, ..]) ? src[.., 0, ..] : x[.., j, ..], each
# element deciding its own value. It is written so (iota, eq, where), so that every scheduler
# takes it with what it reads and feeds, in one pass, with no atomics; the index is checked
# (IndexCheckOp): out of range, no element would match. Any other scatter is a ScatterOp.
# scatter_add and index_add accumulate into zeros (float32 for 16-bit floats) with atomic adds
# (the `scatter` scheduler); x, where it is not zeros, is added to the sums element-wise after
# them, and the result cast back to x's dtype.


def _static(i) -> int | None:
    """The size of dim ID i if the definition fixes it (a broadcast is 1), else None."""
    if i.is_broadcast and i.expanded_extent is None:
        return 1
    return S.const_value(i.expanded_extent if i.expanded_extent is not None else i.extent)


def _plain_broadcast(i) -> bool:
    return i.is_broadcast and i.expanded_extent is None


def _pairs(a, b) -> bool:
    """Whether dims a and b have one size, as far as an element-wise op can pair them: both
    sizes fixed and equal, or both symbolic iterations (their equality is then checked on every
    call, as for any element-wise op)."""
    sa, sb = _static(a), _static(b)
    if sa is not None and sb is not None:
        return sa == sb
    return not _plain_broadcast(a) and not _plain_broadcast(b)


def _one_hot_form(x: TensorView, index: TensorView, src, dim: int) -> bool:
    """Whether scatter(x, index, src, dim) is a one-hot: index has one element along dim and
    its other dims (and a tensor src's) pair with x's."""
    xs, ids = x.domain.logical_no_reductions, index.domain.logical_no_reductions
    if _static(ids[dim]) != 1:
        return False
    for d, (xi, ii) in enumerate(zip(xs, ids)):
        if d != dim and not _pairs(xi, ii):
            return False
    if isinstance(src, TensorView):
        ss = src.domain.logical_no_reductions
        for d, (xi, si) in enumerate(zip(xs, ss)):
            if d != dim and not _pairs(xi, si):
                return False
    return True


def scatter(ops, x: TensorView, index: TensorView, src, dim: int) -> TensorView:
    """fd.ops.scatter: the one-hot form element-wise, any other as a ScatterOp ("set")."""
    rank = len(x.domain.logical_no_reductions)
    if not isinstance(src, TensorView):
        v = _converted(src.value, x.dtype)
        src = Scalar(default_scalar_type(v), v)
    if _one_hot_form(x, index, src, dim):
        index = _first_along(ops, index, dim)
        if isinstance(src, TensorView):
            src = _first_along(ops, src, dim)
        n = x.domain.logical_no_reductions[dim].user_extent
        checked = arith.check_index(index, n, "scatter", dim)
        j = resize.dim_index(ops, n, dim, rank, resize.index_dtype(n))
        return ops.where(ops.eq(j, checked), src, x)
    if x.dtype.is_float8:
        from .ops import FusionDefinitionError
        raise FusionDefinitionError(
            f"scatter: T{x.name} is {x.dtype.short_name}, which only a one-hot scatter (one "
            "index along dim, the other dims x's) takes: torch has no other float8 scatter; "
            "cast it first")
    if not isinstance(src, TensorView):
        src = ops.full([i.user_extent for i in index.domain.logical_no_reductions], src, x.dtype)
    src = _fit_to_index(ops, "scatter", src, index)
    return arith.scatter("scatter", x, x, index, src, dim, "set", x.dtype, exact=False)


def scatter_add(ops, what: str, x: TensorView, index: TensorView, src: TensorView, dim: int,
                exact: bool) -> TensorView:
    """scatter_add / index_add (index already of src's rank): sums into zeros of the
    accumulation dtype, plus x where x is not zeros, in x's dtype."""
    if x.dtype.is_boolean:
        # torch adds bools as a logical or: no atomic add does that; torch runs it.
        return arith.scatter(what, x, x, index, src, dim, "add", x.dtype, exact)
    acc_dt = DataType.Float if x.dtype.is_reduced_float else x.dtype
    acc = arith.scatter(what, x, None, index, ops.cast(src, acc_dt), dim, "add", acc_dt, exact)
    if not _is_zeros(x):
        acc = ops.add(ops.cast(x, acc_dt), acc)
    return ops.cast(acc, x.dtype)


def _is_zeros(x: TensorView) -> bool:
    """Whether x is a fill of +0 (not -0.0: x + 0 would turn its -0 into +0)."""
    import math

    from ..ir.exprs import FullOp
    d = x.definition
    v = S.const_value(d.inputs[0]) if isinstance(d, FullOp) else None
    return v is not None and v == 0 and math.copysign(1.0, float(v)) > 0


def _converted(value, dt: DataType):
    """A Python number as torch converts a scatter's value into x's dtype."""
    if dt.is_boolean:
        return bool(value)
    if dt.is_integral:
        return int(value)
    return float(value)


def _first_along(ops, t: TensorView, dim: int) -> TensorView:
    """t's first element along dim as a broadcast dim there (t itself where it is one), which
    an element-wise op broadcasts: a gather of t at index 0 (a read of t in global memory)."""
    ids = t.domain.logical_no_reductions
    if _plain_broadcast(ids[dim]):
        return t
    zero = ops.full([1] * len(ids), 0, DataType.Int)
    # Through element-wise ops of one tensor, as any gather: a cast of an input is read and
    # cast, not computed and stored for the gather to read.
    return gather(t, zero, dim, [None if d == dim else d for d in range(len(ids))], True,
                  "scatter")


def _fit_to_index(ops, what: str, src: TensorView, index: TensorView) -> TensorView:
    """src cut to index's sizes where the definition makes it larger (torch reads src at the
    index's positions only); a plain-broadcast index dim takes src's first element."""
    from .ops import FusionDefinitionError
    s_ids, i_ids = src.domain.logical_no_reductions, index.domain.logical_no_reductions
    if len(s_ids) != len(i_ids):
        raise FusionDefinitionError(f"{what}: source of rank {len(s_ids)} for an index of rank "
                                    f"{len(i_ids)}; they must have one rank")
    ends = [None] * len(s_ids)
    for k, (si, ii) in enumerate(zip(s_ids, i_ids)):
        n, m = _static(ii), _static(si)
        if _plain_broadcast(ii):
            if not _plain_broadcast(si):
                ends[k] = 1
        elif n is not None and m is not None and m > n:
            ends[k] = n
    if all(e is None for e in ends):
        return src
    return ops.slice(src, [None] * len(s_ids), ends)

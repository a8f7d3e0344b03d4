"""take_along_axis, gather, index_select and embedding as gathers (ir.exprs.GatherOp).

A gather reads its source from global memory (a fusion input, or what an earlier segment wrote)
at the index tensor's values. Where the source is an element-wise op of one tensor (a cast of
bf16 logits to float, a scale), the gather reads that tensor and the op is applied to what it
read: gather(f(x)) is f(gather(x)), one kernel where reading f(x) would end a segment at it.
Where an index is out of range the kernel reports it (runtime/index_check.py) and no value is
used, so f(0) there does not matter.
"""
from __future__ import annotations

from ..ir import arith
from ..ir.exprs import BinaryOp, UnaryOp, WhereOp
from ..ir.tensor import TensorView
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

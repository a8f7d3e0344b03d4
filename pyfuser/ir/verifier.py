"""Structural checks of a fusion: a schedule or an op builder that breaks one is a bug."""
from __future__ import annotations

from .base import Expr
from .exprs import ReductionOp
from .iter_domain import ParallelType, ancestors, id_exprs_between
from .scalar import Scalar
from .tensor import MemoryType, TensorView


class VerificationError(AssertionError):
    pass


def verify(fusion) -> None:
    """Raise VerificationError naming the first broken rule."""
    exprs = fusion.exprs()
    defined = set(fusion.inputs)
    for e in exprs:
        for i in e.inputs:
            if isinstance(i, TensorView) and i not in defined and i.definition is None:
                raise VerificationError(f"T{i.name} is used but is neither an input nor computed")
        for o in e.outputs:
            if o.definition is not e:
                raise VerificationError(f"T{o.name}'s definition does not point back to its expr")
            defined.add(o)
        _check_uses(e)
    for o in fusion.outputs:
        if o.definition is None and o not in fusion.inputs:
            raise VerificationError(f"output T{o.name} is never computed")
    for tv in fusion.tensors():
        verify_tensor(tv, fusion)


def _check_uses(e: Expr) -> None:
    for i in e.inputs:
        if e not in i.uses:
            raise VerificationError(f"{type(e).__name__} is missing from the uses of its input")


def verify_tensor(tv: TensorView, fusion=None) -> None:
    d = tv.domain
    name = f"T{tv.name}"
    start = d.maybe_root
    # The loop domain must derive from the root/logical domain and cover it: every root ID is an
    # ancestor of some loop ID (no iteration is dropped).
    covered = set()
    for i in d.loop:
        covered.update(ancestors(i, start))
    missing = [i for i in start if i not in covered]
    if missing:
        raise VerificationError(f"{name}: loop domain does not cover {missing}")
    if len(d.contiguity) != len(d.maybe_allocation):
        raise VerificationError(f"{name}: {len(d.contiguity)} contiguity flags for "
                                f"{len(d.maybe_allocation)} allocation IDs")
    if not 0 <= tv.compute_at_pos <= len(d.loop):
        raise VerificationError(f"{name}: compute-at position {tv.compute_at_pos} out of range")
    if tv.memory_type != MemoryType.Global and fusion is not None and (
            tv in fusion.inputs or tv in fusion.outputs):
        raise VerificationError(f"{name}: fusion inputs and outputs live in global memory")
    if isinstance(tv.definition, ReductionOp) and not tv.has_reduction() and not tv.domain.root:
        raise VerificationError(f"{name}: a reduction output without reduction IDs")
    vec = [k for k, i in enumerate(d.loop) if i.parallel_type == ParallelType.Vectorize]
    if len(vec) > 1:
        raise VerificationError(f"{name}: more than one vectorized axis")
    for e in id_exprs_between(start, d.loop):
        for o in e.outputs:
            if o.fusion is not tv.fusion and o.fusion is not None and tv.fusion is not None:
                raise VerificationError(f"{name}: an ID of another fusion in its history")
    for i in d.loop:
        if not isinstance(i.extent, Scalar):
            raise VerificationError(f"{name}: extent of {i!r} is not a Scalar")

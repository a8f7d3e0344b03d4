"""recompute: give some uses of a tensor their own copy of its computation.

    Before: T1 = cast(T0); T2 = sum(T1 * T1); T5 = T1 * rstd        T1 resident across the sum
    After:  T1 = cast(T0); T2 = sum(T1 * T1); T1' = cast(T0); T5 = T1' * rstd

A normalization keeps a row on chip between its reduction and the use of the reduction's result.
Keeping the input (bf16) instead of a float intermediate halves the registers that row needs;
the cheap pointwise work between them is done twice.

Recomputed: element-wise ops, copies (a permute keeps its root order), broadcasts, expands,
squeezes, reshapes (their Split/Merge history is replayed on the copy's IDs) and fills (full,
zeros, ones: no tensor input at all). Not recomputed: reductions, whose result a copy would
have to reduce again (a caller stops the copy at them); `recompute_blocker` names such a tensor
on the way from `stop_at`.
"""
from __future__ import annotations

from ..ir.base import Expr
from ..ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, GatherOp, IndexCheckOp, IotaOp,
                        LoadStoreOp, RandOp, ReshapeOp, SqueezeOp, UnaryOp, WhereOp, WindowOp)
from ..ir.iter_domain import Merge, Split, id_exprs_between, merge_ids, split_id
from ..ir.id_graph import IdGraph
from ..ir.tensor import MemoryType, ScheduleError, TensorDomain, TensorView

_CLONABLE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp,
             ReshapeOp, FullOp, IotaOp, RandOp, WindowOp, GatherOp, IndexCheckOp)


def _clone_domain(dom: TensorDomain) -> TensorDomain:
    """A fresh TensorDomain with dom's root -> logical relation (unscheduled: loop = logical).
    A permute's output has a root in its producer's dim order and a logical domain in the
    permuted one; cloning only the logical IDs would map the clone to its producer dim by dim
    in the permuted order, a different iteration (a transpose of the data)."""
    if dom.root is None:
        return TensorDomain([i.clone() for i in dom.logical])
    mapping = {i: i.clone() for i in dom.root}
    for x in id_exprs_between(dom.root, dom.logical):
        if isinstance(x, Split):
            mapping[x.outer], mapping[x.inner] = split_id(mapping[x.in_id], x.factor,
                                                          x.inner_split)
        elif isinstance(x, Merge):
            mapping[x.out] = merge_ids(mapping[x.outer], mapping[x.inner])
    logical = [mapping[i] for i in dom.logical]
    for new, old in zip(logical, dom.logical):
        new.iter_type = old.iter_type
    return TensorDomain(logical, root=[mapping[i] for i in dom.root])


def _clone_expr(e: Expr, new_inputs: list) -> TensorView:
    import copy

    out = e.outputs[0]
    with out.fusion:
        new_out = TensorView(_clone_domain(out.domain), out.dtype, MemoryType.Local)
    clone = copy.copy(e)
    clone.inputs, clone.outputs = [], []
    Expr.__init__(clone, new_inputs, [new_out])
    # Codegen keeps a recomputed widening cast opaque to the compiler; otherwise common
    # subexpression elimination merges it with the first cast and keeps the float row live.
    clone.is_recompute = True
    # Transform propagation replays the original's loops onto the copy (the same iteration,
    # dim for dim). Through its producers alone the copy may not reach every dim: the new
    # dims of a recomputed broadcast have no producer to carry them.
    new_out.recompute_of = out
    return new_out


def recompute_blocker(tv: TensorView, stop_at: set) -> TensorView | None:
    """A tensor between `stop_at` and tv (tv included) whose definition is not recomputed, or
    None when recompute_for(tv, ..., stop_at) can copy the whole chain."""
    seen, stack = set(), [tv]
    while stack:
        t = stack.pop()
        if t in stop_at or t in seen or t.definition is None:
            continue
        seen.add(t)
        if not isinstance(t.definition, _CLONABLE):
            return t
        stack.extend(i for i in t.definition.inputs if isinstance(i, TensorView))
    return None


def recompute_for(tv: TensorView, uses: list[Expr], stop_at: set) -> TensorView:
    """Replace tv by a fresh copy of its computation in `uses`, cloning back to `stop_at`."""
    blocker = recompute_blocker(tv, stop_at)
    if blocker is not None:
        raise ScheduleError(f"recompute of T{tv.name}: T{blocker.name} comes from a "
                            f"{type(blocker.definition).__name__}, which is not recomputed")
    copies: dict = {}

    def clone(t: TensorView) -> TensorView:
        if t in stop_at or t.definition is None:
            return t
        if t not in copies:     # one copy of a tensor the chain reads twice (x * x)
            d = t.definition
            ins = [clone(i) if isinstance(i, TensorView) else i for i in d.inputs]
            copies[t] = _clone_expr(d, ins)
        return copies[t]
    copy_tv = clone(tv)
    for u in uses:
        u.replace_input(tv, copy_tv)
    return copy_tv


def uses_across_reductions(fusion, reds) -> list:
    """(tensor, its uses outside what feeds the reduction) for each tensor, not an input, used
    both on the way to one of `reds` and outside it: a normalization's row, held across the
    reduction unless recomputed."""
    from .inlining import upstream
    out = []
    for r in reds:
        feeds = upstream(fusion, r) | {r}
        for t in fusion.tensors():
            if t not in feeds or t is r or t.is_input():
                continue
            outside = [e for e in fusion.uses_of(t) if e.outputs[0] not in feeds]
            if outside and any(e.outputs[0] in feeds for e in fusion.uses_of(t)):
                out.append((t, outside))
    return out


def recompute_each_pass(fusion, reds) -> None:
    """Give every use after a reduction its own copy of each tensor used on both sides of one,
    back to the fusion's inputs (whose caches are loaded again), so that nothing along the
    reduced dims stays resident between the passes of a kernel that reads its inputs once per
    pass. Tensors without the reduced dims (a row's statistic, its broadcast) are one value
    per kept coordinate and stay.

    Before: C = set(x); M = max(C); S = sum(exp(C - M)); y = exp(C - M) / S
    After:  C = set(x); M = max(C); C' = set(x); S = sum(exp(C' - M));
            C'' = set(x); y = exp(C'' - M) / S
    """
    def kept_only(t, graph, to, red_ids):
        return not any((to if i.is_broadcast else graph).mapped(i, x)
                       for i in t.domain.logical_no_reductions for x in red_ids)
    done = set()
    while True:
        graph = IdGraph(fusion)     # rebuilt: clones carry IDs the last graph did not know
        to = IdGraph(fusion, permissive=True, transforms=False)
        red_ids = [i for r in reds for i in r.domain.maybe_root if i.is_reduction]
        pending = [(t, out) for t, out in uses_across_reductions(fusion, reds)
                   if t not in done and not kept_only(t, graph, to, red_ids)]
        if not pending:
            return
        t, outside = pending[0]
        done.add(t)
        stop = {u for u in fusion.tensors() if u.is_input() or kept_only(u, graph, to, red_ids)}
        recompute_for(t, outside, stop)

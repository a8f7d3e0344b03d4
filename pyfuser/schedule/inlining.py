"""Compute-at positions: which loops a tensor shares with its consumers.

inline_at(T, k): T's loops [0, k) are its consumers' loops [0, k); T is computed inside them and
allocated only for the loops right of k.

    before (k = 0)                      after inline_at(T1, 1)
    for i0: for i1: T1[i0, i1] = ..     for i0:
    for i0: for i1: T2[i0, i1] = T1..     for i1: T1[i1] = ...
                                          for i1: T2[i0, i1] = T1[i1]
"""
from __future__ import annotations

from ..ir.exprs import ReductionOp
from ..ir.id_graph import IdGraph, match_loops
from ..ir.iter_domain import ParallelType, ancestors
from ..ir.tensor import ScheduleError, TensorView

_UNINLINABLE = (ParallelType.Vectorize, ParallelType.Bulk)


def _downstream(fusion, tv: TensorView) -> set:
    out, stack = set(), [tv]
    while stack:
        t = stack.pop()
        for c in fusion.consumers(t):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def _upstream(fusion, tv: TensorView) -> set:
    out, stack = set(), [tv]
    while stack:
        t = stack.pop()
        for p in fusion.producers(t):
            if p not in out:
                out.add(p)
                stack.append(p)
    return out


def _persistent_limits(fusion, tv: TensorView, graph: IdGraph) -> set:
    """Loop IDs of tv that must stay its own loops (tv stays resident across them).

    When tv feeds a reduction R through one consumer and has another consumer that does not
    lead into R (typically one that runs after R, using its result), the two consumers run in
    different loop nests over R's reduced axes; tv must hold all of them. So tv's loop IDs that
    map to R's reduction IDs cannot be shared with its consumers.
    """
    blocked = set()
    consumers = fusion.consumers(tv)
    if len(consumers) < 2:
        return blocked
    for r in _downstream(fusion, tv):
        if not isinstance(r.definition, ReductionOp):
            continue
        feeds = _upstream(fusion, r) | {r}
        after_r = _downstream(fusion, r)
        inside = [c for c in consumers if c in feeds]
        # A consumer outside R's inputs forces tv to stay resident only if it, or what it
        # feeds, uses R's result: the dx chain of a norm backward runs beside the column
        # partials' accumulation over rows without needing it.
        outside = [c for c in consumers if c not in feeds and (
            c in after_r or any(d in after_r for d in _downstream(fusion, c)))]
        if not inside or not outside:
            continue
        red_ids = [i for i in r.domain.all_ids() if i.is_reduction]
        for i in tv.domain.loop:
            if any(graph.mapped(i, x) for x in red_ids) or any(
                    graph.mapped(a, x) for a in ancestors(i, tv.domain.maybe_root) for x in red_ids):
                blocked.add(i)
    return blocked


def max_inline_position(tv: TensorView, graph: IdGraph | None = None) -> tuple[int, str]:
    """The deepest legal compute-at position of tv, and why it stops there."""
    fusion = tv.fusion
    if tv.is_input():
        return 0, "fusion inputs are not computed"
    consumers = fusion.consumers(tv)
    if not consumers:
        return 0, "no consumer"
    graph = graph or IdGraph(fusion, permissive=True)
    blocked = _persistent_limits(fusion, tv, graph)
    n = len(tv.domain.loop)
    for k in range(n):
        i = tv.domain.loop[k]
        if i.is_reduction:
            return k, f"axis {k} is a reduction: consumers need its result complete"
        if i.parallel_type in _UNINLINABLE:
            return k, f"axis {k} is {i.parallel_type.short}: it must stay an own loop of T{tv.name}"
        if i in blocked:
            return k, (f"axis {k} maps to a reduction whose result T{tv.name}'s other consumers "
                       f"need; T{tv.name} stays resident across it")
        skips = {}
        for c in consumers:
            pos = match_loops(tv, c, k + 1, graph)
            if pos is None:
                return k, f"axis {k} maps to no loop of consumer T{c.name} in order"
            ci = c.domain.loop[pos[-1]]
            if ci.parallel_type in _UNINLINABLE:
                return k, f"axis {k} maps to a {ci.parallel_type.short} axis of consumer T{c.name}"
            skips[c] = pos[-1] - k
        if len(set(skips.values())) > 1:
            # A consumer computes tv inside loops over dims tv lacks (the rows around a weight
            # broadcast to [M, N]) that another consumer does not have (the weight's own output
            # w * 2 [N]): tv cannot be computed in one place inside both.
            (a, sa), (b, sb) = sorted(skips.items(), key=lambda x: x[1])[::len(skips) - 1]
            return k, (f"axis {k} is inside {sb} loop(s) of consumer T{b.name} over dims "
                       f"T{tv.name} lacks, and inside {sa} of consumer T{a.name}: consumers at "
                       "different depths")
    return n, "fully inlined"


def inline_at(tv: TensorView, pos: int, graph: IdGraph | None = None) -> TensorView:
    """Set tv's compute-at position to `pos` (negative counts from the end)."""
    n = len(tv.domain.loop)
    p = pos + n + 1 if pos < 0 else pos
    if not 0 <= p <= n:
        raise ScheduleError(f"inline_at on T{tv.name}: position {pos} is out of range 0..{n}")
    limit, why = max_inline_position(tv, graph)
    if p > limit:
        raise ScheduleError(f"inline_at on T{tv.name}: position {p} is past the legal limit "
                            f"{limit}: {why}")
    _set_position(tv, p)
    return tv


def _set_position(tv: TensorView, p: int) -> None:
    tv.compute_at_pos = p
    fusion = tv.fusion
    for c in fusion.consumers(tv):
        c.max_producer_pos = max((q.compute_at_pos for q in fusion.producers(c)), default=0)


def inline_most(tensors=None, fusion=None) -> None:
    """Inline every tensor (or `tensors`) as deep as is legal."""
    if fusion is None:
        fusion = next(iter(tensors)).fusion
    graph = IdGraph(fusion, permissive=True)
    targets = fusion.tensors() if tensors is None else list(tensors)
    for tv in targets:
        if tv.is_input():
            continue
        p, _ = max_inline_position(tv, graph)
        _set_position(tv, p)

"""Compute-at positions: which loops a tensor shares with its consumers.

inline_at(T, k): T's loops [0, k) are its consumers' loops [0, k); T is computed inside them and
allocated only for the loops right of k.

    before (k = 0)                      after inline_at(T1, 1)
    for i0: for i1: T1[i0, i1] = ..     for i0:
    for i0: for i1: T2[i0, i1] = T1..     for i1: T1[i1] = ...
                                          for i1: T2[i0, i1] = T1[i1]
"""
from __future__ import annotations

from ..ir.exprs import IndexCheckOp, ReductionOp, ScanOp, TopKOp
from ..ir.id_graph import IdGraph, match_loops
from ..ir.iter_domain import ParallelType, ancestors
from ..ir.tensor import MemoryType, ScheduleError, TensorView

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


def upstream(fusion, tv: TensorView) -> set:
    """The tensors `tv` is computed from, directly or not (not tv itself)."""
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
        if isinstance(r.definition, ScanOp):
            # A scan's result is complete only after its block scan: like a reduction's, to
            # the consumers beside it (x + cumsum(x) reads x after the scan). Its loops bound to
            # blocks (a row split over a cluster) are scopes every consumer shares.
            red_ids = [i for i in r.definition.scanned_ids()
                       if not i.parallel_type.is_block_dim]
            scan_loops = True
        elif isinstance(r.definition, ReductionOp):
            red_ids = [i for i in r.domain.all_ids() if i.is_reduction]
            scan_loops = False
        else:
            continue
        feeds = upstream(fusion, r) | {r}
        after_r = _downstream(fusion, r)
        inside = [c for c in consumers if c in feeds]
        # A consumer outside R's inputs forces tv to stay resident only if it, or what it
        # feeds before a reduction over R's dims, uses R's result: the dx chain of a norm
        # backward runs beside the column partials' accumulation over rows without needing
        # it, and a second column sum beside R meets R's result only once both are complete
        # (fuzz 20261350:740: tv held across every row, a buffer of runtime size).
        outside = [c for c in consumers if c not in feeds
                   and _meets_before_reducing(fusion, c, after_r, red_ids, graph)]
        if not inside or not outside:
            continue
        for i in tv.domain.loop:
            if any(graph.mapped(i, x) for x in red_ids) or not scan_loops and any(
                    graph.mapped(a, x) for a in ancestors(i, tv.domain.maybe_root) for x in red_ids):
                blocked.add(i)
    return blocked


def _meets_before_reducing(fusion, c: TensorView, after_r: set, red_ids: list,
                           graph: IdGraph) -> bool:
    """Whether c, or a tensor c feeds with no reduction over any of `red_ids` on the way (c
    itself included), is in after_r (uses the reduction's result)."""
    seen, todo = set(), [c]
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in after_r:
            return True
        d = t.definition
        if isinstance(d, ReductionOp) and any(
                i.is_reduction and graph.mapped(i, x) for i in t.domain.all_ids()
                for x in red_ids):
            continue
        todo.extend(u for u in fusion.consumers(t) if isinstance(u, TensorView))
    return False


def _owner_loops(fusion, tv: TensorView, pos: int, graph: IdGraph) -> set:
    """(owner, position) of the loops that tv's loop `pos` is: tv's own loop `pos` at or past
    its compute-at position, else (inside a consumer's loop) the owners' loops of the
    consumers' matching loops, which lowering merges into one."""
    if pos >= tv.compute_at_pos:
        return {(tv, pos)}
    out = set()
    for c in fusion.consumers(tv):
        m = match_loops(tv, c, pos + 1, graph)
        if m is not None:
            out |= _owner_loops(fusion, c, m[-1], graph)
    return out


def _merged_with(owner_loops: set, groups: list) -> set:
    """`owner_loops` and the owners' loops that producers already inlined merge with them
    (`groups`, _merged_groups): lowering makes one loop of each such group, so two owners can
    meet in it through a third (fuzz 20261608:116: y's cache inlined into eq(x, y) and into
    mean(x) * y merged the output's loop with eq's, and x's cache, inlined into eq and into the
    sum, then merged eq's with the sum's, putting the output inside the loop of the sum it
    reads)."""
    merged, grown = set(owner_loops), True
    while grown:
        grown = False
        for g in groups:
            if g & merged and not g <= merged:
                merged |= g
                grown = True
    return merged


def _merged_groups(fusion, tv: TensorView, graph: IdGraph) -> list:
    """The owners' loops each loop j of a placed producer (other than tv) joins, below its
    compute-at position, where that is more than one loop."""
    return [g for t in fusion.tensors() if t is not tv and not t.is_input()
            for j in range(t.compute_at_pos)
            for g in (_owner_loops(fusion, t, j, graph),) if len(g) > 1]


def _reader_inside_reduction(fusion, owner_loops: set):
    """(a, b) of owners whose loops would be one, the loop a reduction axis of a, where b needs
    a's result (complete only after the loop), or None."""
    for a, d in owner_loops:
        if not a.domain.loop[d].is_reduction:
            continue
        for b, _ in owner_loops:
            if b is not a and a in upstream(fusion, b):
                return a, b
    return None


def _materialized_broadcast(owner_loops: set):
    """(owner, the owner whose loop it joins) where merging the loops would make a register or
    shared tensor hold its broadcast dim across another owner's loop over an iteration dim
    that the tensor would be allocated over, or None. An own loop is allocated
    (allocation.py): once merged, the broadcast takes the loop's extent.
    - A runtime extent: a register buffer of runtime size, computed in every iteration of a
      loop that may run zero times in a block (rows split over the blocks) while its consumers
      outside the loop read it: a weight [1, 1] cast once and read both by the rows of a norm
      backward and by its column sum (a squeeze), fuzz 20261203:3622.
    - A constant extent above one: correct, but the per-row value is computed and held once
      per element of the row. Cross-entropy's loss (logsumexp minus the target's logit,
      [M, 1], squeezed to the output) shared loops with dlogits through the target, broadcast
      to both: the looped kernel gathered the target's logit and took a log 128 times per
      thread into a 128-float register buffer, and spilled 1.4 KB.
    Kept in loops of its own, it is computed once before them."""
    iterating = [(o, p) for o, p in owner_loops if not o.domain.loop[p].is_broadcast]
    for o, p in owner_loops:
        i = o.domain.loop[p]
        if not i.is_broadcast or i.expanded_extent is not None:
            continue
        if o.memory_type == MemoryType.Global or _unallocated(o, i.parallel_type):
            continue
        for a, q in iterating:
            j = a.domain.loop[q]
            if j.extent.value is None or (
                    j.extent.value > 1 and not _unallocated(o, j.parallel_type)):
                return o, a
    return None


def _unallocated(tv: TensorView, pt: ParallelType) -> bool:
    """Whether tv is not allocated over a loop of parallel type pt (allocation.py): registers
    are per thread, shared memory per block, and a grid-stride loop's index is not held."""
    return pt == ParallelType.GridStride or (
        tv.memory_type == MemoryType.Local and pt.is_thread_or_block) or (
        tv.memory_type == MemoryType.Shared and pt.is_block_dim)


def _mixed_parallel_types(owner_loops: set):
    """((a, a's parallel type), (b, b's)) of two owners' loops that lowering would have to merge
    but cannot, being of different parallel types (context._merge_nests), or None. A serial
    loop over a broadcast runs once and merges with any. An index tensor of one element, read
    by a gather and by an add broadcast over the gather's columns, had its cache inlined into
    the gather's vectorized loop and the add's serial one (fuzz 20264000:2900)."""
    typed = [(o, o.domain.loop[d].parallel_type) for o, d in sorted(
        owner_loops, key=lambda od: (od[0].name, od[1]))
        if not (o.domain.loop[d].parallel_type == ParallelType.Serial
                and o.domain.loop[d].is_broadcast)]
    for (a, pa), (b, pb) in zip(typed, typed[1:]):
        if pa != pb:
            return (a, pa), (b, pb)
    return None


def _dependent_owners(fusion, owners: set, loop_id, graph: IdGraph):
    """A pair (a, b) of the owners where b needs a's result through a tensor computed outside
    the merged loop (the loop of `loop_id`), or None. Outside: in a loop of its own (neither
    one of the owners' nor inlined into one), or inlined into a consumer's loops above the
    merged one (a squeeze of the merged loop's dim, fuzz 20261124:3145). Tensors without loops
    (rank 0) are placed inside the merged loop by lowering (context._sink_loopless): paths
    through those and through tensors inlined inside the loop keep one loop."""
    for a in owners:
        for b in owners:
            if b is not a and _needs_through_own_loops(fusion, a, b, owners, loop_id, graph):
                return a, b
    return None


def _needs_through_own_loops(fusion, a, b, owners, loop_id, graph: IdGraph) -> bool:
    upstream_of_b = upstream(fusion, b)
    stack, seen = list(fusion.consumers(a)), set()
    while stack:
        x = stack.pop()
        if x in seen or x is b or x in owners or x not in upstream_of_b:
            continue
        seen.add(x)
        loops = len(x.domain.loop)
        if loops and x.compute_at_pos < loops:
            return True
        if loops and not any(graph.mapped(i, loop_id) for i in x.domain.loop):
            return True
        stack.extend(fusion.consumers(x))
    return False


def _same_in_every_lane(tv: TensorView, c: TensorView, axis, graph: IdGraph) -> bool:
    """Whether tv, an operand of gather c other than its source (the index, or what computes
    it), holds one value for all lanes of c's Vectorize `axis`: tv lacks the dim the lanes
    step through, or broadcasts it (an embedding's ids along the row). Computed inside the
    vector loop, its ops then run once per vector (lower/vectorize.py), where a loop of its own
    would hold an index per lane for the vector read to pick from."""
    from ..ir.exprs import GatherOp
    e = c.definition
    if axis.parallel_type != ParallelType.Vectorize or not isinstance(e, GatherOp) \
            or tv is e.src:
        return False
    stepped = c.domain.dim_stepped_by(axis)
    return stepped is not None and not any(
        graph.mapped(i, stepped) for i in tv.domain.logical if not i.is_broadcast)


def max_inline_position(tv: TensorView, graph: IdGraph | None = None) -> tuple[int, str]:
    """The deepest legal compute-at position of tv, and why it stops there. Reads the
    consumers' compute-at positions: decide consumers first (inline_most does)."""
    fusion = tv.fusion
    if tv.is_input():
        return 0, "fusion inputs are not computed"
    consumers = fusion.consumers(tv)
    if not consumers:
        return 0, "no consumer"
    graph = graph or IdGraph(fusion, permissive=True)
    blocked = _persistent_limits(fusion, tv, graph)
    scanned = tv.definition.scanned_ids() if isinstance(tv.definition, ScanOp) else ()
    selected = (tv.definition.selected_ids(tv) if isinstance(tv.definition, TopKOp) else ())
    n = len(tv.domain.loop)
    groups = None
    for k in range(n):
        i = tv.domain.loop[k]
        if i.is_reduction:
            return k, f"axis {k} is a reduction: consumers need its result complete"
        if i in scanned and not i.parallel_type.is_block_dim:
            return k, (f"axis {k} runs along T{tv.name}'s scan: consumers need its result "
                       "complete (the block scan and the prefix come after its loops)")
        if i in selected:
            return k, (f"axis {k} runs along T{tv.name}'s top-k: consumers need all k elements "
                       "(the block top-k writes them before their loops)")
        if i.parallel_type in _UNINLINABLE:
            return k, f"axis {k} is {i.parallel_type.short}: it must stay an own loop of T{tv.name}"
        if isinstance(tv.definition, IndexCheckOp) and all(
                j.is_broadcast and j.expanded_extent is None for j in tv.domain.loop[k:]):
            # The check of an index broadcast along the loops from here on (a scatter's
            # one-hot target along the row) runs once, before them: inside, every element
            # repeated it and its error report, a call that ptxas spilled around (1.7 KB in the
            # looped cross-entropy at 32 registers).
            return k, (f"axis {k} on, T{tv.name} checks one index broadcast along its "
                       "consumers' loops: checked once, outside them")
        if i in blocked:
            return k, (f"axis {k} maps to a reduction whose result T{tv.name}'s other consumers "
                       f"need; T{tv.name} stays resident across it")
        skips, owner_loops = {}, set()
        for c in consumers:
            pos = match_loops(tv, c, k + 1, graph)
            if pos is None:
                return k, f"axis {k} maps to no loop of consumer T{c.name} in order"
            ci = c.domain.loop[pos[-1]]
            if ci.parallel_type in _UNINLINABLE and not _same_in_every_lane(tv, c, ci, graph):
                return k, f"axis {k} maps to a {ci.parallel_type.short} axis of consumer T{c.name}"
            # Depth in the loops that are really there: a consumer itself computed inside its
            # consumer's loops (ge(w) inside the rows that broadcast it) has its loop at that
            # consumer's depth, not at its own.
            loops = _owner_loops(fusion, c, pos[-1], graph)
            for d in {d for _, d in loops}:
                skips[(c, d)] = d - k
            owner_loops |= loops
        owners = {o for o, _ in owner_loops}
        if len(set(skips.values())) > 1:
            # A consumer computes tv inside loops over dims tv lacks (the rows around a weight
            # broadcast to [M, N]) that another consumer does not have (the weight's own output
            # w * 2 [N]): tv cannot be computed in one place inside both.
            ((a, _), sa), ((b, _), sb) = sorted(skips.items(), key=lambda x: x[1])[::len(skips) - 1]
            return k, (f"axis {k} is inside {sb} loop(s) of consumer T{b.name} over dims "
                       f"T{tv.name} lacks, and inside {sa} of consumer T{a.name}: consumers at "
                       "different depths")
        if len(owners) > 1:
            # Computed inside two consumers' own loops, tv makes lowering merge them into one.
            # When one loop's tensor needs the other's through tensors computed outside both
            # (the vector staging of a [1, M, N] output y that mul(x, sigmoid(y)) reads, x
            # inlined into both), the merged loop would need its own result: keep this loop
            # tv's own. Thread and block loops too: lowering orders them as scopes, as it does
            # serial loops (an all-broadcast softmax-like chain of x [1, 1]: fuzz 20261127:1975).
            # With the loops producers placed before merged into them (one owner alone merges
            # nothing new, so only here; the producers' positions are fixed while tv's are
            # tried, so their groups are found once).
            if groups is None:
                groups = _merged_groups(fusion, tv, graph)
            merged = _merged_with(owner_loops, groups)
            owners = {o for o, _ in merged}
            pair = _reader_inside_reduction(fusion, merged)
            if pair is not None:
                return k, (f"axis {k} would put T{pair[1].name} inside T{pair[0].name}'s "
                           f"reduction loop, and T{pair[1].name} needs T{pair[0].name}'s result")
            pair = _dependent_owners(fusion, owners, i, graph)
            if pair is not None:
                return k, (f"axis {k} would merge the own loops of T{pair[0].name} and "
                           f"T{pair[1].name}, and T{pair[1].name} needs T{pair[0].name}'s "
                           "result")
            mixed = _mixed_parallel_types(merged)
            if mixed is not None:
                (a, pa), (b, pb) = mixed
                return k, (f"axis {k} would merge T{a.name}'s {pa.short} loop with "
                           f"T{b.name}'s {pb.short} loop: lowering merges loops of one "
                           "parallel type")
            pair = _materialized_broadcast(owner_loops)
            if pair is not None:
                return k, (f"axis {k} would merge an own broadcast loop of T{pair[0].name} "
                           f"({pair[0].memory_type.name.lower()}) into T{pair[1].name}'s loop "
                           f"over a runtime extent: T{pair[0].name} would be computed and held "
                           "in every iteration")
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
    # Consumers first: a producer's limit depends on where its consumers are computed.
    order = {t: k for k, t in enumerate(fusion.tensors())}
    for tv in sorted(targets, key=lambda t: order.get(t, -1), reverse=True):
        if tv.is_input():
            continue
        siblings = tv.siblings
        if len(siblings) > 1:
            # One expression computes them all in one place (a top-k's values and indices):
            # the shallowest of the positions of those with consumers (one left dead by the
            # fusion follows the others).
            live = [max_inline_position(t, graph)[0] for t in siblings
                    if fusion.consumers(t)]
            p = min(live, default=0)
        else:
            p, _ = max_inline_position(tv, graph)
        _set_position(tv, p)


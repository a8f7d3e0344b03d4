"""Replaying loop transforms across a fusion, and copying parallelization.

A scheduler transforms one reference tensor and propagates: every other tensor replays the
reference's Split/Merge history on the IDs that map to the reference's. Propagation walks a
spanning tree of the producer/consumer graph that keeps as many mapped IDs as possible along each
path (Prim's algorithm on "how many IDs survive this edge"), so that, for example, the broadcast
tensor of a norm is reached through the full-rank tensor it feeds rather than through the
reduction that lost the row dimension.
"""
from __future__ import annotations

import heapq
import itertools

from ..ir import scalar as S
from ..ir.id_graph import IdGraph, producer_consumer_pairs
from ..ir.iter_domain import (Merge, Split, ancestors, id_exprs_between, merge_ids,
                              merged_iter_type, replayed_divisible, split_id)
from ..ir.tensor import ParallelType, TensorView


def _neighbours(fusion, tv: TensorView, tensors: set):
    """(neighbour, id map from tv's IDs to the neighbour's, tv's start domain) per edge.
    `tensors` are the fusion's tensors."""
    out = []
    d = tv.definition
    if d is not None and d in set(fusion.exprs()):
        for p in d.inputs:
            if isinstance(p, TensorView):
                pairs = producer_consumer_pairs(d, p, tv)
                out.append((p, {c: q for q, c in pairs}, "root"))
    for e in fusion.uses_of(tv):
        for c in e.outputs:
            if isinstance(c, TensorView):
                pairs = producer_consumer_pairs(e, tv, c)
                out.append((c, {q: ci for q, ci in pairs}, "logical"))
    # A recomputed copy and its original (schedule/recompute.py) iterate the same dims, root
    # ID for root ID: the copy of a broadcast [N] -> [N, 1] reaches the new dim only this way.
    twins = [t for t in (tv.recompute_of,) if t is not None and t in tensors]
    twins += [t for t in tensors if t.recompute_of is tv]
    # The other outputs of tv's expression (a top-k's indices beside its values): the same dims.
    twins += [t for t in tv.siblings if t is not tv and t in tensors]
    for t in twins:
        out.append((t, dict(zip(tv.domain.maybe_root, t.domain.maybe_root)), "twin"))
    return out


def replay(src: TensorView, dst: TensorView, src_to_dst: dict, src_start: str) -> None:
    """Give dst a loop domain replaying src's transforms on the IDs `src_to_dst` maps.

    src_start says where src's mapped IDs are: "root" (dst is src's producer), "logical" (dst
    is src's consumer) or "twin" (dst and src are a tensor and its recomputed copy: root to
    root). dst's loop is rebuilt from its own root/logical IDs; IDs of dst that map to nothing
    in src (e.g. a reduction ID its consumer lacks) keep their order at the end.
    """
    if dst.compute_at_pos or dst.max_producer_pos:
        return
    start = src.domain.logical if src_start == "logical" else src.domain.maybe_root
    dst_start = dst.domain.logical if src_start == "root" else dst.domain.maybe_root
    m = dict(src_to_dst)
    if src_start == "logical":
        # src's loop may derive from a root ID that one of its logical IDs only forwards
        # (a reshape of [1, N, 1] to [N] merges broadcasts into N, and src was scheduled from
        # its root): that root ID stands for the logical one here.
        for lid, rid in forwarded_roots(src).items():
            if lid in m:
                m.setdefault(rid, m[lid])
    leaves = list(dst_start)
    # dst reached on its root side (a reshape output from its input): a transform its own root
    # -> logical history already makes is taken from there, so that its loop derives from its
    # logical domain, which its consumers map to (a second merge of the same root IDs would
    # leave them nothing to replay).
    own = ({} if src_start == "root" or dst.domain.root is None else
           {_transform_key(x): x for x in id_exprs_between(dst_start, dst.domain.logical)})
    dst.domain.loop = _replay_leaves(src, m, leaves, src_start, own)


def _replay_leaves(src: TensorView, m: dict, leaves: list, src_start: str, own: dict) -> list:
    """The leaves `leaves` become when src's transforms are replayed on the IDs `m` maps src's
    IDs to (m is extended in place), ordered as src's loop, unmapped ones last. `own`: dst's
    own root -> logical transforms by _transform_key, reused instead of made again."""
    start = src.domain.logical if src_start == "logical" else src.domain.maybe_root
    leaves = list(leaves)
    for e in id_exprs_between(start, src.domain.loop):
        if isinstance(e, Split):
            d_in = m.get(e.in_id)
            if d_in is None or d_in not in leaves:
                continue
            same = own.get(("split", d_in, S.scalar_str(e.factor), e.inner_split))
            o, i = same.outputs if same is not None else split_id(
                d_in, e.factor, e.inner_split, replayed_divisible(e, d_in))
            k = leaves.index(d_in)
            leaves[k:k + 1] = [o, i]
            m[e.outer], m[e.inner] = o, i
        elif isinstance(e, Merge):
            a, b = m.get(e.outer), m.get(e.inner)
            a = a if a in leaves else None
            b = b if b in leaves else None
            if a is not None and b is not None and merged_iter_type(a, b) is not None:
                same = own.get(("merge", a, b))
                out = same.out if same is not None else merge_ids(a, b)
                k = min(leaves.index(a), leaves.index(b))
                leaves = [x for x in leaves if x is not a and x is not b]
                leaves.insert(k, out)
                m[e.out] = out
            elif a is not None or b is not None:
                # dst lacks one side (a broadcast or reduction ID): forward the other.
                m[e.out] = a if a is not None else b
    ordered = []
    for s in src.domain.loop:
        d = m.get(s)
        if d is not None and d in leaves and d not in ordered:
            ordered.append(d)
    ordered += [x for x in leaves if x not in ordered]
    return ordered


def forwarded_roots(tv: TensorView) -> dict:
    """For the root -> logical history of tv (a reshape), each ID that iterates exactly what
    one root ID does (merged only with broadcasts: IdGraph's broadcast forwarding) -> that root
    ID."""
    from ..ir.id_graph import forwards_to
    if tv.domain.root is None:
        return {}
    alias = {}
    for e in id_exprs_between(tv.domain.root, tv.domain.logical):
        if isinstance(e, Merge):
            for b, other in ((e.outer, e.inner), (e.inner, e.outer)):
                if forwards_to(b, other):
                    alias[e.out] = alias.get(other, other)
                    break
    roots = set(tv.domain.root)
    return {i: r for i, r in alias.items() if r in roots}


def _transform_key(e) -> tuple:
    if isinstance(e, Split):
        return ("split", e.in_id, S.scalar_str(e.factor), e.inner_split)
    return ("merge", e.outer, e.inner)


def _reference_info(tv: TensorView, side_info: dict, side: str) -> dict:
    """Which reference IDs each root and logical ID of tv carries, given them on one side.

    `side_info` maps IDs of tv's root ("root") or logical ("logical") domain to sets of
    reference IDs; the other side is derived through tv's root -> logical transforms.
    """
    root = tv.domain.maybe_root
    info = {i: frozenset(v) for i, v in side_info.items()}
    for lid in tv.domain.logical:
        anc = ancestors(lid, root)
        if side == "root":
            info[lid] = frozenset().union(*(info.get(a, frozenset()) for a in anc))
        else:
            for a in anc:
                info[a] = info.get(a, frozenset()) | info.get(lid, frozenset())
    return info


def _edge_info(info: dict, mapping: dict) -> dict:
    return {nb_id: info[tv_id] for tv_id, nb_id in mapping.items() if info.get(tv_id)}


def propagate_transforms(reference: TensorView, tensors=None) -> list[TensorView]:
    """Replay reference's loop transforms onto every tensor of its fusion (or `tensors`).

    Each tensor is reached along the path that keeps the most of the reference's root IDs that
    are not broadcasts, then the most of all of them (a broadcast ID mapped from a reference ID
    carries it too, so a norm's broadcast tensor is
    reached through the full-rank tensor it feeds, and its broadcast dim gets the reference's
    transforms). Returns the tensors in the order they were reached. Tensors already inlined
    keep their loops.
    """
    fusion = reference.fusion
    allowed = None if tensors is None else set(tensors) | {reference}
    counter = itertools.count()
    all_tensors = set(fusion.tensors())
    ref_root = reference.domain.maybe_root
    info = {reference: _reference_info(reference, {i: {i} for i in ref_root}, "root")}
    visited = {reference}
    order = [reference]
    heap: list = []

    def push(tv):
        for nb, mapping, start in _neighbours(fusion, tv, all_tensors):
            if nb in visited or (allowed is not None and nb not in allowed):
                continue
            carried = _edge_info(info[tv], mapping)
            ids = frozenset().union(*carried.values()) if carried else frozenset()
            # Reference dims that iterate count first: a broadcast one is a single element,
            # and a path that keeps it but loses a row dim schedules the row wrongly (an [N]
            # output of x + sum(broadcast(x, [False, True]), [0]) reached through the sum,
            # whose kept size-1 dim it broadcasts to, took that dim's loops for its N).
            # Before that, the reference dims carried by IDs of tv that iterate: a broadcast
            # ID of tv carries a reference dim only as a forwarded stand-in, and its loops are
            # that broadcast's (t * w for w [1]: reached from w's broadcast, t's dim of 100
            # took w's split of one element into 1 x 4 x 128 x 2 loops, fuzz 20261201:2331).
            solid = frozenset().union(*(info[tv][t] for t in mapping
                                        if not t.is_broadcast and info[tv].get(t)))
            score = (sum(1 for i in solid if not i.is_broadcast),
                     sum(1 for i in ids if not i.is_broadcast), len(ids))
            heapq.heappush(heap, (tuple(-x for x in score), next(counter), tv, nb, mapping,
                                  start))

    push(reference)
    while heap:
        neg, _, src, dst, mapping, start = heapq.heappop(heap)
        if dst in visited:
            continue
        visited.add(dst)
        # dst is src's producer when src's mapped IDs are its root: they land on dst's logical.
        dst_side = "logical" if start == "root" else "root"
        info[dst] = _reference_info(dst, _edge_info(info[src], mapping), dst_side)
        replay(src, dst, mapping, start)
        order.append(dst)
        push(dst)
    _complete_from_other_neighbours(fusion, order, info, allowed, all_tensors)
    return order


def _complete_from_other_neighbours(fusion, order, info, allowed, all_tensors) -> None:
    """Give the dims a tensor's tree path did not carry the transforms of another neighbour
    that carries them.

    The spanning tree reaches each tensor from one neighbour; a tensor whose dims come from
    different producers, none carrying all of them (an outer product w[1, N] * s[M, 1] of a
    row statistic s and a column vector w, fed to a column reduction), gets only its path's
    dims transformed and keeps the others whole. Its loop then matches no neighbour on those
    dims: the other producer, split and bound to threadIdx.x along N, cannot be inlined, and
    the consumer reads its registers along a serial N loop, other threads' values (fuzz
    20261205:1742). Such a dim (not a broadcast, carrying no reference ID, still a leaf of the
    loop) replays, in place, the transforms of the reference IDs a visited neighbour carries
    on the ID mapped to it; repeated until nothing changes, so that the tensors reached
    through the completed one (the column reduction) are completed too.
    """
    visited = set(order)
    changed = True
    while changed:
        changed = False
        for dst in order[1:]:
            if dst.compute_at_pos or dst.max_producer_pos:
                continue
            for lid in list(dst.domain.loop):
                if lid.is_broadcast or info[dst].get(lid):
                    continue
                if lid not in dst.domain.maybe_root and lid not in dst.domain.logical:
                    continue
                for src, mapping, start in _sources_of(fusion, dst, visited, allowed, all_tensors):
                    x = next((s for s, d in mapping.items() if d is lid), None)
                    carried = info[src].get(x) if x is not None else None
                    if not carried or all(i.is_broadcast for i in carried):
                        continue
                    new = _replay_leaves(src, {x: lid}, [lid], start, {})
                    if new == [lid]:
                        continue
                    k = dst.domain.loop.index(lid)
                    dst.domain.loop = dst.domain.loop[:k] + new + dst.domain.loop[k + 1:]
                    info[dst] = dict(info[dst])
                    info[dst][lid] = frozenset(carried)
                    changed = True
                    break


def _sources_of(fusion, dst, visited: set, allowed, all_tensors):
    """(visited neighbour, its id map to dst's IDs, its start side) per edge reaching dst."""
    out = []
    for nb, _, _ in _neighbours(fusion, dst, all_tensors):
        if nb not in visited or (allowed is not None and nb not in allowed):
            continue
        for t, mapping, start in _neighbours(fusion, nb, all_tensors):
            if t is dst:
                out.append((nb, mapping, start))
    return out


def parallelize_like(reference: TensorView, tensors=None, parallel_types=None) -> None:
    """Copy reference's parallel types to the loop IDs that map to its loop IDs.

    `parallel_types` limits which types are copied (e.g. leave Vectorize to the scheduler, which
    puts it only on the tensors that touch global memory).
    """
    fusion = reference.fusion
    graph = IdGraph(fusion, permissive=True)
    exact = IdGraph(fusion)
    tensors = fusion.tensors() if tensors is None else tensors
    loop = reference.domain.loop
    for tv in tensors:
        if tv is reference:
            continue
        for pos, i in enumerate(tv.domain.loop):
            # Of the reference's loops the permissive map reaches from i, the one at i's own
            # position where there are several (the loops are replayed from the reference's),
            # else the one that iterates exactly what i does, else the first parallel one.
            # Through broadcasts the map can reach two: a one-row statistic broadcast along
            # the columns it reduced maps the rows' split to the columns' split (fuzz
            # 20261345:1173 bound the columns' split to TIDy; its loop in the reduction is
            # serial).
            reached = [r for r in loop if graph.mapped(i, r)]
            if len(reached) > 1 and pos < len(loop) and loop[pos] in reached:
                r = loop[pos]
            else:
                r = next((r for r in reached if exact.mapped(i, r)), None) or next(
                    (r for r in reached if r.parallel_type != ParallelType.Serial
                     and (parallel_types is None or r.parallel_type in parallel_types)), None)
            if r is None or r.parallel_type == ParallelType.Serial:
                continue
            if parallel_types is not None and r.parallel_type not in parallel_types:
                continue
            i.parallel_type = r.parallel_type

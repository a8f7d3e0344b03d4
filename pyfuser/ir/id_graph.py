"""Mapping IterDomains across a fusion.

These rules define which IDs describe the same iteration:
1. producer/consumer pairs: a consumer's root ID k maps to its producer's logical ID k (reduction
   IDs of the producer skipped; new broadcast dims of a BroadcastOp and squeezed dims of a
   SqueezeOp have no partner); a library op (matmul, linear) lists its pairs in `dim_map`
   (batch, M and N dims; the contracted K has no partner);
2. replayed transforms: two Splits with mapped inputs and equal factor and kind map their outputs;
   two Merges with mapped inputs map their outputs;
3. broadcast forwarding: merge(b, i) with b a (non-expanded) broadcast of extent 1 iterates exactly
   what i iterates, so its output maps to i. This is what lets a tensor of shape [N], broadcast to
   [M, N] and scheduled like it (merge, then split), line up with its un-broadcast producer.
   In the exact graph a merge of two expanded broadcasts maps to both (`both_expanded`);
4. concretized expanded broadcasts: the consumers' iteration IDs paired with one expanded
   broadcast ID (of extent 1, expanded to E) all iterate E elements and map to one another.

The exact graph maps a broadcast ID only to broadcast IDs; the permissive graph also maps a
producer's broadcast ID to the consumer's iteration ID it broadcasts to (what replay and
parallelize-like need, and what tells which loops a broadcast tensor may share).
"""
from __future__ import annotations

from . import scalar as S
from .base import Expr
from .exprs import BroadcastOp, SqueezeOp
from .iter_domain import IterDomain, Merge, Split, id_exprs_between
from .tensor import TensorView


def forwards_to(b: IterDomain, other: IterDomain) -> bool:
    """Whether merge(b, other) (either order) iterates exactly what `other` does: b is a
    broadcast and contributes extent 1 to the merge. With an iteration ID the merge's extent
    is other's even when b is expanded (an expanded dim is one element in memory, stride 0; its
    index in the merge is 0). Of two broadcasts, a plain one merged with an expanded one
    forwards the expanded one (the merge keeps its expanded extent); two plain or two expanded
    broadcasts forward nothing, or the dims they broadcast to would meet in the permissive
    graph."""
    if not b.is_broadcast:
        return False
    if not other.is_broadcast:
        return True
    return b.expanded_extent is None and other.expanded_extent is not None


def both_expanded(a: IterDomain, b: IterDomain) -> bool:
    """Two expanded broadcasts: their merge is one element in memory, as each of them is. The
    exact graph maps the merge to both (a reduction that keeps two expanded dims, x [M(exp), K,
    E(exp)] summed over K with E squeezed from the result, lines up with its result [M(exp)]);
    the permissive graph does not, or the dims they broadcast to would meet there."""
    return (a.is_broadcast and b.is_broadcast and a.expanded_extent is not None
            and b.expanded_extent is not None)


def tensor_uses(fusion):
    """(expr, producer, consumer) for each tensor an expression reads and each tensor it
    writes, in topological order."""
    for e in fusion.exprs():
        for c in e.outputs:
            if isinstance(c, TensorView):
                for p in e.inputs:
                    if isinstance(p, TensorView):
                        yield e, p, c


def producer_consumer_pairs(expr: Expr, producer: TensorView,
                            consumer: TensorView) -> list[tuple[IterDomain, IterDomain]]:
    """(producer logical ID, consumer root ID) pairs of one expression."""
    p_ids = producer.domain.logical_no_reductions
    c_ids = consumer.domain.maybe_root
    dim_map = getattr(expr, "dim_map", None)
    if dim_map is not None:
        # A library op (matmul, linear) states which operand dims its output iterates; the
        # contracted K has no partner. An operand given twice (x @ x) pairs through each use.
        return [(p_ids[pd], c_ids[cd]) for k, operand in enumerate(expr.inputs)
                if operand is producer for pd, cd in dim_map[k]]
    if isinstance(expr, BroadcastOp):
        c_ids = [c for c, new in zip(c_ids, expr.is_broadcast_dim) if not new]
    elif isinstance(expr, SqueezeOp):
        p_ids = [p for p, sq in zip(p_ids, expr.is_squeezed) if not sq]
    if len(p_ids) != len(c_ids):
        raise AssertionError(f"{type(expr).__name__}: T{producer.name} and T{consumer.name} "
                             f"have {len(p_ids)} and {len(c_ids)} mappable dims")
    return list(zip(p_ids, c_ids))


def is_exact_pair(p: IterDomain, c: IterDomain) -> bool:
    return p.is_broadcast == c.is_broadcast


class DisjointSets:
    """Union-find over hashable items; groups keep insertion order for determinism."""

    def __init__(self):
        self._parent: dict = {}
        self._members: dict = {}

    def add(self, x) -> None:
        if x not in self._parent:
            self._parent[x] = x
            self._members[x] = [x]

    def find(self, x):
        p = self._parent[x]
        while p is not self._parent[p]:
            self._parent[p] = self._parent[self._parent[p]]
            p = self._parent[p]
        self._parent[x] = p
        return p

    def union(self, a, b) -> bool:
        self.add(a)
        self.add(b)
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return False
        self._parent[rb] = ra
        self._members[ra].extend(self._members.pop(rb))
        return True

    def same(self, a, b) -> bool:
        return a in self._parent and b in self._parent and self.find(a) is self.find(b)

    def members(self, x) -> list:
        return self._members[self.find(x)]

    def __contains__(self, x) -> bool:
        return x in self._parent

    def roots(self) -> list:
        return list(self._members)


class IdGraph:
    """Disjoint sets of IDs over a whole fusion (exact or permissive), with the Split/Merge
    expressions between the groups."""

    def __init__(self, fusion, permissive: bool = False, tensors: list[TensorView] | None = None,
                 transforms: bool = True):
        """`transforms=False` maps producer/consumer pairs only (rule 1): no replayed splits
        and merges, no broadcast forwarding. Its permissive form tells which iteration dims
        each broadcast dim of the fusion is broadcast to, and nothing more (forwarding maps
        merge(i, b) to i and then, replayed, to merge(i, j): the dims of b and i meet)."""
        self.permissive = permissive
        self.sets = DisjointSets()
        self.tensors = tensors if tensors is not None else fusion.tensors()
        self.id_exprs: list[Expr] = []
        seen_exprs: set = set()
        for tv in self.tensors:
            for i in tv.domain.all_ids():
                self.sets.add(i)
            starts = tv.domain.maybe_root
            for e in id_exprs_between(starts, tv.domain.logical + tv.domain.maybe_allocation
                                      + tv.domain.loop):
                if e not in seen_exprs:
                    seen_exprs.add(e)
                    self.id_exprs.append(e)
        concretized = []
        for e, p, c in tensor_uses(fusion):
            for pi, ci in producer_consumer_pairs(e, p, c):
                if permissive or is_exact_pair(pi, ci):
                    self.sets.union(pi, ci)
                elif pi.expanded_extent is not None and not ci.is_broadcast:
                    concretized.append((pi, ci))
        # Rule 4: the iteration IDs that concretize one expanded broadcast (its consumers' root
        # IDs paired with it: a reshape's, an add with a full operand's) iterate the same E
        # elements, E its expanded extent (the builders require each such extent to equal E).
        # Two reshapes of one [M, 1 ex E] tensor (a recomputed copy beside the original) thus
        # map their merges and splits exactly; the broadcast itself stays apart (its index is 0).
        first: dict = {}
        for pi, ci in concretized:
            self.sets.union(first.setdefault(self.sets.find(pi), ci), ci)
        # A recomputed copy (schedule/recompute.py) iterates what its original iterates, dim
        # for dim. Its producers map it there when the chain starts at a tensor both read; a
        # copy of a fill (full, iota, a random draw) has no tensor producer, and its iteration
        # dims would be apart from the original's: the outer persistent kernel over columns
        # only a full() gives wrote its output in loops promoted to another output's columns,
        # which it could not index from (fuzz 20261606:375, :1058). Only those: mapping the
        # new broadcast dims of other copies too changed the loops of kernels that were right.
        members = set(self.tensors)
        for tv in self.tensors:
            original = tv.recompute_of
            if original is None or original not in members or any(
                    isinstance(i, TensorView) for i in tv.definition.inputs):
                continue
            for a, b in zip(tv.domain.logical, original.domain.logical):
                if not a.is_broadcast and not b.is_broadcast:
                    self.sets.union(a, b)
        # The outputs of one expression (a top-k's values and indices) iterate the same dims,
        # dim for dim, though no producer/consumer pair joins them.
        for tv in self.tensors:
            for sib in tv.siblings:
                if sib is not tv and sib in members:
                    for a, b in zip(tv.domain.logical, sib.domain.logical):
                        self.sets.union(a, b)
        if transforms:
            self._map_replayed_transforms()

    def _forward_broadcast_merges(self) -> bool:
        changed = False
        for e in self.id_exprs:
            if isinstance(e, Merge):
                for b, other in ((e.outer, e.inner), (e.inner, e.outer)):
                    if forwards_to(b, other) or (not self.permissive
                                                 and both_expanded(b, other)):
                        changed |= self.sets.union(e.out, other)
        return changed

    def _key(self, e: Expr):
        if isinstance(e, Split):
            return ("split", self.sets.find(e.in_id), e.inner_split)
        return ("merge", self.sets.find(e.outer), self.sets.find(e.inner))

    def _map_replayed_transforms(self) -> None:
        changed = True
        while changed:
            changed = self._forward_broadcast_merges()
            buckets: dict = {}
            for e in self.id_exprs:
                buckets.setdefault(self._key(e), []).append(e)
            for group in buckets.values():
                for k, a in enumerate(group):
                    for b in group[k + 1:]:
                        if isinstance(a, Split) and not S.same_value(a.factor, b.factor):
                            continue
                        for x, y in zip(a.outputs, b.outputs):
                            if self.sets.union(x, y):
                                changed = True

    def mapped(self, a: IterDomain, b: IterDomain) -> bool:
        return self.sets.same(a, b)

    def self_merges(self) -> list[Merge]:
        """Merges of two IDs this graph maps to each other (neither a broadcast): an output
        [1, M, 1, M'] whose M' = reshape(t0 [M, 1]) is exactly M, merged into one flat loop,
        merges M with itself. Indices are derived per ID group (lower/indexing.py), which
        cannot tell the two apart: the backward step gives both the outer index."""
        memo: dict = {}
        return [e for e in self.id_exprs if isinstance(e, Merge)
                and not e.outer.is_broadcast and not e.inner.is_broadcast
                and (self.sets.same(e.outer, e.inner)
                     or self._merged_from(e.outer, memo) & self._merged_from(e.inner, memo))]

    def _merged_from(self, i: IterDomain, memo: dict) -> frozenset:
        """Groups of the dims ID i is merged from, through any ID it maps to (itself where none
        of them is a merge). Why: x [9, 8] reshaped to [72] beside y [9, 1] makes outputs
        [9, 72] whose flat merge joins the 9 with a 72 that is merge(9, 8): the same values
        twice, one step removed (fuzz 20261123:983: one row of 9 written)."""
        if i.extent.value == 1:
            return frozenset()          # one value: merging it with anything is unambiguous
        g = self.sets.find(i)
        key = id(g)
        if key in memo:
            return memo[key]
        memo[key] = frozenset([key])          # a cycle through the graph ends here
        merges = [m.definition for m in self.sets.members(i) if isinstance(m.definition, Merge)]
        if not merges:
            return memo[key]
        out = set()
        for e in merges:
            for x in (e.outer, e.inner):
                if not x.is_broadcast:
                    out |= self._merged_from(x, memo)
        memo[key] = frozenset(out)
        return memo[key]

    def group(self, i: IterDomain):
        return self.sets.find(i)

    def members(self, i: IterDomain) -> list[IterDomain]:
        return self.sets.members(i)


def match_loops(producer: TensorView, consumer: TensorView, count: int,
                graph: IdGraph) -> list[int] | None:
    """Positions in consumer.loop of producer.loop[0:count], or None if they do not line up.

    Producer loop j must map to a consumer loop at a position after the previous match. The
    consumer may have loops in between that map to nothing of the producer (the new dims of a
    broadcast, e.g. the row loop around a weight vector); the producer is computed inside them.
    """
    from .iter_domain import ancestors
    p_ids = producer.domain.all_ids()
    c_roots = consumer.domain.maybe_root
    out: list[int] = []
    x = 0
    c_loop = consumer.domain.loop
    for j in range(count):
        pj = producer.domain.loop[j]
        while x < len(c_loop):
            cx = c_loop[x]
            if graph.mapped(pj, cx):
                break
            # Only loops over dims the producer lacks altogether (a broadcast's new dims) can be
            # skipped: a loop derived from a dim the producer has, split differently, cannot.
            if any(graph.mapped(r, q) for r in ancestors(cx, c_roots) for q in p_ids):
                return None
            x += 1
        if x == len(c_loop):
            return None
        out.append(x)
        x += 1
    return out


def reshape_cycle(graph: IdGraph, tensors) -> str | None:
    """The first tensor a dim of whose reshape (or other root -> logical transform) the exact
    `graph` maps onto a dim it was made from, as a sentence; None when there is none.

    x [a, b, n] reshaped to [a * b * n] and broadcast back beside x maps n onto a * b * n: the
    fusion only runs where a * b == 1. The index of such a dim would be defined through itself,
    so no kernel can be lowered; the fusion runs elsewhere (the reference evaluator)."""
    from .iter_domain import ancestors
    for tv in tensors:
        root = tv.domain.root
        if root is None:
            continue
        for i in tv.domain.logical:
            if i in root or i.is_broadcast:
                continue
            # Merged with broadcasts only (x [1, K, 1] flattened to [K]), the dim is K: mapped
            # onto it rightly. Made from two iteration dims, it is their product.
            made_from = [a for a in ancestors(i, root) if not a.is_broadcast]
            if len(made_from) < 2:
                continue
            for a in made_from:
                if graph.mapped(a, i):
                    return (f"T{tv.name}'s dim {i!r} maps onto {a!r}, one of the dims it is "
                            "made from (a reshape whose other dims the fusion needs to be 1)")
    return None


def self_mapping(graph: IdGraph, tensors) -> str | None:
    """The first tensor two of whose dims (root or logical, not broadcasts) the exact `graph`
    maps onto each other, as a sentence; None when there is none.

    Such a tensor is one input read in two roles (x[:, None] * x[None, :]: the two output dims
    both line up with x's dim): every loop, inlining and index decision would take its two dims
    for one. schedule/roles.py separates the roles before scheduling."""
    for tv in tensors:
        for kind, ids in (("root", tv.domain.maybe_root), ("logical", tv.domain.logical)):
            seen: dict = {}
            for d, i in enumerate(ids):
                if i.is_broadcast:
                    continue
                g = graph.group(i)
                if g in seen:
                    return (f"T{tv.name}'s {kind} dims {seen[g]} and {d} ({i!r}) map to each "
                            "other: one tensor read in two roles")
                seen[g] = d
    return None

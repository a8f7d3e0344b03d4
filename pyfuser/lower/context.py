"""What every lowering pass needs to know about the scheduled fusion: ID graphs and loops.

Loops. A tensor T inlined at position k into consumer D is computed inside D's loops up to the
one matching T.loop[k-1] (match_loops); its loops from k on are its own. So the loop nest of T's
expression is nest(T) = nest(D)[:matched + 1] + own loops of T, computed consumers first. A loop
is identified by the tensor that owns it, which is the most downstream tensor computed in it.

Promotion. Each loop has a promoted IterDomain: the ID whose index the loop variable is. A shared
loop is promoted to its owner's ID. An own loop of T is promoted to the matching ID of the tensor
that owns T's innermost shared loop when there is one: e.g. a weight vector w[N] broadcast to
[M, N] and scheduled like the output (merge, split) has loops whose flat index runs over M*N; only
the output's own IDs tell the index of w (the flat index modulo N). A broadcast never stands for
an iteration: when a tensor is inlined into two consumers (rstd [M, 1] into the normalized row
[M, N] and into the rstd output), their loops merge into the one promoted to the iteration ID,
and own loops are not promoted to a broadcast. A loop promoted to a broadcast runs once (nothing
indexes it, whatever extent a split gave it). More generally merged loops keep the one covering
the most iteration dims: an [M, 1] output's flat loop (merge(M, b) covers M) merges into the
[M, N] output's (merge(M, N)); once loops are merged, own loops are promoted again against the
tensor that now owns the loops around them.
"""
from __future__ import annotations

import dataclasses

from ..ir import scalar as S
from ..ir.dtype import DataType
from ..ir.exprs import BroadcastOp, LoadStoreOp
from ..ir.id_graph import IdGraph, match_loops, reshape_cycle, self_mapping
from ..ir.iter_domain import (IterDomain, ParallelType, Split, ancestors, history,
                              replayed_divisible, split_id)
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K


_ONE = S.as_scalar(1, DataType.Int)
# Loop kinds an own broadcast loop runs once in, whatever loop it lines up with, and the
# expressions whose own loops still take it: copies (_promote).
_ONCE_WHEN_BROADCAST = (ParallelType.Serial, ParallelType.Unroll, ParallelType.Unswitch)
_COPIES = (LoadStoreOp, BroadcastOp)


class LoweringError(RuntimeError):
    """The schedule cannot be lowered; the message says which tensor and why."""


@dataclasses.dataclass(eq=False)
class Loop:
    owner: TensorView
    position: int
    promoted: IterDomain
    var: K.KExpr = None

    @property
    def id(self) -> IterDomain:
        return self.owner.domain.loop[self.position]

    @property
    def parallel(self) -> ParallelType:
        pt = self.id.parallel_type
        if pt == ParallelType.GridStride and self.extent is _ONE:
            # A grid-stride loop promoted to a broadcast runs once in every block, as a block
            # loop promoted to one does (the cache of a one-row input [1, N], its row dim
            # scheduled like the rows', loaded before the persistent row loop). Started at
            # blockIdx.x, it would run in block 0 only: the other blocks' registers unwritten.
            return ParallelType.Serial
        return pt

    @property
    def extent(self):
        # A loop promoted to a broadcast iterates nothing any tensor in it indexes (a broadcast's
        # index is always 0, however the schedule split it: bS{1} split by 4 makes bS{4}): it
        # runs once, and a buffer allocated over it holds one element.
        if self.promoted.is_broadcast and self.promoted.expanded_extent is None:
            return _ONE
        return self.promoted.extent

    def __repr__(self):
        return f"Loop(T{self.owner.name}.{self.position} {self.promoted!r})"


class LoweringContext:
    def __init__(self, fusion):
        self.fusion = fusion
        self.exprs = fusion.exprs()
        self.tensors = fusion.tensors()
        self.topo_index = {tv: k for k, tv in enumerate(self.tensors)}
        self.exact = IdGraph(fusion, permissive=False, tensors=self.tensors)
        self.permissive = IdGraph(fusion, permissive=True, tensors=self.tensors)
        # Two dims of one tensor mapped onto each other (one input read in two roles) would get
        # one loop and one index for both: a wrong kernel, so none.
        why = self_mapping(self.exact, self.tensors)
        if why is not None:
            raise LoweringError(f"{why}; the roles must be separated before scheduling "
                                "(schedule/roles.py scheduling_clone)")
        why = reshape_cycle(self.exact, self.tensors)
        if why is not None:
            raise LoweringError(f"{why}; no scheduler should have taken it (registry.choose)")
        self.nests: dict[TensorView, list[Loop]] = {}
        # (tensor, loop position) -> the Loop that position runs in.
        self.loop_of: dict[tuple, Loop] = {}
        self._loop_count = 0
        self._merged: dict[int, Loop] = {}
        # (ID, factor, kind) -> the outputs of that split of the ID, replayed for promotion.
        self._replays: dict = {}
        # Register tensors without loops computed inside loops whose values are read after
        # them: allocated at the top of the kernel (_sink_loopless).
        self.hoisted: set = set()
        self._build_nests()
        self._canonicalize()
        self._promote_after_merges()
        self._sink_loopless()
        # Filled by the passes, in PIPELINE order:
        self.names: dict = {}            # params: runtime Scalar -> kernel expression
        self.buffers: dict = {}          # params, allocate: TensorView -> kir Buffer
        self.strides: dict = {}          # params, allocate: global TensorView -> stride exprs
        self.alloc_ids: dict = {}        # allocate: TensorView -> (ID, extent, Loop) per dim
        self.row_pad: dict = {}          # allocate: TensorView -> (first row dim, padding)
        self.reduction_sites: list = []  # lower_reductions: (TensorView, [Block/GridReduce])
        self.grid_reduced: dict = {}     # lower_reductions: TensorView -> its grid-reduced dims
        self.index_graph = None          # index_and_predicate: IndexGraph over the exact graph
        self.kernel_parallel: dict = {}  # index_and_predicate: ParallelType -> bound extents
        self.broadcast_partners = None   # index_and_predicate: permissive pairs-only IdGraph
        self.extent_multiples: dict = {} # params: repr of an extent -> a multiple it is
        # index_and_predicate: the gathers' index checks, and the error record and its host
        # report (global buffers) when there are any.
        self.index_checks: list = []
        self.index_error = None
        self.index_report = None

    # Loops -----------------------------------------------------------------------------------
    def _computed(self) -> list[TensorView]:
        out = []
        for e in self.exprs:
            for o in e.outputs:
                if isinstance(o, TensorView):
                    out.append(o)
        return out

    def _build_nests(self) -> None:
        for tv in reversed(self._computed()):
            if tv in self.nests:
                continue
            siblings = tv.siblings
            nest = self._nest_of(siblings[0], siblings)
            for t in siblings:
                self.nests[t] = nest

    def _nest_of(self, tv: TensorView, siblings: list) -> list[Loop]:
        """Loops of tv's expression: its consumers' loops it is inlined in, then its own. The
        other outputs of its expression (`siblings`, tv first: a top-k's indices) share them:
        their consumers count as tv's, and their loops are tv's (one loop domain shape, one
        compute-at position: inlining.inline_most keeps siblings together)."""
        ca = tv.compute_at_pos
        for t in siblings[1:]:
            if t.compute_at_pos != ca or len(t.domain.loop) != len(tv.domain.loop):
                raise LoweringError(f"T{t.name} and T{tv.name}, outputs of one expression, are "
                                    "computed at different positions or over different loops")
        outer: list[Loop] = []
        if ca > 0:
            chosen = None
            for d in [c for t in siblings for c in self.fusion.consumers(t)]:
                if d not in self.nests:
                    raise LoweringError(f"T{tv.name} is inlined into T{d.name}, which is not computed")
                pos = match_loops(tv, d, ca, self.permissive)
                if pos is None:
                    raise LoweringError(f"T{tv.name}'s first {ca} loops do not line up with the "
                                        f"loops of consumer T{d.name}")
                # Consumer loop positions name loops through loop_of: d's nest may hold outer
                # loops d has no axis for (the rows around a broadcast weight).
                mapping = [self._find(self.loop_of[(d, p)]) for p in pos]
                d_nest = [self._find(lp) for lp in self.nests[d]]
                cand = d_nest[:d_nest.index(mapping[-1]) + 1]
                if chosen is None:
                    chosen = (cand, mapping, d)
                elif cand != chosen[0]:
                    self._merge_nests(tv, chosen, cand, d)
            outer, mapping, _ = chosen
            for j, lp in enumerate(mapping):
                for t in siblings:
                    self.loop_of[(t, j)] = lp
                    self._check_parallel(t, j, lp)
        own = []
        ref = outer[-1].owner if outer else None
        start = outer[-1].position + 1 if outer else 0
        for j in range(ca, len(tv.domain.loop)):
            promoted, start = self._promote(tv, tv.domain.loop[j], ref, start)
            lp = Loop(tv, j, promoted)
            for t in siblings:
                self.loop_of[(t, j)] = lp
            own.append(lp)
        return outer + own

    # Merging sibling loops ---------------------------------------------------------------------
    def _find(self, lp: Loop) -> Loop:
        while id(lp) in self._merged:
            lp = self._merged[id(lp)]
        return lp

    def _merge_nests(self, tv, chosen, cand, d) -> None:
        """tv is inlined into two consumers with separate loops (e.g. two outputs of a
        normalization, y and the residual sum): their loops around tv become one loop each."""
        a_nest, _, a_owner = chosen
        if len(a_nest) != len(cand):
            raise LoweringError(
                f"T{tv.name} is inlined at {tv.compute_at_pos} into T{a_owner.name} and T{d.name}, "
                "whose loops differ in depth there; it cannot be computed in one place")
        for a, b in zip(a_nest, cand):
            # Merge what each loop already stands for: with three consumers in separate nests,
            # the first's loops were merged into the second's before the third comes.
            a, b = self._find(a), self._find(b)
            if a is b:
                continue
            compatible = (a.parallel == b.parallel and (
                self.permissive.mapped(a.promoted, b.promoted)
                or self.exact.mapped(a.promoted, b.promoted))) or _runs_once_serially(a) \
                or _runs_once_serially(b)
            if not compatible:
                raise LoweringError(
                    f"T{tv.name} is inlined into T{a_owner.name} and T{d.name}, whose loops "
                    f"{a!r} and {b!r} differ; it cannot be computed in one place")
            keep, drop = (a, b) if self._keeps(a, b) else (b, a)
            self._merged[id(drop)] = keep

    def _keeps(self, a: Loop, b: Loop) -> bool:
        """Whether merged loop a stands for b too. The loop that iterates more dims keeps: one
        promoted to an iteration ID over one promoted to a broadcast (a statistic's [M, 1]
        output beside the row it normalizes), the flat loop over [M, N] over the flat loop of an
        [M, 1] output whose merge with its broadcast dim was replayed from it (that loop covers
        M only). The other way round the wider loop's indices are lost. Otherwise the most
        downstream owner keeps."""
        da, db = self._iterated_dims(a.promoted), self._iterated_dims(b.promoted)
        if da != db and (da >= db or db >= da):
            return da > db
        return self.topo_index[a.owner] >= self.topo_index[b.owner]

    def _iterated_dims(self, i: IterDomain) -> frozenset:
        """The exact groups of the iteration (not broadcast) dims that ID i's history covers."""
        return frozenset(self.exact.group(x) for x in history(i)
                         if x.definition is None and not x.is_broadcast)

    def _canonicalize(self) -> None:
        for tv, nest in self.nests.items():
            self.nests[tv] = [self._find(lp) for lp in nest]
        for key, lp in self.loop_of.items():
            self.loop_of[key] = self._find(lp)

    def _promote_after_merges(self) -> None:
        """Promote own loops again once sibling loops are merged: a tensor's shared loops may now
        be another tensor's (the [M, 1] output's loops became those of the [M, N] output beside
        it), and its own loops stand for the matching IDs of that tensor, or the index of its
        inner loop would not combine with the outer ones. Repeated until stable, since a loop
        promoted to another tensor's ID takes that ID's own promotion (promotions follow
        consumers, so a pass per tensor is enough)."""
        computed = self._computed()
        for _ in range(len(computed) + 1):
            changed = False
            for tv in reversed(computed):
                ref, start = None, 0
                for j in range(len(tv.domain.loop)):
                    lp = self.loop_of[(tv, j)]
                    if j < tv.compute_at_pos or lp.owner is not tv:
                        ref, start = lp.owner, lp.position + 1
                        continue
                    if ref is None:
                        continue
                    promoted, start = self._promote(tv, tv.domain.loop[j], ref, start)
                    if promoted is not lp.promoted:
                        lp.promoted = promoted
                        changed = True
            if not changed:
                return
        raise LoweringError("loop promotion does not settle: the merged loops' owners promote "
                            "each other's loops")

    def _sink_loopless(self) -> None:
        """Place a register tensor without loops (rank 0) inside the loops that all its
        producers and consumers run in, as far as those loops run once (_shared_once_loops).
        At
        the top of the kernel it would be computed before or after all of them, and a loop
        that both feeds and reads it would be needed twice: in an all-broadcast var_mean of
        x [1], the squeeze of (x - mean)^2 to rank 0 is read by the variance in the same
        one-iteration loop that computes x - mean. Inside a loop that runs once it is
        computed exactly once, between the two (in a loop over an expanded broadcast split
        into lanes, once per lane, each time the same value). The var of x [8, 9(expanded),
        303] over all dims keeps the expanded dim through its reductions: the squeeze to rank
        0, its product with 9 and the broadcast back are placed together in its block loop."""
        def loopless(t) -> bool:
            return (t in self.nests and not t.domain.loop and not self.nests[t]
                    and not t.is_output() and t.memory_type == MemoryType.Local)

        reducing = {id(self._find(self.loop_of[(t, j)])) for t in self._computed()
                    for j, i in enumerate(t.domain.loop) if i.is_reduction}
        done: set = set()
        for tv in self._computed():
            if tv in done or not loopless(tv):
                continue
            # The connected loopless tensors go together (a squeeze to rank 0 times the
            # extent it squeezed, then broadcast back), between the tensors with loops
            # around them.
            group, todo, near = [], [tv], []
            while todo:
                t = todo.pop()
                if t in done:
                    continue
                done.add(t)
                group.append(t)
                for n in [p for p in self.fusion.producers(t) if p in self.nests] + \
                        list(self.fusion.consumers(t)):
                    if loopless(n):
                        todo.append(n)
                    elif n not in near:
                        near.append(n)
            if not near:
                continue
            # Where the group's producers run (and the consumers inside their loops, which
            # need the group's values there); consumers outside those loops come after them
            # (the mean output of a var_mean over an expanded dim: its one-iteration loops of
            # its own follow the block loop where the sum, the squeeze and the variance run),
            # reading group values allocated at the top of the kernel.
            producers = [n for n in near if any(n in self.fusion.producers(t) for t in group)]
            anchor = producers or near
            shared = self._shared_once_loops(anchor, reducing)
            inside = [n for n in near if n not in anchor and (
                not shared or (self.nests[n][:1] == shared[:1]))]
            shared = self._shared_once_loops(anchor + inside, reducing)
            outside = [n for n in near if n not in anchor and n not in inside]
            if outside and shared:
                for t in group:
                    if any(t in self.fusion.producers(n) for n in outside):
                        self.hoisted.add(t)
            elif outside:
                shared = self._shared_once_loops(near, reducing)
            for t in group:
                self.nests[t] = list(shared)

    def _shared_once_loops(self, tensors, reducing: set) -> list:
        """The loops, outermost first, that every one of `tensors` runs in, as far as they run
        once: promoted to broadcasts; or iterating (not reducing) and of extent 1 or bound to
        a thread or block index (each thread runs its index once, as it runs the top of the
        kernel: the rank-0 squeeze of an all-broadcast x * x between the pointwise kernel's
        blockIdx.x and threadIdx.x loops that compute it and read it back, in an RMSNorm of x
        [1]: fuzz 20261603:953). Not a loop some tensor reduces over: its block reduction comes
        after the loop, and inside it the value is a thread's partial (mse_mean's division by
        the count would read it). `reducing`: the ids of those loops."""
        shared = []
        for loops in zip(*(self.nests[t] for t in tensors)):
            lp = loops[0]
            if any(x is not lp for x in loops) or not (lp.promoted.is_broadcast or (
                    id(lp) not in reducing and (lp.parallel.is_thread_or_block
                                                or S.const_value(lp.extent) == 1))):
                break
            shared.append(lp)
        return shared

    def _promote(self, tv: TensorView, i: IterDomain, ref: TensorView | None, start: int):
        """(what tv's own loop over i stands for, the next position of ref to match from)."""
        if ref is None:
            return i, start
        match = self._match(i, ref, start)
        if match is not None:
            promoted, x = match
            if (i.is_broadcast and i.expanded_extent is None
                    and (not self._static(promoted.extent) or promoted.rolled or (
                        i.parallel_type in _ONCE_WHEN_BROADCAST
                        and not isinstance(tv.definition, _COPIES)))):
                # A broadcast of the tensor's own (all its dims broadcast along the loop) holds
                # one value in every iteration: stood for a loop of runtime extent, it would
                # need a register buffer of that size (a set of a [1] input computed outside a
                # reduction's loops and read inside them: fuzz 20261376:923); stood for a
                # serial loop of a constant extent, what it computes is computed and held once
                # per iteration (cross-entropy's per-row loss, 128 floats a thread in the
                # looped kernel, its log and target gather repeated for each). Its loop runs
                # once. A copy (a cache of a per-row input, a broadcast) still takes the loop,
                # unless the loop is kept rolled (IterDomain.rolled: a buffer indexed by a
                # rolled loop would be local memory): ptxas folds its equal registers, and
                # holding the per-row rstd of an RMSNorm backward once instead slowed the
                # cluster kernel by 8-9% at [4096, 65536] (register allocation at its
                # 128-register cap: 56 B spilled; H200, session 20). Thread and vector loops
                # take the promoted extent: every thread computes the value it reads, and a
                # vector loop's width is the access's.
                return i, x + 1
            return promoted, x + 1
        replayed = self._promote_split(i, ref, start)
        if replayed is not None:
            return replayed
        return i, start

    def _static(self, extent) -> bool:
        """Whether an extent is known when the kernel is built (a constant, or made of the
        extents the kernel is specialized on)."""
        try:
            S.evaluate(extent, dict(self.fusion.static_extents))
        except Exception:
            return False
        return True

    def _match(self, i: IterDomain, ref: TensorView, start: int):
        """(what ref's loop stands for, its position) of the first loop of ref from `start` on
        that maps to i, or None. Failing that, an ID of ref that ref splits further into its
        loops from `start` on (a cache of w [1, C, 1, N] vectorized 8 wide inside the loops of
        an output [B, C, 1, N] that splits the same 8 into 2 x 4): i stands for that ID, with
        `start` still pointing at the loops made from it. Without it, i would index only its
        own tensor's IDs, which reach the row's dims only where they are ref's (exact) dims,
        not where the tensor broadcasts one ref iterates."""
        found = self._match_loop(i, ref, start)
        if found is not None:
            return found
        return self._match_split_id(i, ref, start)

    def _match_split_id(self, i: IterDomain, ref: TensorView, start: int):
        if i.is_broadcast or start >= len(ref.domain.loop):
            return None
        loops = ref.domain.loop
        for graph in (self.exact, self.permissive):
            for r in ref.domain.all_ids():
                if r in loops or r.is_broadcast or not graph.mapped(i, r) \
                        or not self._covers(ref, r, i):
                    continue
                if r.extent.value is not None and i.extent.value is not None \
                        and r.extent.value != i.extent.value:
                    continue
                # Only an ID split into loops from `start` on, and into no earlier loop.
                made = [x for x, lp in enumerate(loops) if r in ancestors(lp, [r])]
                if made and min(made) >= start:
                    return r, start - 1
        return None

    def _covers(self, ref: TensorView, r: IterDomain, i: IterDomain) -> bool:
        """Whether ID r of ref, mapped to i, iterates every dim i iterates. A permissive mapping
        alone does not say so: an output [M, R, B] with B a broadcast (of extent 1, or
        expanded: one element in memory) iterates R only in its flat row loop merge(R, B), and
        the permissive graph maps that loop, and R itself, to the merge(R, E) of a full
        [M, R, E] beside it, whose row loop promoted to either would run R times, not R * E
        (fuzz 20261336:1025). So r does not cover i where a dim i iterates is neither one r
        iterates nor more than a broadcast in ref."""
        if self.exact.mapped(i, r):
            return True
        r_iterated = {self.exact.group(x) for x in self._source_dims(r) if not x.is_broadcast}
        broadcasts = [b for b in ref.domain.logical if b.is_broadcast]
        return not any(not j.is_broadcast and self.exact.group(j) not in r_iterated
                       and any(self.permissive.mapped(b, j) for b in broadcasts)
                       for j in self._source_dims(i))

    def _source_dims(self, i: IterDomain) -> list[IterDomain]:
        """The dims ID i is split or merged from, followed through the IDs the exact graph
        maps them to: the root of a reduction's second stage is its first stage's split of the
        row, and stands for the row's dims."""
        out, seen, todo = [], set(), [i]
        while todo:
            x = todo.pop()
            g = id(self.exact.group(x))
            if g in seen:
                continue
            seen.add(g)
            d = x.definition or next((m.definition for m in self.exact.members(x)
                                      if m.definition is not None), None)
            if d is None:
                out.append(x)
            else:
                todo.extend(d.inputs)
        return out

    def _match_loop(self, i: IterDomain, ref: TensorView, start: int):
        for x in range(start, len(ref.domain.loop)):
            r = ref.domain.loop[x]
            if r.is_broadcast and not i.is_broadcast:
                continue    # a broadcast cannot tell an iteration's index
            if self.exact.mapped(i, r) or self.permissive.mapped(i, r):
                if r.extent.value is not None and i.extent.value is not None and not i.is_broadcast:
                    if r.extent.value != i.extent.value:
                        continue
                if not self._covers(ref, r, i):
                    continue
                # What ref's loop there stands for (it may be promoted further itself).
                lp = self.loop_of.get((ref, x))
                return (lp.promoted if lp is not None else r), x
        return None

    def _promote_split(self, i: IterDomain, ref: TensorView, start: int):
        """An own loop that splits further what a loop of ref iterates (the cache of an int64
        input read in 2-wide vectors inside ref's loop of 4 fp32 lanes) stands for the same
        split of that loop's ID: the split is replayed on it (one replay per ID and factor,
        shared by every tensor that splits it so), and the loop is promoted to the replay's
        output. Without it such a loop indexes only its own tensor's IDs, which reach the
        fusion's dims only through ref's loops where the tensor's IDs and ref's are the same
        (exact) iteration, not where the tensor broadcasts a dim ref iterates ([1, N] beside
        [M, N]: their flat loops differ). Returns (promoted, next start) or None. The outer
        part keeps `start` at the matched loop, so that the inner part matches it too."""
        d = i.definition
        if not isinstance(d, Split):
            return None
        match = self._match(d.in_id, ref, start)
        if match is not None:
            base, x = match
        else:
            outer = self._promote_split(d.in_id, ref, start)
            if outer is None:
                return None
            base, x = outer[0], outer[1] - (0 if d.in_id is d.in_id.definition.outer else 1)
        if base.is_broadcast and not i.is_broadcast:
            return None
        o, n = self._replayed_split(base, d)
        promoted = o if i is d.outer else n
        if match is not None and not base.is_broadcast:
            # i is that same split of an ID mapped to base: the same iteration, so the two
            # map (a register read in another loop nest over the replay finds its thread and
            # element: the shared copy of a scan's result written in its own loops).
            for g in (self.exact, self.permissive):
                if g.mapped(d.in_id, base):
                    g.sets.union(i, promoted)
        return (promoted, x) if i is d.outer else (promoted, x + 1)

    def _replayed_split(self, base: IterDomain, split) -> tuple[IterDomain, IterDomain]:
        key = (base, S.scalar_str(split.factor), split.inner_split)
        got = self._replays.get(key)
        if got is None:
            got = split_id(base, split.factor, split.inner_split,
                           replayed_divisible(split, base))
            for g in (self.exact, self.permissive):
                for new in got:
                    g.sets.add(new)
                g.id_exprs.append(got[0].definition)
            self._replays[key] = got
        return got

    def _check_parallel(self, tv: TensorView, j: int, lp: Loop) -> None:
        """tv's axis j, inside the shared loop lp, must be bound as lp is. A broadcast axis is
        exempt: it iterates one element, held by every thread, whatever binding the
        propagation gave it (a row statistic [1] right-aligned against the columns it reduced,
        inside their serial loop; fuzz 20261348:1459), as _check_same_threads exempts it."""
        if tv.domain.loop[j].is_broadcast:
            return
        mine = tv.domain.loop[j].parallel_type
        theirs = lp.parallel
        if mine != theirs and mine != ParallelType.Serial and not (
                mine == ParallelType.Unroll or theirs == ParallelType.Unroll):
            raise LoweringError(f"T{tv.name} axis {j} is {mine.short} but the loop it shares with "
                                f"T{lp.owner.name} is {theirs.short}")

    def nest(self, tv: TensorView) -> list[Loop]:
        return self.nests[tv]

    def new_loop_var(self) -> K.Var:
        v = K.Var(f"j{self._loop_count}")
        self._loop_count += 1
        return v

    def all_loops(self) -> list[Loop]:
        seen, out = set(), []
        for tv in self._computed():
            for lp in self.nests[tv]:
                if id(lp) not in seen:
                    seen.add(id(lp))
                    out.append(lp)
        return out

    def parallel_extents(self) -> dict[ParallelType, list]:
        """Extents bound to each thread/block dimension over all loops."""
        out: dict = {}
        for lp in self.all_loops():
            if lp.parallel.is_thread_or_block:
                out.setdefault(lp.parallel, []).append(lp.extent)
        return out


def _runs_once_serially(lp: "Loop") -> bool:
    """A serial loop promoted to a broadcast of one element: merged into another consumer's
    loop at its position (a thread loop over the reduced rows, where this consumer's broadcast
    took no parallel type: the mean [1, 1, N] beside (x - mean) of a var_mean over an expanded
    dim), what it computes is computed in each of that loop's iterations alike, and writes from
    it are guarded to the first (lower/index.py, redundant loops)."""
    return lp.parallel == ParallelType.Serial and lp.promoted.is_broadcast and lp.extent is _ONE

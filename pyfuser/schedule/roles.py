"""Roles: a tensor whose uses line its dims up with different dims of one consumer.

    x [N, 1];  T3[i, j] = squeeze(x)[j] - x[i]         a[N];  T4[i, j] = a[i] * a[j]

The exact ID graph maps a producer's dim to the consumer dim it lines up with, through every use.
Through the squeeze x's dim 0 lines up with T3's dim 1, through the direct operand with dim 0:
both of T3's dims land in one group (a *self mapping*). Everything that reads the graph then
takes them for one iteration: propagation replays T3's flat loop onto x as one dim, inlining
computes x once per output element, indexing gives both output dims the same index, and the
kernel writes the diagonal only (N times each) with x[i] - x[i] (fuzz triage P1).

One register value per output element cannot stand for x in both roles: each role needs its own
copy. `separate_roles` gives the use that would close such a loop its own copy of the operand's
computation, back to the fusion inputs, which it reads through *alias inputs*: a second
TensorView of the same runtime tensor (Fusion.input_aliases says which), with IDs of its own.

    Before: T1 = squeeze(T0); T2 = broadcast(T1); T3 = sub(T2, T0)        (T0 in two roles)
    After:  T1 = squeeze(T0); T2 = broadcast(T1); T3 = sub(T2, T4)        T4: alias input of T0

An alias input is an input to every scheduler (it gets its own cache and vector decision); the
kernel takes its pointer and strides from the runtime input it aliases (lower/params.py), so the
caller passes nothing more. Use `scheduling_clone`, not Fusion.clone, for a fusion to schedule.

A copy of a reduction is not made (it would recompute the reduction); a fusion whose roles
cannot be separated keeps its self mapping and `self_mapping` reports it: the registry refuses
such a fusion (the reference evaluator runs it), and lowering refuses a kernel whose fusion has
one (lower/context.py), so it can never compute a wrong result silently.
"""
from __future__ import annotations

import copy

from ..ir.base import Expr
from ..ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, GatherOp, IndexCheckOp, IotaOp,
                        LoadStoreOp, RandOp, ReshapeOp, SqueezeOp, UnaryOp, WhereOp, WindowOp)
from ..ir.id_graph import (IdGraph, is_exact_pair, producer_consumer_pairs, self_mapping,
                           tensor_uses)
from ..ir.iter_domain import Split, id_exprs_between, merge_ids, split_id
from ..ir.tensor import MemoryType, TensorDomain, TensorView

# Element-wise and data-movement ops: a copy computes the same values (from alias inputs).
_COPYABLE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp,
             ReshapeOp, FullOp, IotaOp, RandOp, WindowOp, GatherOp, IndexCheckOp)

__all__ = ["scheduling_clone", "separate_roles", "self_mapping"]


def scheduling_clone(fusion) -> tuple:
    """(clone, mapping) as Fusion.clone gives them, with the clone's roles separated: what a
    scheduler schedules. Alias inputs come after the fusion's own inputs."""
    clone, mapping = fusion.clone()
    separate_roles(clone)
    return clone, mapping


def has_shared_roles(fusion) -> bool:
    """Whether separate_roles would copy anything in `fusion` (it is left as it is): a use that
    maps two dims of one tensor onto each other."""
    return _first_conflict(fusion) is not None


def separate_roles(fusion) -> list[str]:
    """Give each use that would map two dims of one tensor onto each other its own copy of the
    operand's computation (alias inputs for the fusion inputs it reads). Returns one line per
    copy made. Leaves the fusion as it is where a copy would need a reduction's."""
    notes = []
    # Each copy removes the conflict it was made for and makes no new one (its IDs are fresh and
    # line up with the consumer's as the operand's did): at most one copy per use.
    for _ in range(sum(len(e.inputs) for e in fusion.exprs()) + 1):
        hit = _first_conflict(fusion)
        if hit is None:
            return notes
        expr, operand, consumer = hit
        made = _copy_for(fusion, operand, expr)
        if made is None:
            return notes
        notes.append(f"T{consumer.name} reads T{operand.name} in a second role: it reads copy "
                     f"T{made.name}")
    return notes


# Finding the use that closes a self mapping ------------------------------------------------------
class _Groups:
    """Union-find over IDs with, per group, the tensor dims in it: {(tensor, "root"/"logical"):
    ID}. Two different dims of one tensor in one group is a self mapping (broadcast dims
    excepted: they are index 0 whatever they map to)."""

    def __init__(self):
        self.parent: dict = {}
        self.dims: dict = {}

    def add_tensor(self, tv: TensorView) -> None:
        for kind, ids in (("root", tv.domain.maybe_root), ("logical", tv.domain.logical)):
            for i in ids:
                if i not in self.parent:
                    self.parent[i] = i
                    self.dims[i] = {}
                if not i.is_broadcast:
                    self.dims[i][(tv, kind)] = i

    def find(self, i):
        while self.parent[i] is not i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def conflicts(self, pairs) -> bool:
        """Whether uniting `pairs` would put two dims of one tensor in one group."""
        trial: dict = {}

        def tfind(r):
            while trial.get(r, r) is not r:
                r = trial[r]
            return r
        for a, b in pairs:
            ra, rb = tfind(self.find(a)), tfind(self.find(b))
            if ra is not rb:
                trial[rb] = ra
        merged: dict = {}
        for r in {self.find(x) for p in pairs for x in p}:
            merged.setdefault(tfind(r), []).append(r)
        for roots in merged.values():
            seen: dict = {}
            for r in roots:
                for key, i in self.dims[r].items():
                    if seen.setdefault(key, i) is not i:
                        return True
        return False

    def unite(self, pairs) -> None:
        for a, b in pairs:
            ra, rb = self.find(a), self.find(b)
            if ra is not rb:
                self.parent[rb] = ra
                for key, i in self.dims.pop(rb).items():
                    self.dims[ra].setdefault(key, i)


def _first_conflict(fusion):
    """(expr, operand, consumer) of the first use, in topological order, whose producer/consumer
    pairs would map two dims of one tensor onto each other; None when there is none."""
    groups = _Groups()
    for tv in fusion.tensors():
        groups.add_tensor(tv)
    for e, p, c in tensor_uses(fusion):
        pairs = [(a, b) for a, b in producer_consumer_pairs(e, p, c) if is_exact_pair(a, b)]
        if groups.conflicts(pairs):
            return e, p, c
        groups.unite(pairs)
    return None


# Copies ---------------------------------------------------------------------------------------
def _copy_for(fusion, operand: TensorView, use: Expr) -> TensorView | None:
    """A copy of operand's computation back to the fusion inputs (read through new alias
    inputs), now read by `use` instead of operand; None (nothing changed) when that computation
    holds an op that is not copied."""
    if not _copyable(operand):
        return None
    made: dict = {}

    def copy_of(t: TensorView) -> TensorView:
        if t in made:
            return made[t]
        if t.definition is None:
            new = _alias_input(fusion, t)
        else:
            d = t.definition
            ins = [copy_of(i) if isinstance(i, TensorView) else i for i in d.inputs]
            new = _copy_expr(fusion, d, ins)
        made[t] = new
        return new
    new = copy_of(operand)
    use.replace_input(operand, new)
    return new


def _copyable(tv: TensorView) -> bool:
    seen, todo = set(), [tv]
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        d = t.definition
        if d is None:
            if not t.is_input():
                return False
            continue
        if not isinstance(d, _COPYABLE):
            return False
        todo.extend(i for i in d.inputs if isinstance(i, TensorView))
    return True


def _alias_input(fusion, tv: TensorView) -> TensorView:
    """A new fusion input reading the runtime tensor of input `tv`, with IDs of its own (the
    same extents, allocation order and contiguity)."""
    by_old = {i: i.clone(fusion=fusion) for i in tv.domain.logical}
    alloc = None
    if tv.domain.allocation is not None:
        alloc = [by_old[i] for i in tv.domain.allocation]
    with fusion:
        alias = TensorView(TensorDomain([by_old[i] for i in tv.domain.logical], allocation=alloc,
                                        contiguity=list(tv.domain.contiguity)),
                           tv.dtype, MemoryType.Global)
    fusion.add_input(alias)
    fusion.input_aliases[len(fusion.inputs) - 1] = fusion.input_position(tv)
    return alias


def _fresh_domain(fusion, dom: TensorDomain) -> TensorDomain:
    """A copy of an unscheduled domain with new IDs: root IDs cloned and the root-to-logical
    history (a reshape's merge and splits) replayed on them."""
    ids = {r: r.clone(fusion=fusion) for r in dom.maybe_root}
    for e in id_exprs_between(dom.maybe_root, dom.logical):
        if isinstance(e, Split):
            outer, inner = split_id(ids[e.in_id], e.factor, e.inner_split)
            ids[e.outer], ids[e.inner] = outer, inner
        else:
            ids[e.out] = merge_ids(ids[e.outer], ids[e.inner])
    for old, new in ids.items():
        new.iter_type = old.iter_type           # a reshape marks its size-1 outputs broadcast
    root = [ids[r] for r in dom.root] if dom.root is not None else None
    return TensorDomain([ids[i] for i in dom.logical], root=root)


def _copy_expr(fusion, e: Expr, inputs: list) -> TensorView:
    out = e.outputs[0]
    with fusion:
        new_out = TensorView(_fresh_domain(fusion, out.domain), out.dtype, MemoryType.Local)
    dup = copy.copy(e)
    dup.inputs, dup.outputs = [], []
    Expr.__init__(dup, inputs, [new_out])
    return new_out


def fusion_self_mapping(fusion) -> str | None:
    """Why `fusion` cannot be scheduled as one loop nest per output (two dims of one tensor in
    one exact group), or None."""
    return self_mapping(IdGraph(fusion), fusion.tensors())

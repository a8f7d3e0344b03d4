"""Index math: from loop indices to the index of any IterDomain, through Split/Merge history.

All index arithmetic of the lowering lives here. Given values for some IDs (the promoted IDs of
the loops around an expression), `IndexGraph.traverse` walks the exact ID graph:

    backward through a split  (outer, inner) -> in:   in = outer * f + inner      (inner split)
    backward through a merge  out -> (outer, inner):  outer = out / E(inner), inner = out % E(inner)
    forward  through a split  in -> (outer, inner):   outer = in / f, inner = in % f
    forward  through a merge  (outer, inner) -> out:  out = outer * E(inner) + inner

and records for each ID whether its index can exceed its extent (only a split that does not divide
its input, or an index derived from one, can): those IDs get predicates. A split divides its
input where the schedule said so (Split.divisible) or where its constant factor divides an extent
the schedule declared a multiple of it (fusion.extent_multiples, below).

A vector lane is folded out of a merge's division: where out = a * V + lane (lane in [0, V), the
variable of a loop of extent V) and E(inner) is a multiple of V (a constant, or an extent the
schedule declared one: fusion.extent_multiples, checked before each launch), the lanes of one
vector lie in one row of the merge, so

    outer = (a * V) / E(inner),  inner = (a * V) % E(inner) + lane

An operand broadcast along the row ([M, 1] beside [M, N], an embedding's ids) is then read at
an index without the lane: once per vector, not once per element (lower/vectorize.py hoists
such reads out of a vector loop).
Merges with a broadcast of extent 1 are the same iteration as their other input (see
pyfuser.ir.id_graph) and need no arithmetic.
"""
from __future__ import annotations

import dataclasses

from ..ir import scalar as S
from ..ir.id_graph import IdGraph
from ..ir.iter_domain import IterDomain, Merge, Split
from ..kir import nodes as K


def scalar_to_kexpr(s, names: dict) -> K.KExpr:
    """A fusion integer Scalar as a kernel expression; symbolic inputs come from `names`
    (Scalar -> K.Var of the kernel parameter holding it)."""
    if not isinstance(s, S.Scalar):
        return K.Const(s)
    if s.value is not None:
        return K.Const(s.value)
    if s in names:
        return names[s]
    d = s.definition
    if d is None:
        raise KeyError(f"no kernel value for scalar {S.scalar_str(s)}")
    a, b = (scalar_to_kexpr(x, names) for x in d.inputs)
    fn = {"add": K.add, "sub": K.sub, "mul": K.mul, "div": K.div, "mod": K.mod,
          "ceilDiv": K.ceil_div}.get(d.op)
    if fn is not None:
        return fn(a, b)
    return K.Bin(d.op, a, b)


def bound_extents(ctx, parallel_types) -> set:
    """Extents of the loops bound to any of `parallel_types`, as constants where the kernel is
    specialized on them (ctx.names maps those extents to constants), None where not."""
    return {getattr(scalar_to_kexpr(lp.extent, ctx.names), "value", None)
            for lp in ctx.all_loops() if lp.parallel in parallel_types}


@dataclasses.dataclass(frozen=True, eq=False)
class GroupExpr:
    kind: str            # split | merge
    inputs: tuple        # group representatives
    outputs: tuple
    expr: object         # one representative Split/Merge


@dataclasses.dataclass
class Known:
    value: K.KExpr
    may_overflow: bool
    # (index, extent) whose `index < extent` is the same test as this ID's, where simpler: for
    # in = outer * f + lane of a split that divides `in` (f | E), in < E exactly when
    # outer < E / f, the outer part's own test, the same for every lane of a vector.
    bound: tuple | None = None

    def in_bounds(self, extent: K.KExpr) -> K.KExpr:
        """The test that this index lies within `extent` (the ID's own)."""
        return K.lt(*self.bound) if self.bound is not None else K.lt(self.value, extent)


class IndexGraph:
    def __init__(self, exact: IdGraph, names: dict, multiples: dict | None = None,
                 lanes: dict | None = None):
        self.g = exact
        self.names = names
        # Extent expression (as printed) -> a width it is a multiple of; loop variable -> its
        # loop's constant extent (the lanes a merge's division may fold out).
        self.multiples = multiples or {}
        self.lanes = lanes or {}
        self.exprs: list[GroupExpr] = []
        seen = set()
        for e in exact.id_exprs:
            ins = tuple(exact.group(i) for i in e.inputs)
            outs = tuple(exact.group(o) for o in e.outputs)
            if isinstance(e, Merge) and outs[0] in ins:
                continue   # broadcast forwarding: no arithmetic
            key = (type(e).__name__, ins, outs, S.scalar_str(e.factor) if isinstance(e, Split) else None,
                   getattr(e, "inner_split", None))
            if key in seen:
                continue
            seen.add(key)
            self.exprs.append(GroupExpr("split" if isinstance(e, Split) else "merge", ins, outs, e))
        # (outer group, inner group) -> the groups of their merges, in topological order.
        self.merges: dict = {}
        for ge in self.exprs:
            if ge.kind == "merge":
                self.merges.setdefault(ge.inputs, []).append(ge.outputs[0])

    def extent(self, group) -> K.KExpr:
        members = self.g.sets.members(group)
        best = None
        for m in members:
            if m.is_broadcast:
                continue
            if m.extent.value is not None:
                return K.Const(m.extent.value)
            best = best or m
        best = best or members[0]
        if best.is_broadcast:
            return K.Const(1)
        return scalar_to_kexpr(best.extent, self.names)

    def traverse(self, start: dict[IterDomain, Known], targets) -> dict:
        """Values for the groups of `targets`, from `start` (ID -> Known)."""
        known: dict = {}
        for i, k in start.items():
            known.setdefault(self.g.group(i), k)
        want = {self.g.group(t) for t in targets}
        if want <= known.keys():
            return known
        progress = True
        seeded = False
        # Backward first: loop IDs descend from the roots, so most targets lie upstream.
        while progress and not want <= known.keys():
            progress = False
            for ge in self.exprs:
                if all(o in known for o in ge.outputs) and not all(i in known for i in ge.inputs):
                    self._backward(ge, known)
                    progress = True
            if progress:
                continue
            for ge in self.exprs:
                if all(i in known for i in ge.inputs) and not all(o in known for o in ge.outputs):
                    self._forward(ge, known)
                    progress = True
                    break
            if not progress and not seeded:
                # Stuck: an ID of extent 1 that no loop gives an index has index 0 (a size-1
                # piece a reshape splits off, whose broadcast partner in the consumer is merged
                # away by forwarding, which carries no index). Only now, so that an extent-1
                # ID the loops do index (the outer part of a split whose index can pass its
                # extent) keeps that index for its predicate.
                seeded = True
                for ge in self.exprs:
                    for g in ge.inputs + ge.outputs:
                        if g not in known and self._is_unit(g):
                            known[g] = Known(K.Const(0), False)
                            progress = True
        return known

    def _is_unit(self, group) -> bool:
        ext = self.extent(group)
        return isinstance(ext, K.Const) and ext.value == 1

    def _backward(self, ge: GroupExpr, known: dict) -> None:
        if ge.kind == "split":
            o, i = (known[x] for x in ge.outputs)
            e: Split = ge.expr
            f = (scalar_to_kexpr(e.factor, self.names) if e.inner_split
                 else self.extent(ge.outputs[1]))
            value = K.add(K.mul(o.value, f), i.value)
            divides = self._divides(e, f, ge.inputs[0])
            overflow = o.may_overflow or i.may_overflow or not divides
            bound = None
            if divides and e.inner_split and not i.may_overflow:
                bound = o.bound or (o.value, self.extent(ge.outputs[0]))
            known.setdefault(ge.inputs[0], Known(value, overflow, bound))
        else:
            out = known[ge.outputs[0]]
            inner_ext = self.extent(ge.inputs[1])
            outer_ext = self.extent(ge.inputs[0])
            if isinstance(inner_ext, K.Const) and inner_ext.value == 1:
                known.setdefault(ge.inputs[0], Known(out.value, out.may_overflow))
                known.setdefault(ge.inputs[1], Known(K.Const(0), False))
            elif isinstance(outer_ext, K.Const) and outer_ext.value == 1:
                known.setdefault(ge.inputs[0], Known(K.Const(0), False))
                known.setdefault(ge.inputs[1], Known(out.value, out.may_overflow))
            else:
                base, lane = self._lane_split(out.value, inner_ext)
                known.setdefault(ge.inputs[0], Known(K.div(base, inner_ext), out.may_overflow))
                known.setdefault(ge.inputs[1], Known(K.add(K.mod(base, inner_ext), lane), False))

    def _lane_split(self, value: K.KExpr, extent: K.KExpr) -> tuple:
        """(a * V, lane) where value = a * V + lane, lane the variable of a loop of extent V and
        `extent` a multiple of V (the module docstring); else (value, 0)."""
        if isinstance(value, K.Bin) and value.op == "+" and isinstance(value.a, K.Bin) \
                and value.a.op == "*" and isinstance(value.a.b, K.Const):
            width, lane = value.a.b.value, value.b
            if self.lanes.get(lane) == width and width > 1 and self._multiple_of(extent, width):
                return value.a, lane
        return value, K.Const(0)

    def _divides(self, split: Split, factor: K.KExpr, in_group) -> bool:
        """Whether `split` has no padding iterations: the schedule said so (Split.divisible),
        or its constant inner factor divides an extent the schedule declared a multiple of it
        (a row of whole vectors, fusion.extent_multiples, checked before each launch); then
        the split's index needs no guard of its own, and the lanes of a vector share one."""
        if split.is_divisible:
            return True
        return (split.inner_split and isinstance(factor, K.Const)
                and self._multiple_of(self.extent(in_group), factor.value))

    def _multiple_of(self, extent: K.KExpr, width: int) -> bool:
        if isinstance(extent, K.Const):
            return extent.value % width == 0
        if isinstance(extent, K.Bin) and extent.op == "*":     # merged dims: either factor
            return self._multiple_of(extent.a, width) or self._multiple_of(extent.b, width)
        m = self.multiples.get(repr(extent))
        return m is not None and m % width == 0

    def _forward(self, ge: GroupExpr, known: dict) -> None:
        if ge.kind == "split":
            x = known[ge.inputs[0]]
            e: Split = ge.expr
            f = (scalar_to_kexpr(e.factor, self.names) if e.inner_split
                 else self.extent(ge.outputs[1]))
            known.setdefault(ge.outputs[0], Known(K.div(x.value, f), x.may_overflow))
            known.setdefault(ge.outputs[1], Known(K.mod(x.value, f), False))
        else:
            o, i = (known[x] for x in ge.inputs)
            inner_ext = self.extent(ge.inputs[1])
            known.setdefault(ge.outputs[0], Known(K.add(K.mul(o.value, inner_ext), i.value),
                                                  o.may_overflow))

    def index_of(self, known: dict, i: IterDomain) -> Known | None:
        return known.get(self.g.group(i))

    def known_merge(self, outer, inner, known: dict):
        """The group of a merge of groups (outer, inner) whose index `known` holds, or None."""
        return next((o for o in self.merges.get((outer, inner), ()) if o in known), None)

    def merges_of_adjacent(self, groups: list) -> dict:
        """(a, b) -> the groups that merge groups[a..b] in order, in any association: a flat
        loop merges dims outermost first ((N * H) * W) * C, a reduction's merge innermost
        first N * (H * W); both index the run N, H, W, C by one merged index."""
        out = {(k, k): [g] for k, g in enumerate(groups)}
        n = len(groups)
        for length in range(2, n + 1):
            for a in range(n - length + 1):
                b = a + length - 1
                found = []
                for m in range(a, b):
                    for o in out.get((a, m), ()):
                        for i in out.get((m + 1, b), ()):
                            found += [x for x in self.merges.get((o, i), ()) if x not in found]
                if found:
                    out[(a, b)] = found
        return out

    def merged_runs(self, groups, known: dict) -> tuple[dict, set]:
        """Merges that combine `groups` (a tensor's dims) into fewer indices: {merged group:
        Known} for the largest merges known, and the set of groups they stand for. A merge is
        taken only where its inner input's index cannot pass its extent, so that the merged
        index is below the merged extent exactly when both inputs are below theirs (a [.., H, W]
        tensor in a loop over H * W is guarded by hw < H * W, not by hw / W < H: no division)."""
        avail = set(groups)
        made: dict = {}
        used: set = set()
        progress = True
        while progress:
            progress = False
            for (o, i), outs in self.merges.items():
                if o not in avail or i not in avail or o in used or i in used \
                        or i not in known or known[i].may_overflow:
                    continue
                out = next((x for x in outs if x in known and x not in avail), None)
                if out is not None:
                    avail.add(out)
                    made[out] = known[out]
                    used |= {o, i}
                    progress = True
        top = {g: k for g, k in made.items() if g not in used}
        return top, used

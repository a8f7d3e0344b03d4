"""IterDomains and their transform history (Split, Merge).

An IterDomain is one axis of iteration: an extent, an iteration type (iteration, reduction,
broadcast) and a parallel type. Scheduling splits and merges IterDomains; each Split/Merge is an
expression from input IDs to output IDs, so the history from a tensor's logical domain to its loop
domain can be replayed elsewhere (transform propagation) and walked backwards (indexing).
"""
from __future__ import annotations

import enum

from . import scalar as S
from .base import Expr, Val
from .dtype import DataType


class IterType(enum.Enum):
    Iteration = "i"
    Reduction = "r"
    Broadcast = "b"


class ParallelType(enum.Enum):
    Serial = "S"
    BIDx = "blockIdx.x"
    BIDy = "blockIdx.y"
    BIDz = "blockIdx.z"
    TIDx = "threadIdx.x"
    TIDy = "threadIdx.y"
    TIDz = "threadIdx.z"
    Unroll = "UR"
    Unswitch = "US"
    Vectorize = "V"
    # One bulk (TMA) copy moves this whole axis; no loop is generated for it.
    Bulk = "B"
    # Grouped reduction: the iterations of this axis reduce together in one block reduction.
    Group = "G"
    # A persistent grid-stride loop over this axis: blockIdx.x + k * gridDim.x.
    GridStride = "GS"

    @property
    def is_block_dim(self) -> bool:
        return self in (ParallelType.BIDx, ParallelType.BIDy, ParallelType.BIDz)

    @property
    def is_thread_dim(self) -> bool:
        return self in (ParallelType.TIDx, ParallelType.TIDy, ParallelType.TIDz)

    @property
    def is_thread_or_block(self) -> bool:
        return self.is_block_dim or self.is_thread_dim

    @property
    def short(self) -> str:
        return {"blockIdx.x": "BIDx", "blockIdx.y": "BIDy", "blockIdx.z": "BIDz",
                "threadIdx.x": "TIDx", "threadIdx.y": "TIDy", "threadIdx.z": "TIDz"}.get(
            self.value, self.value)


class IterDomain(Val):
    """One axis: `extent` (a Scalar), `iter_type`, `parallel_type`.

    A broadcast IterDomain has extent 1; an expanded broadcast (stride 0 in memory) also carries
    `expanded_extent`, the size the user sees.
    """

    name_kind = "id"

    def __init__(self, extent, iter_type: IterType = IterType.Iteration,
                 parallel_type: ParallelType = ParallelType.Serial, expanded_extent=None,
                 fusion=None):
        super().__init__(fusion)
        self.extent: S.Scalar = S.as_scalar(extent, DataType.Int)
        self.iter_type = iter_type
        self.parallel_type = parallel_type
        self.expanded_extent = (S.as_scalar(expanded_extent, DataType.Int)
                                if expanded_extent is not None else None)
        # Set when an rfactor turns this ID into a product of the rfactor tensor's logical
        # domain (it is then an iteration or reduction ID of that tensor, not of the original).
        self.is_rfactor_product = False
        # A serial loop the schedule keeps rolled whatever its extent (the looped inner
        # persistent variant's steps over a row, constant where an iota fixes the row's
        # length): lowering neither unrolls it nor holds a broadcast's copies along it.
        self.rolled = False

    # Properties ------------------------------------------------------------------------------
    @property
    def is_reduction(self) -> bool:
        return self.iter_type == IterType.Reduction

    @property
    def is_broadcast(self) -> bool:
        return self.iter_type == IterType.Broadcast

    @property
    def is_iteration(self) -> bool:
        return self.iter_type == IterType.Iteration

    @property
    def is_parallelized(self) -> bool:
        return self.parallel_type != ParallelType.Serial

    @property
    def is_thread(self) -> bool:
        return self.parallel_type.is_thread_or_block

    @property
    def const_extent(self) -> int | None:
        return self.extent.value

    @property
    def user_extent(self) -> S.Scalar:
        """The extent a user sees: the expanded extent of an expanded broadcast."""
        return self.expanded_extent if self.expanded_extent is not None else self.extent

    @property
    def maybe_expanded_extent(self) -> S.Scalar:
        """The size of this dim in a tensor's shape: a broadcast's user extent (1, or what it
        is expanded to), any other dim's extent (a split or merge of an expanded broadcast
        may carry an expanded extent beside its own)."""
        return self.user_extent if self.is_broadcast else self.extent

    def parallelize(self, ptype: ParallelType) -> "IterDomain":
        self.parallel_type = ptype
        return self

    def clone(self, iter_type: IterType | None = None, fusion=None) -> "IterDomain":
        """A new IterDomain of the same extent and type (not parallelized)."""
        return IterDomain(self.extent, iter_type or self.iter_type,
                          expanded_extent=self.expanded_extent, fusion=fusion or self.fusion)

    def __repr__(self) -> str:
        return id_str(self)


def id_str(i: IterDomain) -> str:
    p = "S" if i.parallel_type == ParallelType.Serial else i.parallel_type.short
    ext = S.scalar_str(i.extent)
    if i.expanded_extent is not None:
        ext += f" ex {S.scalar_str(i.expanded_extent)}"
    return f"{i.iter_type.value}{p}{i.name}{{{ext}}}"


class Split(Expr):
    """in -> (outer, inner). Inner split: inner has extent `factor`; outer split: outer does.

    `divisible`: the scheduler guarantees the factor divides the extent in every call that runs
    the kernel (its heuristic, part of the kernel's key, was chosen so: tiles of a transpose
    whose dims are multiples of the tile), so the split has no padding iterations to guard."""

    def __init__(self, in_id: IterDomain, outer: IterDomain, inner: IterDomain, factor: S.Scalar,
                 inner_split: bool, divisible: bool = False):
        self.factor = factor
        self.inner_split = inner_split
        self.divisible = divisible
        super().__init__([in_id], [outer, inner])

    @property
    def in_id(self) -> IterDomain:
        return self.inputs[0]

    @property
    def outer(self) -> IterDomain:
        return self.outputs[0]

    @property
    def inner(self) -> IterDomain:
        return self.outputs[1]

    @property
    def is_divisible(self) -> bool:
        """True when the factor is known to divide the extent (no padding iterations)."""
        e, f = self.in_id.extent.value, self.factor.value
        if f == 1 or self.divisible:
            return True
        return e is not None and f is not None and e % f == 0

    def __repr__(self) -> str:
        kind = "inner" if self.inner_split else "outer"
        return (f"Split: {id_str(self.in_id)} by {S.scalar_str(self.factor)} ({kind}) -> "
                f"{id_str(self.outer)}, {id_str(self.inner)}")


class Merge(Expr):
    """(outer, inner) -> out, out = outer * extent(inner) + inner."""

    def __init__(self, outer: IterDomain, inner: IterDomain, out: IterDomain):
        super().__init__([outer, inner], [out])

    @property
    def outer(self) -> IterDomain:
        return self.inputs[0]

    @property
    def inner(self) -> IterDomain:
        return self.inputs[1]

    @property
    def out(self) -> IterDomain:
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Merge: {id_str(self.outer)} and {id_str(self.inner)} -> {id_str(self.out)}"


def split_id(in_id: IterDomain, factor, inner_split: bool = True,
             divisible: bool = False) -> tuple[IterDomain, IterDomain]:
    factor = S.as_scalar(factor, DataType.Int)
    if factor.value is not None and factor.value <= 0:
        raise ValueError(f"split factor must be positive, got {factor.value}")
    split_ext = S.ceil_div(in_id.extent, factor)
    outer_ext, inner_ext = (split_ext, factor) if inner_split else (factor, split_ext)
    expanded_outer = expanded_inner = None
    if in_id.expanded_extent is not None:
        ex = S.ceil_div(in_id.expanded_extent, factor)
        expanded_outer, expanded_inner = (ex, factor) if inner_split else (factor, ex)
    outer = IterDomain(outer_ext, in_id.iter_type, expanded_extent=expanded_outer, fusion=in_id.fusion)
    inner = IterDomain(inner_ext, in_id.iter_type, expanded_extent=expanded_inner, fusion=in_id.fusion)
    outer.is_rfactor_product = inner.is_rfactor_product = in_id.is_rfactor_product
    Split(in_id, outer, inner, factor, inner_split, divisible)
    return outer, inner


def replayed_divisible(split: "Split", onto: IterDomain) -> bool:
    """Whether a replay of `split` onto `onto` keeps its `divisible` guarantee: only onto an ID
    of the same extent (a broadcast forwarded through a merge has another)."""
    return split.divisible and S.scalar_str(onto.extent) == S.scalar_str(split.in_id.extent)


def merged_iter_type(a: IterDomain, b: IterDomain) -> IterType:
    """Iteration type of merge(a, b); None if the merge is illegal (reduction with iteration)."""
    types = {a.iter_type, b.iter_type}
    if types == {IterType.Broadcast}:
        return IterType.Broadcast
    types.discard(IterType.Broadcast)
    if len(types) == 2:
        return None
    return types.pop()


def merge_ids(outer: IterDomain, inner: IterDomain) -> IterDomain:
    itype = merged_iter_type(outer, inner)
    if itype is None:
        raise ValueError(f"cannot merge iteration and reduction IDs: {id_str(outer)}, {id_str(inner)}")
    if itype == IterType.Broadcast:
        ext = S.as_scalar(1, DataType.Int)
    else:
        # A broadcast input contributes extent 1 to the product.
        ext = S.mul(outer.extent if not outer.is_broadcast else 1,
                    inner.extent if not inner.is_broadcast else 1)
    expanded = None
    if outer.expanded_extent is not None or inner.expanded_extent is not None:
        expanded = S.mul(outer.user_extent, inner.user_extent)
        if itype != IterType.Broadcast:
            expanded = None
    out = IterDomain(ext, itype, expanded_extent=expanded, fusion=outer.fusion)
    out.is_rfactor_product = outer.is_rfactor_product or inner.is_rfactor_product
    Merge(outer, inner, out)
    return out


def id_exprs_between(from_ids, to_ids) -> list[Expr]:
    """Split/Merge exprs on the paths from `from_ids` to `to_ids`, in topological order."""
    from_set = set(from_ids)
    seen: set = set()
    order: list[Expr] = []

    def visit(i: IterDomain):
        if i in from_set:
            return
        d = i.definition
        if d is None or d in seen:
            return
        for inp in d.inputs:
            visit(inp)
        seen.add(d)
        order.append(d)

    for i in to_ids:
        visit(i)
    return order


def history(i: IterDomain) -> list[IterDomain]:
    """ID i and every ID it is split or merged from, depth first from i, each once."""
    out, seen, todo = [], set(), [i]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        out.append(x)
        if x.definition is not None:
            todo.extend(x.definition.inputs)
    return out


def ancestors(i: IterDomain, roots) -> list[IterDomain]:
    """IDs of `roots` that `i` derives from."""
    roots = set(roots)
    out, stack, seen = [], [i], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in roots:
            out.append(x)
            continue
        if x.definition is not None:
            stack.extend(x.definition.inputs)
    return out

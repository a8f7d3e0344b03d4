"""TensorDomain and TensorView.

A TensorDomain holds the domains of one tensor:
- root: the logical domain before an rfactor or reshape (None when equal to logical);
- logical: the math shape;
- allocation: how the tensor lies in memory, outer to inner (None: same as logical), with one
  contiguity flag per allocation ID (None for broadcast IDs);
- loop: the scheduled loop nest, derived from logical by Split/Merge.

The loop transforms (split, merge, reorder, parallelize) are methods of TensorView because they
are domain math; primitives that restructure the fusion (caching, rfactor, inlining) live in
pyfuser.schedule.
"""
from __future__ import annotations

import dataclasses
import enum

from . import scalar as S
from .base import Val, frontend_ops
from .dtype import DataType
from .iter_domain import (IterDomain, Merge, ParallelType, Split, ancestors, id_exprs_between,
                          id_str, merge_ids, merged_iter_type, split_id)


class MemoryType(enum.Enum):
    Global = "g"
    Shared = "s"
    Local = "l"


class ScheduleError(ValueError):
    """An illegal schedule call; the message names the tensor, the axis and the rule."""


@dataclasses.dataclass(frozen=True)
class PipelinedBuffer:
    """Circular buffer whose loads are issued by the same threads that compute."""


@dataclasses.dataclass(frozen=True)
class WarpSpecialized:
    """Circular buffer filled by a dedicated producer warp group.

    `on` is the thread dimension that separates the producer from the compute warp groups; the
    register counts are given to setmaxnreg (producer decreases, compute increases).
    `compute_roles` copies of the compute threads side by side along `on` take the buffered
    loop's iterations in turn, their sections ordered (ping-pong when 2; lower/pipeline.py).
    """

    on: ParallelType = ParallelType.TIDy
    producer_registers: int | None = None
    compute_registers: int | None = None
    compute_roles: int = 1


@dataclasses.dataclass(frozen=True)
class CpAsyncPipelined:
    """Circular buffer of a cp.async load: every thread copies its own elements and reads them
    back; a stage is complete when the thread's cp.async group holding it is (commit_group /
    wait_group), so no mbarrier is involved."""


@dataclasses.dataclass(frozen=True)
class CircularBufferOptions:
    stages: int
    prefetch: int
    kind: PipelinedBuffer | WarpSpecialized | CpAsyncPipelined


class TensorDomain:
    def __init__(self, logical: list[IterDomain], root: list[IterDomain] | None = None,
                 allocation: list[IterDomain] | None = None, contiguity=None,
                 loop: list[IterDomain] | None = None):
        self.root = list(root) if root is not None else None
        self.logical = list(logical)
        self.allocation = list(allocation) if allocation is not None else None
        alloc = self.allocation if self.allocation is not None else self.logical
        if contiguity is None:
            contiguity = [None if i.is_broadcast or i.is_reduction else True for i in alloc]
        self.contiguity = list(contiguity)
        self.loop = list(loop) if loop is not None else list(self.logical)

    @property
    def maybe_root(self) -> list[IterDomain]:
        return self.root if self.root is not None else self.logical

    @property
    def maybe_allocation(self) -> list[IterDomain]:
        return self.allocation if self.allocation is not None else self.logical

    @property
    def logical_no_reductions(self) -> list[IterDomain]:
        return [i for i in self.logical if not i.is_reduction]

    def all_ids(self) -> list[IterDomain]:
        """Every ID between root, logical, allocation and loop, in topological order."""
        starts = self.maybe_root
        exprs = id_exprs_between(starts, self.logical + self.maybe_allocation + self.loop)
        out = list(starts)
        for e in exprs:
            for o in e.outputs:
                if o not in out:
                    out.append(o)
        for i in self.logical + self.maybe_allocation + self.loop:
            if i not in out:
                out.append(i)
        return out

    def has_reduction(self) -> bool:
        return any(i.is_reduction for i in self.logical)

    @property
    def contiguous_dim(self) -> IterDomain | None:
        """The innermost allocated ID that is neither a broadcast nor a reduction: the dim whose
        consecutive elements lie next to each other in memory (stride 1 when its contiguity
        flag is set; an input's runtime stride otherwise). None when every dim is a broadcast."""
        return next((i for i in reversed(self.maybe_allocation)
                     if not i.is_broadcast and not i.is_reduction), None)

    def dim_stepped_by(self, loop_id: IterDomain) -> IterDomain | None:
        """The allocated ID whose index moves by exactly one when `loop_id`'s index does (within
        a run of `loop_id`), or None when consecutive iterations of `loop_id` jump.

        Walked back through the loop's history: the inner part of a split steps its input;
        a merge steps its inner input (its outer one when the inner is a broadcast, which
        contributes extent 1); the outer part of a split steps by the factor, a jump."""
        stop = set(self.maybe_allocation) | set(self.maybe_root)
        x = loop_id
        while x not in stop:
            d = x.definition
            if isinstance(d, Split):
                if x is d.inner or d.inner.const_extent == 1:
                    x = d.in_id
                    continue
                return None
            if isinstance(d, Merge):
                x = d.outer if d.inner.is_broadcast else d.inner
                continue
            return None
        if x not in self.maybe_allocation:
            # A root ID of an rfactor or reshape; allocation IDs derive from the logical ones.
            return None
        return x


class TensorView(Val):
    name_kind = "T"

    def __init__(self, domain: TensorDomain, dtype: DataType, memory_type: MemoryType = MemoryType.Local,
                 fusion=None):
        super().__init__(fusion)
        self.domain = domain
        self.dtype = dtype
        self.memory_type = memory_type
        # Loop IDs [0, compute_at_pos) are shared with the consumers' loops (inlined).
        self.compute_at_pos = 0
        # The largest inline position among this tensor's producers: loops left of it are shared.
        self.max_producer_pos = 0
        self.circular_buffer_options: CircularBufferOptions | None = None
        # The tensor this one is a recomputed copy of (schedule/recompute.py), or None.
        self.recompute_of: TensorView | None = None
        # (first ID of a row, elements) for a shared buffer whose rows are padded
        # (schedule.pad_shared_rows), or None.
        self.row_padding: tuple | None = None

    # Views of the domain ----------------------------------------------------------------------
    @property
    def logical(self) -> list[IterDomain]:
        return self.domain.logical

    @property
    def loop(self) -> list[IterDomain]:
        return self.domain.loop

    @property
    def ndim(self) -> int:
        """Number of loop axes (what split/merge/reorder positions refer to)."""
        return len(self.domain.loop)

    def axis(self, i: int) -> IterDomain:
        return self.domain.loop[self._pos(i, "axis")]

    def __repr__(self) -> str:
        from .printer import tv_str
        return tv_str(self)

    # Operators, as nvFuser's frontend has them: `a + b`, `2 * a`, `-a`, `a < b`, `a & b`, ...
    # They call the op of the FusionDefinition that owns the fusion (its `frontend_ops`), with
    # that op's type promotion and checks. `==` and `!=` stay identity (tensors are dict keys
    # throughout the compiler): fd.ops.eq and fd.ops.ne compare values.
    def _op(self, name: str, *args):
        ops = frontend_ops.get(self.fusion) if self.fusion is not None else None
        if ops is None:
            raise TypeError(f"T{self.name} {name}: operators on tensors need a FusionDefinition "
                            "being defined (with FusionDefinition() as fd: ...)")
        return getattr(ops, name)(*args)

    def __add__(self, o): return self._op("add", self, o)
    def __radd__(self, o): return self._op("add", o, self)
    def __sub__(self, o): return self._op("sub", self, o)
    def __rsub__(self, o): return self._op("sub", o, self)
    def __mul__(self, o): return self._op("mul", self, o)
    def __rmul__(self, o): return self._op("mul", o, self)
    def __truediv__(self, o): return self._op("div", self, o)
    def __rtruediv__(self, o): return self._op("div", o, self)
    def __pow__(self, o): return self._op("pow", self, o)
    def __rpow__(self, o): return self._op("pow", o, self)
    def __neg__(self): return self._op("neg", self)
    def __abs__(self): return self._op("abs", self)
    def __invert__(self): return self._op("logical_not", self)
    def __and__(self, o): return self._op("logical_and", self, o)
    def __rand__(self, o): return self._op("logical_and", o, self)
    def __or__(self, o): return self._op("logical_or", self, o)
    def __ror__(self, o): return self._op("logical_or", o, self)
    def __lt__(self, o): return self._op("lt", self, o)
    def __le__(self, o): return self._op("le", self, o)
    def __gt__(self, o): return self._op("gt", self, o)
    def __ge__(self, o): return self._op("ge", self, o)

    def _pos(self, axis: int, what: str, allow_end: bool = False) -> int:
        n = len(self.domain.loop) + (1 if allow_end else 0)
        pos = axis + n if axis < 0 else axis
        if not 0 <= pos < n:
            raise ScheduleError(f"{what} on T{self.name}: axis {axis} is out of range for "
                                f"{len(self.domain.loop)} loop axes")
        return pos

    def _check_transformable(self, pos: int, what: str) -> None:
        if pos < self.compute_at_pos:
            raise ScheduleError(
                f"{what} on T{self.name}: axis {pos} is left of the compute-at position "
                f"{self.compute_at_pos}; those loops are shared with consumers and fixed")
        if pos < self.max_producer_pos:
            raise ScheduleError(
                f"{what} on T{self.name}: axis {pos} is left of position {self.max_producer_pos} "
                f"where a producer is inlined; transforming it would detach that producer")

    # Loop transforms --------------------------------------------------------------------------
    def split(self, axis: int, factor, inner_split: bool = True,
              divisible: bool = False) -> "TensorView":
        """Split loop axis `axis` by `factor`.

        Inner split (default): `for i in range(N)` becomes
        `for io in range(ceilDiv(N, f)): for ii in range(f): i = io * f + ii` (predicated when f
        does not divide N). Outer split: the outer loop gets extent `f` instead. `divisible`:
        the caller guarantees f divides N in every call that runs the kernel (no guard).
        """
        pos = self._pos(axis, "split")
        self._check_transformable(pos, "split")
        i = self.domain.loop[pos]
        if i.parallel_type != ParallelType.Serial:
            raise ScheduleError(f"split on T{self.name}: axis {pos} ({id_str(i)}) is already "
                                f"parallelized as {i.parallel_type.short}; split before parallelizing")
        fv = S.const_value(factor)
        if fv is not None and (not isinstance(fv, int) or fv <= 0):
            raise ScheduleError(f"split on T{self.name}: axis {pos}: factor must be a positive "
                                f"integer, got {factor!r}")
        outer, inner = split_id(i, factor, inner_split, divisible)
        self.domain.loop[pos:pos + 1] = [outer, inner]
        return self

    def merge(self, axis_o: int, axis_i: int | None = None) -> "TensorView":
        """Merge loop axes: `for a: for b:` becomes `for ab in range(A*B): a = ab / B; b = ab % B`.

        The merged axis takes the position of the outer one.
        """
        po = self._pos(axis_o, "merge")
        pi = self._pos(axis_i if axis_i is not None else po + 1, "merge")
        if po == pi:
            raise ScheduleError(f"merge on T{self.name}: cannot merge axis {po} with itself")
        for p in (po, pi):
            self._check_transformable(p, "merge")
        a, b = self.domain.loop[po], self.domain.loop[pi]
        if merged_iter_type(a, b) is None:
            raise ScheduleError(
                f"merge on T{self.name}: axes {po} ({id_str(a)}) and {pi} ({id_str(b)}) mix an "
                f"iteration and a reduction ID; merge IDs of the same kind")
        for p, x in ((po, a), (pi, b)):
            if x.parallel_type != ParallelType.Serial:
                raise ScheduleError(f"merge on T{self.name}: axis {p} ({id_str(x)}) is already "
                                    f"parallelized as {x.parallel_type.short}")
        out = merge_ids(a, b)
        loop = self.domain.loop
        first = min(po, pi)
        loop = [x for k, x in enumerate(loop) if k not in (po, pi)]
        loop.insert(first, out)
        self.domain.loop = loop
        return self

    def reorder(self, order) -> "TensorView":
        """Move loop axes: `order` maps old positions to new ones ({old: new}), or lists the old
        axis for each new position. Axes not named keep their relative order."""
        n = len(self.domain.loop)
        if isinstance(order, (list, tuple)):
            if sorted(self._pos(o, "reorder") for o in order) != list(range(n)):
                raise ScheduleError(f"reorder on T{self.name}: {list(order)} is not a permutation "
                                    f"of the {n} loop axes")
            mapping = {self._pos(old, "reorder"): new for new, old in enumerate(order)}
        else:
            mapping = {self._pos(k, "reorder"): self._pos(v, "reorder") for k, v in order.items()}
            if len(set(mapping.values())) != len(mapping):
                raise ScheduleError(f"reorder on T{self.name}: two axes sent to one position in {order}")
        for old, new in mapping.items():
            if old != new:
                self._check_transformable(min(old, new), "reorder")
        new_loop: list = [None] * n
        for old, new in mapping.items():
            new_loop[new] = self.domain.loop[old]
        rest = iter(x for k, x in enumerate(self.domain.loop) if k not in mapping)
        for k in range(n):
            if new_loop[k] is None:
                new_loop[k] = next(rest)
        self.domain.loop = new_loop
        return self

    def parallelize(self, axis: int, ptype: ParallelType) -> "TensorView":
        """Bind loop axis `axis` to a parallel type (threadIdx.x, Vectorize, Bulk, ...)."""
        pos = self._pos(axis, "parallelize")
        i = self.domain.loop[pos]
        rule = _parallel_rule_broken(self, pos, i, ptype)
        if rule:
            raise ScheduleError(f"parallelize on T{self.name}: axis {pos} ({id_str(i)}) as "
                                f"{ptype.short}: {rule}")
        i.parallel_type = ptype
        return self

    # Queries ----------------------------------------------------------------------------------
    def has_reduction(self) -> bool:
        return self.domain.has_reduction()

    def is_input(self) -> bool:
        return self.fusion is not None and self in self.fusion.inputs

    def is_output(self) -> bool:
        return self.fusion is not None and self in self.fusion.outputs

    @property
    def siblings(self) -> list:
        """The tensor outputs of this tensor's expression, this one among them (a top-k's
        values and indices); [self] for a fusion input. Siblings iterate the same dims, are
        computed in one loop nest and scheduled alike."""
        d = self.definition
        if d is None:
            return [self]
        return [o for o in d.outputs if isinstance(o, TensorView)]

    @property
    def allocation_domain(self) -> list[IterDomain]:
        """The IDs the tensor is allocated with, outer to inner.

        Global tensors use their (user-visible) allocation domain. Shared and local tensors hold
        only what their consumers need beyond the inlined loops: the loop IDs right of the
        compute-at position. They keep the order of the IDs they came from in the stored
        allocation domain (e.g. an input's stride order), so a cache of a permuted input stays
        permuted in shared memory; an allocation that names IDs the loop nest has since split
        is never returned.
        """
        if self.memory_type == MemoryType.Global:
            return self.domain.maybe_allocation
        stored = self.domain.maybe_allocation
        loop_right = self.domain.loop[self.compute_at_pos:]
        loop_set = set(self.domain.loop)
        if self.domain.allocation is not None and all(i in loop_set for i in self.domain.allocation):
            # An explicit allocation of loop IDs (set_allocation_domain): honour it, dropping
            # the IDs left of compute-at.
            return [i for i in self.domain.allocation if i in loop_right]
        origin_roots = self.domain.maybe_root + [x for x in stored if x not in self.domain.maybe_root]

        def key(item):
            k, i = item
            anc = ancestors(i, stored)
            pos = min((stored.index(a) for a in anc), default=len(stored))
            if not anc:
                # Not derived from the stored allocation: order by its logical origin.
                anc = ancestors(i, origin_roots)
                pos = min((stored.index(a) if a in stored else len(stored) for a in anc),
                          default=len(stored))
            return (pos, k)

        ordered = [i for _, i in sorted(enumerate(loop_right), key=key)]
        # A vector access reads or writes consecutive elements: a vectorized ID is innermost,
        # whatever the stored order says (a merge of an input's outermost and innermost dims,
        # vectorized, sorted at the outer one's place put the lanes 4 registers apart: fuzz
        # 20261127:878, a misaligned vector write that left half the output unwritten).
        vector = [i for i in ordered if i.parallel_type in (ParallelType.Vectorize,
                                                            ParallelType.Bulk)]
        return [i for i in ordered if i not in vector] + vector

    @property
    def allocation_contiguity(self) -> list:
        if self.memory_type == MemoryType.Global:
            return self.domain.contiguity
        return [None if i.is_broadcast else True for i in self.allocation_domain]


def _parallel_rule_broken(tv: TensorView, pos: int, i: IterDomain, ptype: ParallelType) -> str | None:
    if ptype.is_thread_or_block or ptype == ParallelType.Vectorize:
        other = next((k for k, x in enumerate(tv.domain.loop)
                      if x is not i and x.parallel_type == ptype), None)
        if other is not None:
            return (f"axis {other} is already {ptype.short}; one loop axis of a tensor per "
                    f"parallel type")
    if ptype == ParallelType.Vectorize:
        if i.const_extent is None:
            return "a vectorized axis needs a constant extent"
        if i.const_extent not in (1, 2, 4, 8, 16):
            return f"vector width {i.const_extent} is not 1, 2, 4, 8 or 16"
        if i.const_extent * tv.dtype.size > 16:
            return f"{i.const_extent} x {tv.dtype.size} bytes exceeds a 16-byte access"
        if i.is_reduction:
            return "a reduction axis cannot be vectorized"
        if i.const_extent > 1:
            stepped, inner = tv.domain.dim_stepped_by(i), tv.domain.contiguous_dim
            if stepped is None or stepped is not inner:
                walks = (f"steps through {id_str(stepped)}" if stepped is not None
                         else "does not step through one allocated dim element by element")
                where = (f"the innermost allocated dim is {id_str(inner)}" if inner is not None
                         else "every allocated dim is a broadcast")
                return (f"the axis {walks}, but {where}; a vector access must be contiguous "
                        "in memory")
        if any(not x.is_broadcast and x.parallel_type == ParallelType.Serial
               and (x.const_extent or 0) != 1 for x in tv.domain.loop[pos + 1:]
               if not x.is_reduction):
            return "only axes right of a vectorized axis that are parallel or of extent 1 may follow it"
    if ptype == ParallelType.Bulk:
        d = tv.definition
        kind = getattr(d, "load_kind", None)
        if kind is None or not kind.is_tma:
            return "Bulk is only for the output of a TMA load (cache_after with a TMA load kind)"
    if ptype == ParallelType.Group and not i.is_reduction and not _feeds_grouped_reduction(tv):
        return "Group is for the iteration axes of a reduction whose rows reduce together"
    return None


def _feeds_grouped_reduction(tv: TensorView) -> bool:
    d = tv.definition
    return d is not None and d.op_name == "ReductionOp"

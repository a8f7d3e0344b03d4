"""Caching primitives: put a copy of a tensor in another memory, and choose memories."""
from __future__ import annotations

from ..ir.arith import set_op
from ..ir.base import graph_changed
from ..ir.exprs import GatherOp, LoadKind, LoadStoreOp, WindowOp
from ..ir.tensor import MemoryType, ScheduleError, TensorDomain, TensorView


def cached_uses(tv: TensorView) -> list:
    """The uses of tv that a cache after it serves: all but windows (WindowOp) and gathers
    (GatherOp) of tv, which read their source in global memory at their own offsets (a
    gather's index is an ordinary operand)."""
    return [e for e in tv.fusion.uses_of(tv)
            if not (isinstance(e, (WindowOp, GatherOp)) and e.inputs[0] is tv)]


def cache_after(tv: TensorView, load_kind: LoadKind = LoadKind.Set,
                memory_type: MemoryType | None = None) -> TensorView:
    """C = set(tv) and every use of tv reads C instead.

    Before:  T1 = f(T0)                 After:  C = set(T0) (load_kind); T1 = f(C)
    C lives in registers unless `memory_type` says otherwise (TMA and cp.async loads default to
    shared memory). C inherits tv's allocation order and contiguity, so a cache of a permuted
    input stays permuted; once C's loop is scheduled its allocation comes from its own loop IDs
    (TensorView.allocation_domain).
    """
    fusion = tv.fusion
    uses = cached_uses(tv)
    if not uses:
        raise ScheduleError(f"cache_after on T{tv.name}: it has no uses to redirect")
    if load_kind.is_async and not tv.memory_type == MemoryType.Global:
        raise ScheduleError(f"cache_after on T{tv.name}: {load_kind.value} loads read global memory; "
                            f"T{tv.name} is in {tv.memory_type.name.lower()} memory")
    with fusion:
        cache = set_op(tv, load_kind)
    src_logical = tv.domain.logical_no_reductions
    dst_logical = cache.domain.logical
    by_src = dict(zip(src_logical, dst_logical))
    if tv.domain.allocation is not None:
        alloc = [by_src[i] for i in tv.domain.allocation if i in by_src]
        contig = [c for i, c in zip(tv.domain.allocation, tv.domain.contiguity) if i in by_src]
        cache.domain = TensorDomain(dst_logical, allocation=alloc, contiguity=contig)
    for e in uses:
        e.replace_input(tv, cache)
    if memory_type is None:
        memory_type = MemoryType.Shared if load_kind.is_async else MemoryType.Local
    set_memory_type(cache, memory_type)
    return cache


def cache_before(tv: TensorView) -> TensorView:
    """tv's computation writes a new C, and tv = set(C); tv's uses read C.

    Before:  T2 = f(T1); T3 = g(T2)         After:  C = f(T1); T2 = set(C); T3 = g(C)
             (T2 an output)
    C takes over tv's domain (reduction IDs included) and memory; tv gets fresh IDs in the same
    allocation order. An output that the fusion also computes with is read from C, where its
    values already are, instead of being read back from global memory after the store. Call it
    before scheduling tv.
    """
    d = tv.definition
    if d is None:
        raise ScheduleError(f"cache_before on T{tv.name}: it is a fusion input; use cache_after")
    if tv.compute_at_pos or tv.max_producer_pos:
        raise ScheduleError(f"cache_before on T{tv.name}: it is already inlined; cache before inlining")
    fusion = tv.fusion
    uses = fusion.uses_of(tv)
    with fusion:
        cache = TensorView(tv.domain, tv.dtype, MemoryType.Local)
        old_logical = tv.domain.logical_no_reductions
        new_logical = [i.clone() for i in old_logical]
        by_old = dict(zip(old_logical, new_logical))
        alloc = None
        contig = None
        if tv.domain.allocation is not None:
            alloc = [by_old[i] for i in tv.domain.allocation if i in by_old]
            contig = [c for i, c in zip(tv.domain.allocation, tv.domain.contiguity) if i in by_old]
        else:
            contig = [c for i, c in zip(tv.domain.logical, tv.domain.contiguity) if i in by_old]
        tv.domain = TensorDomain(new_logical, allocation=alloc, contiguity=contig)
        d.outputs[d.outputs.index(tv)] = cache
        cache.definition = d
        tv.definition = None
        graph_changed()
        LoadStoreOp(tv, cache)
    for e in uses:
        e.replace_input(tv, cache)
    return cache


def set_memory_type(tv: TensorView, memory_type: MemoryType) -> TensorView:
    """Where tv lives: registers (Local), shared memory, or global memory."""
    if memory_type != MemoryType.Global and (tv.is_input() or tv.is_output()):
        raise ScheduleError(f"set_memory_type on T{tv.name}: fusion inputs and outputs stay in "
                            "global memory")
    d = tv.definition
    if (d is not None and isinstance(d, LoadStoreOp) and d.load_kind.is_async
            and memory_type != MemoryType.Shared):
        what = "TMA" if d.load_kind.is_tma else d.load_kind.value
        raise ScheduleError(f"set_memory_type on T{tv.name}: {what} loads write shared memory only")
    tv.memory_type = memory_type
    return tv

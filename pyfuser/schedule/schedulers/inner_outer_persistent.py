"""Inner-outer persistent scheduler: norm backward (row reductions for dx, column reductions for
dw and db over the same rows), one cooperative kernel, deterministic, no atomics.

Multi-wave variant:

    phase 1, each of G blocks (G = SMs x blocks per SM), rows r = j * G + blockIdx.x:
      rows of x, dy in registers (P x V per thread); row reduction -> dx written;
      column partials dw_part[P][V] += dy * xhat, kept in registers across the block's rows
    after the last row: dw_part -> workspace W[G][N] (global)
    grid sync (cooperative launch: all G blocks resident)
    phase 2, column tiles over blocks (grid-stride): dw[c] = sum over g of W[g][c]

The column reduction's partials are an rfactor over the block's serial row loop; the final
reduction over the G partials is a second loop nest that reads the global workspace.
"""
from __future__ import annotations

import dataclasses

from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.exprs import LoadKind
from ...ir.tensor import MemoryType, TensorView, WarpSpecialized
from .. import (cache_after, cache_before, circular_buffer, inline_at, inline_most,
                parallelize_like, propagate_transforms, rfactor, set_memory_type)
from .base import RuntimeInfo, SchedulerError, reduction_tensors, vector_inputs, vector_width
from .inner_persistent import _project_to_inputs, persistent_batch
from .reduction import broadcast_back

NAME = "inner_outer_persistent"


@dataclasses.dataclass(frozen=True)
class InnerOuterParams:
    vector: int
    persistent_batch: int        # P vectors per thread per row
    bdimx: int                   # threads per row (= blockDim.x)
    grid: int                    # persistent blocks G (all resident)
    vector_inputs: tuple = ()
    row_extents: tuple = ()      # the row length the kernel is specialized on
    col_vector: int = 1          # phase 2: columns per thread
    partials_in_shared: bool = False   # column partials in shared memory instead of registers
    # TMA variant (0 stages: rows loaded into registers). Inputs in `tma_inputs` are copied row
    # by row with 1D bulk copies into a circular buffer of `stages` shared-memory slots over
    # the block's row loop.
    stages: int = 0
    prefetch: int = 0
    tma_inputs: tuple = ()
    warp_specialized: bool = False

    def describe(self) -> str:
        where = "shared memory" if self.partials_in_shared else "registers"
        return (f"inner-outer persistent (multi-wave): {self.grid} persistent blocks of "
                f"{self.bdimx} threads, {self.persistent_batch} x {self.vector} elements per "
                f"thread and row, column partials in {where}, grid sync, column reduction "
                f"by {self.col_vector} columns per thread")


def _kinds(fusion):
    rows, cols = [], []
    for r in reduction_tensors(fusion):
        pattern = [i.is_reduction for i in r.domain.maybe_root]
        if pattern == [False, True]:
            rows.append(r)
        elif pattern == [True, False]:
            cols.append(r)
        else:
            return None, None
    return rows, cols


def can_schedule(fusion) -> tuple[bool, str]:
    rows, cols = _kinds(fusion)
    if rows is None:
        return False, "reductions that are neither row nor column reductions of a 2D domain"
    if not rows or not cols:
        return False, "needs both row and column reductions of the same rows"
    graph = IdGraph(fusion)
    if not any(broadcast_back(fusion, r, graph) for r in rows):
        return False, "no row reduction is broadcast back over the row"
    for v in fusion.inputs:
        dims = [i for i in v.domain.logical if not i.is_broadcast] if isinstance(v, TensorView) else []
        if isinstance(v, TensorView) and len(dims) > 2:
            return False, f"input T{v.name} has more than 2 non-broadcast dims"
    return True, ("row reductions broadcast back (dx) and column reductions (dw, db) of the "
                  "same rows: one persistent cooperative kernel")


def compute_heuristics(fusion, info: RuntimeInfo) -> InnerOuterParams:
    rows, _ = _kinds(fusion)
    root = rows[0].domain.maybe_root
    n = info.extent(root[1].extent)
    vector = vector_width(fusion, n)
    vec_inputs = vector_inputs(fusion, info, vector)
    if not vec_inputs:
        vector = 1
    batch, bdimx = persistent_batch(max(1, -(-n // vector)))
    # The register estimate models the rows of x and dy: the [M, N]-shaped inputs.
    in_bytes = max([v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
                    and sum(1 for i in v.domain.logical if not i.is_broadcast) == 2] + [1])
    threads = -(-bdimx // 32) * 32
    # Registers per thread: rows of x and dy (16-bit) plus float column partials per column
    # reduction; a block must fit the register file (and two if they can).
    col_count = len(_kinds(fusion)[1])
    regs = batch * vector * (in_bytes * 2 // 4 + col_count) + 40
    partials_in_shared = False
    if regs > 255 or regs * threads > 65536:
        # Column partials move to shared memory (one float per column and reduction) when the
        # rows still fit in registers without them: layernorm backward at N = 16384.
        regs = batch * vector * (in_bytes * 2 // 4) + 40
        smem = col_count * batch * vector * threads * 4
        if regs > 255 or regs * threads > 65536 or smem > 200 * 1024:
            raise SchedulerError(
                f"inner-outer persistent: rows of {n} elements need about {regs} registers per "
                f"thread of {threads}; rows this long need a cluster split of the columns")
        partials_in_shared = True
    # One or two blocks per SM: more blocks would make the column partials (G x N floats,
    # written and read once more) and the phase-2 sums over G longer.
    per_sm = max(1, min(2, 65536 // (regs * threads), 2048 // threads))
    grid = info.device.sm_count * per_sm
    m = info.extent(root[0].extent)
    grid = max(1, min(grid, m))
    # Phase 2 gives one column to a thread: N / bdimx column tiles spread over the blocks.
    return InnerOuterParams(vector, batch, bdimx, grid, vec_inputs, (n,), col_vector=1,
                            partials_in_shared=partials_in_shared)


def _phase2_tensors(fusion, cols) -> set:
    out = set()
    stack = list(cols)
    while stack:
        t = stack.pop()
        if t in out:
            continue
        out.add(t)
        stack.extend(fusion.consumers(t))
    return out


def schedule(fusion, p: InnerOuterParams) -> None:
    staged = {k: cache_after(fusion.inputs[k], LoadKind.TmaBulk) for k in p.tma_inputs}
    caches = {k: cache_after(staged.get(k, v)) for k, v in enumerate(fusion.inputs)
              if isinstance(v, TensorView) and fusion.uses_of(v)}
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    rows, cols = _kinds(fusion)
    _project_to_inputs(fusion, set(caches.values()), rows)
    ref = rows[0]
    if p.row_extents:
        fusion.static_extents = {ref.domain.maybe_root[1].extent: p.row_extents[0]}
    phase2 = _phase2_tensors(fusion, cols)
    phase1 = [t for t in fusion.tensors() if t not in phase2 and t not in staged.values()]
    # Phase 1: [i0, r1] -> [ceilDiv(i0, G), G (blockIdx.x), P, ceilDiv(N / V, P) (threadIdx.x), V]
    ref.split(0, p.grid)
    ref.split(2, p.vector).split(2, p.persistent_batch, inner_split=False)
    ref.parallelize(1, PT.BIDx).parallelize(3, PT.TIDx)
    propagate_transforms(ref, tensors=phase1 + cols)
    row_rfs = [rfactor(r, [2, 4]) for r in rows]
    col_rfs = [rfactor(c, [0]) for c in cols]
    if p.partials_in_shared:
        for rf in col_rfs:
            set_memory_type(rf, MemoryType.Shared)
    workspaces = []
    for rf in col_rfs:
        w = cache_after(rf)
        set_memory_type(w, MemoryType.Global)
        propagate_transforms(rf, tensors=[w])
        workspaces.append(w)
    parallelize_like(row_rfs[0], tensors=[t for t in fusion.tensors()
                                          if t not in phase2 or t in col_rfs or t in workspaces],
                     parallel_types={PT.BIDx, PT.TIDx})
    # Phase 2: dw[c] = sum over g of W[g][c]:
    # [G, N] -> [tiles (grid-stride), threadIdx.x, G / 4, 4 (unrolled: loads in flight), V2]
    for c in cols:
        c.domain.loop = list(c.domain.maybe_root)
        c.split(1, p.col_vector).split(1, p.bdimx)
        c.split(0, 4)
        c.reorder([2, 3, 0, 1, 4])
        c.parallelize(0, PT.GridStride).parallelize(1, PT.TIDx)
        rest = [t for t in _phase2_tensors(fusion, [c]) if t is not c]
        propagate_transforms(c, tensors=rest)
        parallelize_like(c, tensors=rest, parallel_types={PT.GridStride, PT.TIDx})
    graph = IdGraph(fusion, permissive=True)
    vec_axis = row_rfs[0].domain.loop[4]

    def vectorize(tv):
        # The axis that maps to the row's vector split (a trailing broadcast dim may follow it).
        pos = next((k for k, i in enumerate(tv.domain.loop) if graph.mapped(i, vec_axis)), None)
        if pos is not None and all(i.is_broadcast for i in tv.domain.loop[pos + 1:]):
            tv.parallelize(pos, PT.Vectorize)
    for k in p.vector_inputs:
        vectorize(caches[k])
    for o in outputs:
        if o not in phase2 and p.vector > 1:
            vectorize(o)
    for slot in staged.values():
        # [i0, N] -> [ceilDiv(i0, G) (serial), G (blockIdx.x), N (bulk)]
        slot.split(0, p.grid)
        slot.parallelize(1, PT.BIDx).parallelize(2, PT.Bulk)
    inline_most([t for t in fusion.tensors() if t not in staged.values()], fusion=fusion)
    kind = WarpSpecialized(PT.TIDy) if p.warp_specialized else None
    for slot in staged.values():
        inline_at(slot, 1)
        circular_buffer(slot, p.stages, p.prefetch, kind=kind)
    batch_axis = row_rfs[0].domain.loop[2]
    for cache in caches.values():
        pos = next((k for k, i in enumerate(cache.domain.loop) if graph.mapped(i, batch_axis)), None)
        if pos is not None and cache.compute_at_pos > pos and not cache.domain.loop[pos].is_broadcast:
            inline_at(cache, pos)
    threads = -(-p.bdimx // 32) * 32
    fusion.launch_hints = {"grid_x": p.grid, "max_threads": threads, "cooperative": True}

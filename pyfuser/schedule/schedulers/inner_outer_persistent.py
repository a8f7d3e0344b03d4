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

Rows too long for one block's registers are split over a thread-block cluster of C blocks
along blockIdx.y (grid G x C): block (g, y) holds columns [y N/C, (y + 1) N/C) of its rows and
of the column partials, its row reductions finish through distributed shared memory (the
cluster reduction of lower/reductions.py, as in the forward scheduler), it writes its slice of
W, and in phase 2 the blocks of blockIdx.y = y sum the columns of that same slice.
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
    # Blocks of a thread-block cluster (along blockIdx.y) sharing each row: each holds N / C
    # columns; the grid is grid x cluster blocks.
    cluster: int = 1
    # Why the heuristic chose this split (explain prints it); not part of the kernel's key.
    reason: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        where = "shared memory" if self.partials_in_shared else "registers"
        text = (f"inner-outer persistent (multi-wave): {self.grid} persistent blocks of "
                f"{self.bdimx} threads, {self.persistent_batch} x {self.vector} elements per "
                f"thread and row, column partials in {where}, grid sync, column reduction "
                f"by {self.col_vector} columns per thread")
        if self.cluster > 1:
            text += (f"; each row split over a cluster of {self.cluster} blocks along blockIdx.y "
                     f"({self.grid} x {self.cluster} blocks), row reductions through distributed "
                     "shared memory, each block's column slice summed by the blocks of its "
                     "blockIdx.y")
        return text + (f"\n  why: {self.reason}" if self.reason else "")


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


def _block_share(share: int, vector: int, in_bytes: int, col_count: int):
    """How a block holds `share` elements of each row: (P, bdimx, threads, registers per
    thread, column partials in shared memory), or None when it cannot; and why, in words."""
    batch, bdimx = persistent_batch(max(1, -(-share // vector)))
    threads = -(-bdimx // 32) * 32
    # Registers per thread: rows of x and dy (16-bit) plus float column partials per column
    # reduction; a block must fit the register file (and two if they can).
    regs = batch * vector * (in_bytes * 2 // 4 + col_count) + 40
    if regs <= 255 and regs * threads <= 65536:
        return ((batch, bdimx, threads, regs, False),
                f"about {regs} registers per thread of {threads}, column partials in registers")
    # Column partials move to shared memory (one float per column and reduction) when the
    # rows still fit in registers without them: layernorm backward at N = 16384.
    rows_regs = batch * vector * (in_bytes * 2 // 4) + 40
    smem = col_count * batch * vector * threads * 4
    rows_fit = rows_regs <= 255 and rows_regs * threads <= 65536
    if rows_fit and smem <= 200 * 1024:
        return ((batch, bdimx, threads, rows_regs, True),
                f"about {rows_regs} registers per thread of {threads}, column partials in "
                f"{smem // 1024} KB of shared memory")
    return None, (f"about {regs} registers per thread of {threads} with the column partials, "
                  f"{rows_regs} without them (at most 255 per thread, 65536 per block)"
                  + (f", and {smem // 1024} KB of shared memory for the partials (at most 200)"
                     if rows_fit else ""))


def compute_heuristics(fusion, info: RuntimeInfo) -> InnerOuterParams:
    rows, _ = _kinds(fusion)
    root = rows[0].domain.maybe_root
    n = info.extent(root[1].extent)
    vector = vector_width(fusion, n)
    vec_inputs = vector_inputs(fusion, info, vector)
    if not vec_inputs:
        vector = 1
    # The register estimate models the rows of x and dy: the [M, N]-shaped inputs.
    in_bytes = max([v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
                    and sum(1 for i in v.domain.logical if not i.is_broadcast) == 2] + [1])
    col_count = len(_kinds(fusion)[1])
    # Rows one block cannot hold are split over a cluster of C blocks along blockIdx.y, C the
    # smallest power of two whose share fits (each block's share a whole number of vectors).
    cluster = 1
    fit, why = _block_share(n, vector, in_bytes, col_count)
    refused = []
    while fit is None and cluster * 2 <= info.device.max_cluster_size \
            and n % (cluster * 2 * vector) == 0:
        refused.append(f"{n // cluster} elements per block need {why}")
        cluster *= 2
        fit, why = _block_share(n // cluster, vector, in_bytes, col_count)
    if fit is None:
        split = f" split over a cluster of {cluster} blocks" if cluster > 1 else ""
        raise SchedulerError(
            f"inner-outer persistent: rows of {n} elements{split}: {n // cluster} elements per "
            f"block need {why}; rows this long need a larger cluster split of the columns")
    batch, bdimx, threads, regs, partials_in_shared = fit
    # One or two blocks per SM: more blocks would make the column partials (G x N floats,
    # written and read once more) and the phase-2 sums over G longer. With a cluster, the
    # G x C blocks of the grid must all be resident (the executor lowers G further when the
    # clusters that really fit at once are fewer).
    per_sm = max(1, min(2, 65536 // (regs * threads), 2048 // threads))
    grid = info.device.sm_count * per_sm // cluster
    m = info.extent(root[0].extent)
    grid = max(1, min(grid, m))
    if cluster > 1:
        reason = (f"a row of {n} elements ({n * in_bytes} bytes per row input) is split over a "
                  f"cluster of {cluster} blocks along blockIdx.y, the smallest that fits: "
                  + "; ".join(refused) + f"; {n // cluster} elements per block take {why}; the "
                  "row reductions go through distributed shared memory")
    else:
        reason = f"a row of {n} elements fits one block: {why}"
    # Phase 2 gives one column to a thread: N / bdimx column tiles spread over the blocks.
    return InnerOuterParams(vector, batch, bdimx, grid, vec_inputs, (n,), col_vector=1,
                            partials_in_shared=partials_in_shared, cluster=cluster,
                            reason=reason)


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
    if p.cluster > 1 and (p.tma_inputs or len(p.row_extents) != 1
                          or p.row_extents[0] % (p.cluster * p.vector)):
        raise SchedulerError(f"inner-outer persistent: a cluster of {p.cluster} blocks per row "
                             "needs register rows of a known length N, N / C a whole number of "
                             f"vectors (row extents {p.row_extents}, TMA inputs {p.tma_inputs})")
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
    # With a cluster of C blocks per row (cy = 1):
    # [ceilDiv(i0, G), G (blockIdx.x), C (blockIdx.y), P, ceilDiv(N / C / V, P) (threadIdx.x), V]
    cy = 1 if p.cluster > 1 else 0
    ref.split(0, p.grid)
    if cy:
        ref.split(2, p.row_extents[0] // p.cluster)
    ref.split(2 + cy, p.vector).split(2 + cy, p.persistent_batch, inner_split=False)
    ref.parallelize(1, PT.BIDx).parallelize(3 + cy, PT.TIDx)
    if cy:
        ref.parallelize(2, PT.BIDy)
    propagate_transforms(ref, tensors=phase1 + cols)
    # The row reductions keep threadIdx.x (a block all-reduce) and, with a cluster, blockIdx.y:
    # the launch's cluster spans it, so lowering reduces it through distributed shared memory.
    row_rfs = [rfactor(r, [2 + cy, 4 + cy]) for r in rows]
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
                     parallel_types={PT.BIDx, PT.TIDx, PT.BIDy})
    # Phase 2: dw[c] = sum over g of W[g][c]:
    # [G, N] -> [tiles (grid-stride), threadIdx.x, G / 4, 4 (unrolled: loads in flight), V2]
    # With a cluster, blockIdx.y takes the column slice it owned in phase 1 (no block sums a
    # column twice): [C (blockIdx.y), tiles of N / C (grid-stride), threadIdx.x, G / 4, 4, V2]
    for c in cols:
        c.domain.loop = list(c.domain.maybe_root)
        if cy:
            c.split(1, p.row_extents[0] // p.cluster)
        c.split(1 + cy, p.col_vector).split(1 + cy, p.bdimx)
        c.split(0, 4)
        c.reorder([2, 3, 4, 0, 1, 5] if cy else [2, 3, 0, 1, 4])
        c.parallelize(cy, PT.GridStride).parallelize(1 + cy, PT.TIDx)
        if cy:
            c.parallelize(0, PT.BIDy)
        rest = [t for t in _phase2_tensors(fusion, [c]) if t is not c]
        propagate_transforms(c, tensors=rest)
        parallelize_like(c, tensors=rest, parallel_types={PT.GridStride, PT.TIDx, PT.BIDy})
    graph = IdGraph(fusion, permissive=True)
    vec_axis = row_rfs[0].domain.loop[4 + cy]

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
    batch_axis = row_rfs[0].domain.loop[2 + cy]
    for cache in caches.values():
        pos = next((k for k, i in enumerate(cache.domain.loop) if graph.mapped(i, batch_axis)), None)
        if pos is not None and cache.compute_at_pos > pos and not cache.domain.loop[pos].is_broadcast:
            inline_at(cache, pos)
    threads = -(-p.bdimx // 32) * 32
    fusion.launch_hints = {"grid_x": p.grid, "max_threads": threads, "cooperative": True}
    if cy:
        fusion.launch_hints["cluster"] = (1, p.cluster, 1)

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

from ...kir.registers import default_register_split
from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.exprs import LoadKind
from ..cache import cached_uses
from ...ir.tensor import MemoryType, TensorView, WarpSpecialized
from .. import (cache_after, cache_before, circular_buffer, inline_at, inline_most,
                parallelize_like, propagate_transforms, rfactor, set_allocation_domain,
                set_memory_type)
from ..tma_rules import MAX_TX_BYTES
from .base import (RuntimeInfo, SchedulerError, iterates_rows, orient_vector_inputs,
                   reduction_tensors, reference_reduction, vector_inputs, vector_width,
                   vectorize_along)
from .inner_persistent import _project_to_inputs, persistent_batch
from .inner_persistent import _tma_rows as tma_rows
from .reduction import broadcast_back, is_over_reduced_tensor_dims

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
    compute_rows: int = 0        # rows per block along threadIdx.y (0: none, one row at a time)
    # Blocks of a thread-block cluster (along blockIdx.y) sharing each row: each holds N / C
    # columns; the grid is grid x cluster blocks.
    cluster: int = 1
    # Resident blocks per SM the grid plans, given to ptxas as the launch bounds' minimum so
    # that it fits the registers to them (0: no minimum, ptxas takes what one block allows).
    blocks_per_sm: int = 0
    # Why the heuristic chose this variant (explain prints it); not part of the kernel's key.
    reason: str = dataclasses.field(default="", compare=False)

    @property
    def variant(self) -> str:
        return "warp-specialized" if self.warp_specialized else "multi-wave"

    def describe(self) -> str:
        where = "shared memory" if self.partials_in_shared else "registers"
        rows = (f"{self.compute_rows} compute rows of {self.bdimx} threads"
                if self.compute_rows > 1 else f"{self.bdimx} threads")
        loads = ("" if not self.stages else
                 f", rows of inputs {list(self.tma_inputs)} copied by TMA into {self.stages} "
                 "stages of shared memory"
                 + (" by a producer warp group" if self.warp_specialized else ""))
        text = (f"inner-outer persistent ({self.variant}): {self.grid} persistent blocks of "
                f"{rows}, {self.persistent_batch} x {self.vector} elements per thread and row"
                f"{loads}, column partials in {where}, grid sync, column sums in tiles of "
                f"{self.col_vector} column(s) reduced by the whole block")
        if self.cluster > 1:
            text += (f"; each row split over a cluster of {self.cluster} blocks along blockIdx.y "
                     f"({self.grid} x {self.cluster} blocks), row reductions through distributed "
                     "shared memory, each block's column slice summed by the blocks of its "
                     "blockIdx.y")
        return text + (f"\n  why: {self.reason}" if self.reason else "")


# Warp-specialized variant: compute threads are two or three warp groups along threadIdx.y,
# tried in this order. One compute warp group beside the producer's is 256 threads, which get
# 248 registers each at entry: setmaxnreg would have nothing to move (compute may not exceed
# 240), so that configuration is not offered.
WARP_GROUP = 128
WS_COMPUTE_THREADS = (256, 384)
WS_THREE_GROUPS_ROW_BYTES = 8 * 1024     # x and dy of a row at most this: three compute groups
WS_STAGES = 4
# Registers a compute thread needs besides its rows, partials and weights (indices, the row's
# reduction, loop state): from the ptxas reports of the forward kernels.
WS_BASE_REGISTERS = 40


def _row_inputs(fusion) -> tuple:
    return tuple(k for k, v in enumerate(fusion.inputs)
                 if isinstance(v, TensorView) and cached_uses(v)
                 and sum(1 for i in v.domain.logical if not i.is_broadcast) == 2)


def _tma_rows(fusion, info: RuntimeInfo) -> tuple[tuple, list]:
    """The row inputs ([M, N]) 1D bulk copies can load (inner_persistent's rules), and why the
    others cannot."""
    rows, problems = tma_rows(fusion, info, (1,))
    for k in _row_inputs(fusion):
        if len(fusion.inputs[k].domain.logical) != 2:
            problems.append(f"input {k} has size-1 dims besides its rows (its slot would need "
                            "their loops)")
    return rows, problems


def warp_specialized_params(fusion, info: RuntimeInfo, p: InnerOuterParams
                            ) -> tuple[InnerOuterParams | None, list]:
    """The warp-specialized parameters, or None and why not. Knobs (nvFuser's names):
    bdimx (threads per row, from the row split), bdimy (compute rows, one per compute row of a
    stage), n_stages (WS_STAGES, fewer when shared memory holds fewer), and, fixed
    here, iter_unroll = 1, is_circular_buffer_regs_cached = True (a row is read from its slot
    into registers once), is_non_circular_buffer_gmem_to_regs = True (weights loaded once per
    block into registers). Compute warp groups are tried in WS_COMPUTE_THREADS order; a
    configuration is good when it keeps at least 2 stages and its register estimate fits
    what setmaxnreg can give the compute threads."""
    n = p.row_extents[0]
    rows, problems = _tma_rows(fusion, info)
    if set(rows) != set(_row_inputs(fusion)) or not rows:
        return None, problems or ["no row input"]
    if p.partials_in_shared:
        return None, ["column partials in shared memory (rows this long leave no room for stages)"]
    if p.cluster > 1:
        return None, [f"rows split over a cluster of {p.cluster} blocks"]
    bdimx, batch = p.bdimx, p.persistent_batch
    if WARP_GROUP % bdimx and bdimx % WARP_GROUP:
        return None, [f"{bdimx} threads per row neither divide 128 nor are a multiple of it"]
    elems = batch * p.vector
    row_bytes = sum(fusion.inputs[k].dtype.size for k in rows)
    weight_bytes = sum(v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
                       and sum(1 for i in v.domain.logical if not i.is_broadcast) == 1
                       and not any(i.is_broadcast for i in v.domain.logical))
    cols = len(_kinds(fusion)[1])
    need = elems * row_bytes // 4 + elems * cols + -(-elems * weight_bytes // 4) + WS_BASE_REGISTERS
    budget = info.device.max_shared_memory_per_block_optin - 8 * 1024
    tried = []
    # Short rows want three compute warp groups (more rows in flight per stage): rmsnorm 1024
    # and 2048, 1519 / 2057 GB/s against 1280 / 1932 with two; at 4096 two were faster (2457
    # against 2348). Sweep named at WS_AUTO.
    order = WS_COMPUTE_THREADS if n * row_bytes > WS_THREE_GROUPS_ROW_BYTES else (384, 256)
    for compute in order:
        if compute % bdimx:
            continue
        y = compute // bdimx
        producer = WARP_GROUP if bdimx <= WARP_GROUP else bdimx
        total = compute + producer
        _, _, c_regs = default_register_split(compute, producer)
        stage_bytes = y * n * row_bytes
        # Stages: 3-4 were best in the sweep (2 lost 1-2%, 6-8 gained nothing).
        stages = min(WS_STAGES, budget // stage_bytes)
        why = []
        if stages < 2:
            why.append(f"two stages of {stage_bytes} bytes exceed {budget} bytes of shared memory")
        if stage_bytes > MAX_TX_BYTES:
            why.append(f"a stage of {stage_bytes} bytes exceeds one mbarrier phase")
        if need > c_regs:
            why.append(f"about {need} registers per compute thread, setmaxnreg gives {c_regs}")
        if total > 1024:
            why.append(f"{total} threads per block")
        if why:
            tried.append(f"{y} compute row(s) of {bdimx}: " + ", ".join(why))
            continue
        # One block per SM (setmaxnreg splits the SM's register file), at most one per row.
        return dataclasses.replace(
            p, stages=stages, prefetch=stages - 1, tma_inputs=rows, warp_specialized=True,
            compute_rows=y, grid=min(info.device.sm_count, p.grid)), []
    return None, tried or [f"no compute warp-group count fits rows of {bdimx} threads"]


def _kinds(fusion, graph=None):
    """(row reductions, column reductions) of the same rows, or (None, why not).

    The rows are the [M, N] dims of the reference reduction, the first whose logical dims are
    [kept, reduced] and whose kept dim iterates where one does (`reference_reduction`: the one
    schedule() splits, first in the list); every reduction is classified by
    which of those dims its own reduced and kept dims are (exact ID graph, the mapping the
    schedule is replayed through), not by their logical order: a sum over dim 0 of a permuted
    view [N, M] of the rows reduces N, a row reduction."""
    reds = reduction_tensors(fusion)
    if any(len(r.domain.maybe_root) != 2 for r in reds):
        return None, "reductions that are neither row nor column reductions of a 2D domain"
    row_shaped = [r for r in reds if [i.is_reduction for i in r.domain.maybe_root]
                  == [False, True]]
    ref = reference_reduction(row_shaped) if row_shaped else None
    if ref is None:
        if all([i.is_reduction for i in r.domain.maybe_root] == [True, False] for r in reds):
            return [], reds        # column reductions only
        return None, "reductions that are neither row nor column reductions of a 2D domain"
    graph = graph or IdGraph(fusion)
    m, n = ref.domain.maybe_root
    rows, cols = [], []
    for r in reds:
        red = [i for i in r.domain.maybe_root if i.is_reduction]
        kept = [i for i in r.domain.maybe_root if not i.is_reduction]
        if len(red) != 1:
            return None, "reductions that are neither row nor column reductions of a 2D domain"
        # A row reduction of a one-row tensor ([1, N], its row dim a broadcast, as
        # `from_pytorch` defines a batch of 1) broadcast against the rows: the same row for
        # every row of the schedule.
        if graph.mapped(red[0], n) and (graph.mapped(kept[0], m) or kept[0].is_broadcast):
            rows.append(r)
        elif graph.mapped(red[0], m) and graph.mapped(kept[0], n):
            cols.append(r)
        else:
            return None, (f"T{r.name} is neither a row nor a column reduction of the [M, N] "
                          f"rows T{ref.name} reduces (its dims are other tensors')")
    rows.sort(key=lambda r: r is not ref)
    return rows, cols


def _phase2_problem(fusion, cols, graph) -> str:
    """Why phase 2 (the column sums, after the grid sync; schedule() gives every tensor computed
    from a column reduction the column loops [G partials, N]) cannot compute the fusion's
    tensors downstream of the column reductions, or "". A column statistic broadcast back over
    the rows (the mean of a column variance, a column normalization) would need the column
    all-reduce before the rows' pass."""
    m = next(i for i in cols[0].domain.maybe_root if i.is_reduction)
    for c in cols:
        for t in _phase2_tensors(fusion, [c]):
            if t is not c and any(graph.mapped(i, m) for i in t.domain.logical
                                  if not i.is_broadcast):
                return (f"the column reduction T{c.name} is broadcast back over the rows "
                        f"(T{t.name} uses it along them): a column statistic the rows need "
                        "again is not supported yet")
    return ""


def can_schedule(fusion) -> tuple[bool, str]:
    graph = IdGraph(fusion)
    rows, cols = _kinds(fusion, graph)
    if rows is None:
        return False, cols
    if not rows or not cols:
        return False, "needs both row and column reductions of the same rows"
    if not any(broadcast_back(fusion, r, graph) for r in rows):
        return False, "no row reduction is broadcast back over the row"
    why = _phase2_problem(fusion, cols, graph)
    if why:
        return False, why
    for v in fusion.inputs:
        dims = [i for i in v.domain.logical if not i.is_broadcast] if isinstance(v, TensorView) else []
        if isinstance(v, TensorView) and len(dims) > 2:
            return False, f"input T{v.name} has more than 2 non-broadcast dims"
    for t in fusion.tensors():
        # Every tensor is given the [M, N] rows' loops: one over other dims (a gather's
        # output [13, N] beside rows [2039, N], its index input) has no place in them; lowering
        # refused it a register buffer of runtime size (CPU fuzz 2640:363).
        if not is_over_reduced_tensor_dims(t, rows[0], graph):
            return False, (f"T{t.name} iterates dims other than the reductions' rows and "
                           "columns (a gather's index dims): it is not within the rows' tiles")
    return True, ("row reductions broadcast back (dx) and column reductions (dw, db) of the "
                  "same rows: one persistent cooperative kernel")


def _block_share(share: int, vector: int, in_bytes: int, col_count: int):
    """How a block holds `share` elements of each row: (P, bdimx, threads, registers per
    thread, column partials in shared memory), or None when it cannot; and why, in words."""
    batch, bdimx = persistent_batch(max(1, -(-share // vector)))
    threads = -(-bdimx // 32) * 32
    # Registers per thread: rows of x and dy plus float column partials per column reduction;
    # a block must fit the register file (and two if they can).
    row_regs = _row_registers(vector, in_bytes)
    regs = batch * vector * (row_regs + col_count) + 40
    if regs <= 255 and regs * threads <= 65536:
        return ((batch, bdimx, threads, regs, False),
                f"about {regs} registers per thread of {threads}, column partials in registers")
    # Column partials move to shared memory (one float per column and reduction) when the
    # rows still fit in registers without them: layernorm backward at N = 16384.
    rows_regs = batch * vector * row_regs + 40
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


# Elements per thread (of each row) up to which the two-block plan is taken: measured at 15
# (layernorm backward fp16 at 5121); at 29 (fuzz 20263730:140, a norm backward of 9225-element
# rows with more ops than layernorm's) ptxas spilled 272 B at the two blocks' 96 registers
# although the estimate said 93.
MAX_TWO_BLOCK_ELEMENTS = 16


def _two_blocks_with_shared_partials(fusion, info: RuntimeInfo, row_dim, vecs: int,
                                     vector: int, vec_inputs: tuple, in_bytes: int,
                                     col_count: int, threads: int):
    """(elements per thread, threads per row, registers per thread, why) when moving the column
    partials to shared memory lets two blocks per SM hold their register rows of `vecs`
    vectors, for 16-bit rows TMA cannot copy; else None.

    Why: with register rows one block per SM loads a row, reduces it twice and stores it with
    the memory idle in between; a second resident block overlaps its rows with the first's
    (layernorm backward fp16 [4096, 5121], 11 warps, H200: 146 us with the partials in
    registers and one block per SM, 113 us with them in shared memory and two blocks of 16 x
    321, 92 us with 15 x 342 (below); eager 127 us;
    bench/results/2026-11-29/h200-odd-rows-session16.txt). Rows TMA can copy (16-byte
    aligned) overlap through their stages instead (tma_rows_params), which need the shared
    memory, so they keep their partials in registers. fp32 rows are not taken: layernorm
    backward fp32 at N = 4097 spilled 12 B at the two blocks' 96 registers (ptxas), and is not
    measured.

    The registers are estimated from every row ([M, N]) and weight ([N]) input, and compared
    with what ptxas gives two blocks, both fitted to ptxas reports: layernorm backward at 5121
    (15 x 342, 80 registers, no spill) fits; fuzz cases 20263710:168 (N = 9090, a strided
    weight read element by element), :177 (29 elements per thread) and :34 spilled 40-128 B
    at 72-96 registers and do not."""
    if not _tma_rows(fusion, info)[1] or in_bytes != 2:
        return None
    # The fewest elements per thread that the block's whole warps hold: a row of 5121 takes
    # 11 warps either way, as 16 x 321 threads or 15 x 342 (ptxas at two blocks per SM: 80
    # registers and 28 B of spill loads for 16, none for 15).
    batch = -(-vecs // threads)
    bdimx = -(-vecs // batch)
    if batch * vector > MAX_TWO_BLOCK_ELEMENTS:
        return None
    rows_regs = int(batch * vector * _element_registers(fusion, row_dim, vector, vec_inputs)) + 35
    smem = col_count * batch * vector * threads * 4
    # ptxas's registers for two blocks: the threads in pairs of warps (352 -> 384: 80,
    # 288 -> 320: 96 registers, as its reports show).
    two_block_cap = 65536 // (2 * -(-threads // 64) * 64) // 8 * 8
    if rows_regs > two_block_cap or 2 * threads > 2048 \
            or 2 * (smem + TMA_SMEM_RESERVE) > info.device.shared_memory_per_sm:
        return None
    return batch, bdimx, rows_regs, (
        f"about {rows_regs} registers per thread of {threads}, column partials in "
        f"{smem // 1024} KB of shared memory so that two blocks per SM fit")


def _element_registers(fusion, row_dim, vector: int, vec_inputs: tuple) -> float:
    """Registers a thread holds per row element: one per element of each input along the row
    (`row_dim`: rows [M, N], weights [N] or [1, N]), a register of its own unless it is loaded
    in vectors (then packed, 4 bytes to a register). Per-row scalars ([M, 1]: mean, rstd) take
    one register per row, not per element, and are not counted."""
    graph = IdGraph(fusion)
    out = 0.0
    for k, v in enumerate(fusion.inputs):
        if not isinstance(v, TensorView) or not cached_uses(v):
            continue
        if any(graph.mapped(i, row_dim) for i in v.domain.logical if not i.is_broadcast):
            out += v.dtype.size / 4 if vector > 1 and k in vec_inputs else 1
    return out


def _row_registers(vector: int, in_bytes: int) -> int:
    """Registers per row element of x and dy together. 16-bit elements pack two to a register
    only in vectors: without (odd rows) each takes a register of its own (layernorm backward
    fp16 at N = 5121: 128 registers, where two to a register estimated 88)."""
    return -(-in_bytes * 2 // 4) if vector > 1 else 2


def compute_heuristics(fusion, info: RuntimeInfo) -> InnerOuterParams:
    """The multi-wave parameters, then the choice between them and the warp-specialized
    variant (choose_variant)."""
    p = multi_wave_params(fusion, info)
    return choose_variant(fusion, info, p)


def multi_wave_params(fusion, info: RuntimeInfo) -> InnerOuterParams:
    rows, _ = _kinds(fusion)
    root = reference_reduction(rows).domain.maybe_root
    n = info.extent(root[1].extent)
    vector = vector_width(fusion, n, root[1])
    vec_inputs = vector_inputs(fusion, info, vector, root[1])
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
    # ptxas is told the blocks per SM only where a plan was measured to want them (here, and
    # the TMA rows' stages): elsewhere it takes the registers it likes and the executor fits the
    # grid to the occupancy. Asked for two where the estimate said two, it spilled rows that
    # fit one block (layernorm backward bf16 at N = 4097: 48 B at 96 registers).
    blocks_per_sm = 0
    if per_sm == 1 and cluster == 1 and not partials_in_shared:
        two = _two_blocks_with_shared_partials(fusion, info, root[1], -(-n // vector),
                                               vector, vec_inputs, in_bytes, col_count,
                                               threads)
        if two:
            batch, bdimx, regs, why = two
            partials_in_shared, per_sm, blocks_per_sm = True, 2, 2
    # Not fewer blocks than that when the rows are few: a block without rows writes zero
    # partials, and phase 2 (the column sums) needs the blocks (rmsnorm_bwd 1 x 4096 took
    # 268 us with its grid capped to the one row, against 27.5 us for 264 x 4096).
    grid = max(1, info.device.sm_count * per_sm // cluster)
    if cluster > 1:
        reason = (f"a row of {n} elements ({n * in_bytes} bytes per row input) is split over a "
                  f"cluster of {cluster} blocks along blockIdx.y, the smallest that fits: "
                  + "; ".join(refused) + f"; {n // cluster} elements per block take {why}; the "
                  "row reductions go through distributed shared memory")
    else:
        reason = f"a row of {n} elements fits one block: {why}"
    return InnerOuterParams(vector, batch, bdimx, grid, vec_inputs, (n,),
                            col_vector=phase2_columns(n // cluster, grid, bdimx,
                                                      whole_tiles=cluster > 1,
                                                      bounded=blocks_per_sm > 0),
                            partials_in_shared=partials_in_shared, cluster=cluster,
                            blocks_per_sm=blocks_per_sm, reason=reason)


def phase2_columns(n: int, grid: int, threads: int = 128, whole_tiles: bool = False,
                   bounded: bool = False) -> int:
    """Columns per phase-2 tile: a power of two (one grouped block all-reduce of that many
    sums) that still leaves at least one tile per block; at most 8, and 4 for blocks of 512
    threads or more (128 registers each: 8 sums spilled layernorm fp32 65536, ptxas report).

    The tiles need not divide the row: the last tile of an odd row (N = 5121) is predicated
    column by column. One column per tile there read 4 bytes of every 32-byte sector of the
    [G, N] float workspace (its rows are N floats apart) and took N grid-stride steps of a
    block all-reduce each (5121 against 2561 with tiles of 2, 641 with tiles of 8: layernorm
    backward fp16 at [4096, 5121] 159 -> 146 us on the H200). Tiles wider than 2 that do not
    divide the row are taken only where ptxas is `bounded` by the launch bounds' blocks per SM:
    without, it put the tile's sums on the stack at 96 registers (rmsnorm backward bf16 at
    N = 4097 with tiles of 4 or 8: 24 B; layernorm backward fp32 at 4097: 12 B), with them not.
    `whole_tiles`: the tiles must divide n (a cluster's column slice: its last tile's predicate
    would be on the whole row, not on the slice)."""
    c, limit = 1, (8 if threads < 512 else 4)
    while c < limit and -(-n // (2 * c)) >= grid and (
            n % (2 * c) == 0 or (not whole_tiles and (c == 1 or bounded))):
        c *= 2
    return c


# Multi-wave rows through a TMA circular buffer (instead of register loads) by row length:
# (largest N, stages, blocks per SM), from the sweep of 2026-11-23 (bench/results/
# 2026-11-23-h100-sweep-inner-outer.md): with two blocks per SM the next rows' copies overlap
# the current row's reductions and stores (rmsnorm_bwd 4096: 2627 against 2309 GB/s with
# register rows); at N = 8192 one block of 3 stages is best; from 16384 register rows are
# as fast (rmsnorm) or the stages no longer fit (layernorm's partials in shared memory).
TMA_ROWS = ((4096, 4, 2), (8192, 3, 1))
TMA_SMEM_RESERVE = 8 * 1024      # block reductions and mbarriers beside the stages


def tma_rows_params(fusion, info: RuntimeInfo, p: InnerOuterParams) -> tuple[InnerOuterParams, str]:
    """The multi-wave parameters with rows copied by TMA when TMA_ROWS has the row length and
    the rows obey the bulk-copy rules; else `p` (register rows) and why."""
    n = p.row_extents[0]
    pick = next(((st, per_sm) for limit, st, per_sm in TMA_ROWS if n <= limit), None)
    if pick is None:
        return p, f"register rows: rows of {n} elements measured as fast without TMA stages"
    rows, problems = _tma_rows(fusion, info)
    if problems or not rows:
        return p, "register rows: " + ("; ".join(problems) or "no row input")
    if p.partials_in_shared:
        return p, "register rows: the column partials take the shared memory"
    if p.cluster > 1:
        return p, f"register rows: each row split over a cluster of {p.cluster} blocks"
    stages, per_sm = pick
    stage_bytes = n * sum(fusion.inputs[k].dtype.size for k in rows)
    while stages > 2 and per_sm * (stages * stage_bytes + TMA_SMEM_RESERVE) > \
            info.device.shared_memory_per_sm:
        stages -= 1
    if per_sm * (stages * stage_bytes + TMA_SMEM_RESERVE) > info.device.shared_memory_per_sm:
        return p, f"register rows: {stages} stages of {stage_bytes} bytes do not fit"
    return dataclasses.replace(p, stages=stages, prefetch=stages - 1, tma_inputs=rows,
                               grid=info.device.sm_count * per_sm, blocks_per_sm=per_sm), (
        f"rows copied by TMA into {stages} stages, {per_sm} persistent block(s) per SM")


def choose_variant(fusion, info: RuntimeInfo, p: InnerOuterParams) -> InnerOuterParams:
    """Multi-wave or warp-specialized. PYFUSER_ENABLE / DISABLE=ws_normalization (or a per-call
    option) forces the choice; a forced warp-specialized choice that is not possible says why
    and runs multi-wave. Otherwise WS_AUTO (measured on the H100) decides."""
    forced = info.feature("ws_normalization")
    n = p.row_extents[0]
    if forced is not False:
        ws, problems = warp_specialized_params(fusion, info, p)
        if ws is not None and (forced or _ws_wins(fusion, n)):
            why = ("warp-specialized forced on (ws_normalization)" if forced else
                   f"warp-specialized: measured faster than multi-wave for rows of {n} "
                   "(WS_AUTO)")
            return dataclasses.replace(ws, reason=why + f", {ws.stages} stages of "
                                       f"{ws.compute_rows} row(s), one block per SM"
                                       + (f"; {p.reason}" if p.reason else ""))
        if forced:
            mw, how = tma_rows_params(fusion, info, p)
            return dataclasses.replace(mw, reason="warp-specialized forced on but not possible ("
                                       + "; ".join(problems) + "): multi-wave, " + how
                                       + (f"; {p.reason}" if p.reason else ""))
        why_not = ("warp-specialized not possible (" + "; ".join(problems) + ")" if ws is None
                   else f"multi-wave measured faster than warp-specialized for rows of {n}")
    else:
        why_not = "warp-specialized disabled (PYFUSER_DISABLE=ws_normalization)"
    mw, how = tma_rows_params(fusion, info, p)
    return dataclasses.replace(mw, reason=f"multi-wave: {why_not}; {how}"
                               + (f"; {p.reason}" if p.reason else ""))


# Where the warp-specialized variant beat multi-wave (rows through TMA, 2 blocks per SM) on the
# H100, sweep of 2026-11-23 (bench/results/2026-11-23-h100-sweep-inner-outer.md), as
# (column reductions at least, rows of at most N elements): layernorm backward (dw and db) at
# N = 1024, 995 against 960 GB/s. Everywhere else multi-wave was as fast or faster: rmsnorm
# 1024-4096 by 1-5%, layernorm 4096 by 9%, both at 8192 by 0.3-1.6%; at 2048 layernorm
# was a tie (1497 / 1486).
WS_AUTO = ((2, 1024),)


def _ws_wins(fusion, n: int) -> bool:
    cols = len(_kinds(fusion)[1])
    return any(cols >= c and n <= limit for c, limit in WS_AUTO)


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
    orient_vector_inputs(fusion, p.vector_inputs, _kinds(fusion)[0][0].domain.maybe_root[1])
    staged = {k: cache_after(fusion.inputs[k], LoadKind.TmaBulk) for k in p.tma_inputs}
    caches = {k: cache_after(staged.get(k, v)) for k, v in enumerate(fusion.inputs)
              if isinstance(v, TensorView) and cached_uses(v)}
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    rows, cols = _kinds(fusion)
    _project_to_inputs(fusion, set(caches.values()), rows)
    ref = reference_reduction(rows)
    rows = [ref] + [r for r in rows if r is not ref]      # row_rfs[0] is the reference's
    if p.row_extents:
        fusion.static_extents = {ref.domain.maybe_root[1].extent: p.row_extents[0]}
    phase2 = _phase2_tensors(fusion, cols)
    phase1 = [t for t in fusion.tensors() if t not in phase2 and t not in staged.values()]
    # Phase 1: [i0, r1] -> [ceilDiv(i0, G * Y), G (blockIdx.x), Y (threadIdx.y), P,
    #                       ceilDiv(N / V, P) (threadIdx.x), V]; row j * G * Y + bx * Y + ty.
    # Y = 1 is a plain split (no threadIdx.y axis). With a cluster of C blocks per row (no
    # compute rows then):
    # [ceilDiv(i0, G), G (blockIdx.x), C (blockIdx.y), P, ceilDiv(N / C / V, P) (threadIdx.x), V]
    rows_y = p.compute_rows
    y = 1 if rows_y > 1 else 0
    cy = 1 if p.cluster > 1 else 0
    if y and cy:
        raise SchedulerError("inner-outer persistent: compute rows along threadIdx.y and a "
                             "cluster split of the rows do not go together")
    off = y + cy      # axes between blockIdx.x and the row split
    ref.split(0, p.grid * max(rows_y, 1))
    if y:
        ref.split(1, rows_y)
    if cy:
        ref.split(2, p.row_extents[0] // p.cluster)
    ref.split(2 + off, p.vector).split(2 + off, p.persistent_batch, inner_split=False)
    ref.parallelize(1, PT.BIDx).parallelize(3 + off, PT.TIDx)
    if y:
        ref.parallelize(2, PT.TIDy)
    if cy:
        ref.parallelize(2, PT.BIDy)
    propagate_transforms(ref, tensors=phase1 + cols)
    # The row reductions keep threadIdx.x (a block all-reduce) and, with a cluster, blockIdx.y:
    # the launch's cluster spans it, so lowering reduces it through distributed shared memory.
    row_rfs = [rfactor(r, [2 + off, 4 + off]) for r in rows]
    col_rfs = [rfactor(c, [0]) for c in cols]
    if p.partials_in_shared:
        for rf in col_rfs:
            set_memory_type(rf, MemoryType.Shared)
            # threadIdx.x innermost in shared memory: a warp's read-modify-write of its
            # partials touches 32 consecutive floats (one wavefront). In the loop order
            # [P, threadIdx.x, V] the lanes were V floats apart: an 8-way bank conflict on
            # every access (layernorm backward at N = 16384 ran at 1029 GB/s).
            tidx = rf.domain.loop[3 + off]
            set_allocation_domain(rf, [i for i in rf.domain.loop if i is not tidx] + [tidx])
    workspaces = []
    for rf in col_rfs:
        w = cache_after(rf)
        set_memory_type(w, MemoryType.Global)
        propagate_transforms(rf, tensors=[w])
        workspaces.append(w)
    bound = {PT.BIDx, PT.TIDx} | ({PT.TIDy} if y else set()) | ({PT.BIDy} if cy else set())
    parallelize_like(row_rfs[0], tensors=[t for t in fusion.tensors()
                                          if t not in phase2 or t in col_rfs or t in workspaces],
                     parallel_types=bound)
    # Phase 2: dw[c] = sum over g of W[g][c], a tile of C = col_vector columns per step:
    # [G, N] -> [N / C tiles (grid-stride), G / bdimx, bdimx (threadIdx.x), C]: each thread
    # sums its share of the G partials of C columns (independent loads in flight), then one
    # grouped block all-reduce of the C sums. With compute rows, W is [G, Y, N] (merged to
    # G * Y partials) and the rows of threads take different tiles:
    # [tiles / Y (grid-stride), Y (threadIdx.y), G * Y / bdimx, bdimx (threadIdx.x), C].
    # With a cluster, blockIdx.y takes the column slice it owned in phase 1 (no block sums a
    # column twice): [slice (blockIdx.y), tiles of N / slices (grid-stride), G / bdimx,
    # bdimx (threadIdx.x), C].
    # One column per thread and G serial loads each (the first layout) left phase 2 to
    # N / bdimx blocks: 10-35 us per kernel at N = 1024-4096 (sweep of 2026-11-23: the time at
    # M = 2048 against M = 16384).
    for c in cols:
        # [G partials (reduced), N]: a column reduction of a permuted view [N, M] has its
        # partials' dim second in its root.
        root = c.domain.maybe_root
        c.domain.loop = [i for i in root if i.is_reduction] + [i for i in root
                                                                if not i.is_reduction]
        if y:
            c.merge(0)
        if cy:
            c.split(1, p.row_extents[0] // p.cluster)
        c.split(1 + cy, p.col_vector)
        if y:
            c.split(1, rows_y)
        c.split(0, p.bdimx)
        if y:
            c.reorder([2, 3, 0, 1, 4])
            c.parallelize(1, PT.TIDy).parallelize(3, PT.TIDx).parallelize(0, PT.GridStride)
        elif cy:
            c.reorder([2, 3, 0, 1, 4])
            c.parallelize(0, PT.BIDy).parallelize(1, PT.GridStride).parallelize(3, PT.TIDx)
        else:
            c.reorder([2, 0, 1, 3])
            c.parallelize(0, PT.GridStride).parallelize(2, PT.TIDx)
        rest = [t for t in _phase2_tensors(fusion, [c]) if t is not c]
        propagate_transforms(c, tensors=rest)
        parallelize_like(c, tensors=rest,
                         parallel_types={PT.GridStride, PT.TIDx, PT.TIDy, PT.BIDy})
    graph = IdGraph(fusion, permissive=True)
    vec_axis = row_rfs[0].domain.loop[4 + off]
    if p.vector > 1:
        for k in p.vector_inputs:
            vectorize_along(caches[k], vec_axis, graph, p.vector)
        for o in outputs:
            if o not in phase2:
                vectorize_along(o, vec_axis, graph, p.vector)
    for slot in staged.values():
        # [i0, N] -> [ceilDiv(i0, G * Y) (serial), G (blockIdx.x), (Y (serial: one thread copies
        # the stage's rows),) N (bulk)]
        slot.split(0, p.grid * max(rows_y, 1))
        if y:
            slot.split(1, rows_y)
        slot.parallelize(1, PT.BIDx).parallelize(2 + y, PT.Bulk)
    inline_most([t for t in fusion.tensors() if t not in staged.values()], fusion=fusion)
    kind = WarpSpecialized(PT.TIDy) if p.warp_specialized else None
    for slot in staged.values():
        inline_at(slot, 1)
        circular_buffer(slot, p.stages, p.prefetch, kind=kind)
    batch_axis = row_rfs[0].domain.loop[2 + off]
    exact = IdGraph(fusion)
    for cache in caches.values():
        pos = next((k for k, i in enumerate(cache.domain.loop) if graph.mapped(i, batch_axis)), None)
        if pos is None or cache.domain.loop[pos].is_broadcast:
            continue
        if not iterates_rows(cache, ref, exact):
            # Weights, and a one-row input ([1, N]) broadcast over the rows of the others:
            # loaded once per block, before the row loop (outside its own broadcast row
            # loops, which run once), and kept in registers.
            pos = 0
        if cache.compute_at_pos > pos:
            inline_at(cache, pos)
    threads = p.bdimx * max(rows_y, 1)
    fusion.launch_hints = {"grid_x": p.grid, "max_threads": threads, "cooperative": True}
    if p.blocks_per_sm:
        fusion.launch_hints["min_blocks"] = p.blocks_per_sm
    if cy:
        fusion.launch_hints["cluster"] = (1, p.cluster, 1)

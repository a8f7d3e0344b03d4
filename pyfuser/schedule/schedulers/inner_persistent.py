"""Inner persistent scheduler: normalizations and softmax, one row on chip between reductions.

Fusions whose row reductions are broadcast back over the row (RMSNorm, LayerNorm, softmax).
Each row is loaded once into registers and reused after every reduction over it:

    for blockIdx.x: for threadIdx.y (rows of the block):
      x_regs[P][V] = 16-byte loads of the row            <- all P loads issued together
      partial = sum over P, V of f(x_regs)               <- per thread
      s = block_allreduce_x(partial)                     <- the row's reduction
      out[row, ...] = g(x_regs, s)                       <- 16-byte stores

The row is split as P (a constant: registers need one) x threadIdx.x (ceilDiv(N / V, P)) x V.
Persistent buffers are projected to the inputs: a float tensor used before and after a
reduction is recomputed from the (bf16) input cache, which halves the registers a row needs.

Limit: V is the widest access every row start allows. A dense row of 16-bit elements whose
length N is odd starts at an odd element offset every other row, so V = 1 (2-byte loads,
coalesced across threadIdx.x); N = 2 mod 4 gives V = 2. Vector loads of the aligned body of
such rows need a per-row shift of the split, which is not built (docs/performance.md, "Rows of
odd length").
"""
from __future__ import annotations

import dataclasses

from ...ir.dtype import DataType, compute_type
from ...ir.exprs import BinaryOp, BinaryOpType, LoadKind, LoadStoreOp
from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ..cache import cached_uses
from ...ir.tensor import CpAsyncPipelined, TensorView, WarpSpecialized
from .. import (cache_after, cache_before, circular_buffer, inline_at, inline_most,
                parallelize_like, propagate_transforms, rfactor)
from ..inlining import upstream
from ..logsumexp import fuse_logsumexp_for_passes, pairs_fused_for_passes
from ..recompute import recompute_each_pass, recompute_for, uses_across_reductions
from ..tma_rules import MAX_TX_BYTES, check_bulk_rows, check_row_box
from .base import (RuntimeInfo, SchedulerError, access_width, orient_vector_inputs,
                   reduced_and_kept, reduction_tensors, reference_reduction, vector_inputs,
                   vector_width, vectorize, vectorize_along)
from .reduction import (_layout, _merge_dims, _pow2_floor, broadcast_back,
                        is_over_reduced_tensor_dims)

NAME = "inner_persistent"

# Elements of the persistent row one thread may hold in registers (the heuristic keeps
# persistent_batch * vector at or below it; beyond, rows need shared memory or a cluster).
MAX_ELEMENTS_PER_THREAD = 64
# The share of a thread's registers its row may take: the rest hold the reduction, the
# indices and the values in flight.
ROW_REGISTER_SHARE = 0.6


def register_cap(info: RuntimeInfo, threads: int, blocks: int = 1) -> int:
    """Registers a thread may use with `blocks` blocks of `threads` (whole warps) per SM."""
    return min(255, info.device.registers_per_block // threads,
               info.device.registers_per_sm // (blocks * threads))


@dataclasses.dataclass(frozen=True)
class InnerPersistentParams:
    vector: int
    persistent_batch: int        # P: vectors per thread per row (constant)
    bdimx: int                   # threads per row = ceilDiv(N / vector, P), for launch bounds
    bdimy: int                   # rows per block
    vector_inputs: tuple = ()
    project_to_inputs: bool = True
    keep_weights: bool = True    # weight vectors loaded once per block and kept in registers
    # The reduced extents the kernel is specialized on (constants in its index math, so splits
    # divide, predicates fold and offsets become immediates). Part of the kernel's key.
    row_extents: tuple = ()
    # TMA variant (0 stages: the register variant above). Inputs in `tma_inputs` are copied row
    # by row with 1D bulk copies into a circular buffer of `stages` shared-memory slots of
    # bdimy rows each, by a persistent grid of `grid` blocks striding over the row groups.
    stages: int = 0
    prefetch: int = 0
    grid: int = 0
    tma_inputs: tuple = ()
    blocks_per_sm: int = 0       # TMA and looped variants: resident blocks per SM planned
                                 # (launch bounds)
    # TMA variants: one tensor-map copy of a stage's bdimy whole rows (a kir.RowBoxMap) instead
    # of bdimy 1D bulk copies, one per row.
    tensor_map: bool = False
    # Warp-specialized TMA variant: a producer warp group (extra threadIdx.y rows) issues the
    # copies, bdimy compute rows wait on full / release empty mbarriers; one block per SM.
    # Register counts for setmaxnreg: 0 lets lowering take the largest split that fits.
    warp_specialized: bool = False
    producer_registers: int = 0
    compute_registers: int = 0
    # Warp-specialized: compute roles of bdimy rows each, side by side along threadIdx.y, taking
    # the row groups in turn (2: ping-pong, lower/pipeline.py).
    compute_roles: int = 1
    cluster: int = 1             # blocks (a thread-block cluster along blockIdx.y) per row
    # cp.async variant (TMA forced, but a row input breaks a 1D bulk-copy rule): inputs in
    # `cp_async_inputs` are copied by the threads that read them, `cp_async_bytes[j]` bytes per
    # copy (4, 8 or 16: one vector of the register split) into a circular buffer of `stages`
    # shared-memory slots, by the same persistent grid as the TMA variant.
    cp_async_inputs: tuple = ()
    cp_async_bytes: tuple = ()
    # Looped variant, for rows that do not fit registers and cannot be split over a cluster (an
    # odd length: no vectors): the row is walked in serial steps of `unroll` x bdimx x V
    # elements, once per pass (each reduction, then the outputs), every pass reading the inputs
    # again; the block's rows stay in L2 between passes. persistent_batch is 1; the row's
    # extent is not specialized (row_extents empty).
    looped: bool = False
    unroll: int = 1
    # Why the heuristic chose this variant (explain prints it); not part of the kernel's key.
    reason: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        if self.looped:
            return (f"inner persistent (looped): {self.bdimy} row(s) per block, {self.bdimx} "
                    f"threads per row, steps of {self.unroll} x {self.vector} elements per "
                    "thread, each pass over the row reads the inputs again, vector loads for "
                    f"inputs {list(self.vector_inputs)}"
                    + (f"\n  why: {self.reason}" if self.reason else ""))
        text = (f"inner persistent: {self.bdimy} row(s) per block, {self.bdimx} threads per row, "
                f"{self.persistent_batch} x {self.vector} elements per thread in registers, "
                f"vector loads for inputs {list(self.vector_inputs)}"
                + (", buffers projected to inputs" if self.project_to_inputs else ""))
        if self.cluster > 1:
            text += (f"; each row split over a cluster of {self.cluster} blocks, reduced through "
                     "distributed shared memory")
        if self.warp_specialized:
            roles = (f"{self.compute_roles} compute roles of {self.bdimx * self.bdimy} threads "
                     "taking the row groups in turn" if self.compute_roles > 1
                     else f"{self.bdimx * self.bdimy} compute threads")
            text += (f"; warp-specialized TMA: a producer warp group copies inputs "
                     f"{list(self.tma_inputs)} {self._copies} into {self.stages} shared-memory "
                     f"stages, {roles}, a persistent grid of {self.grid} blocks (one per SM)")
        elif self.cp_async_inputs:
            text += (f"; cp.async: inputs {list(self.cp_async_inputs)} copied by the threads "
                     f"that read them ({list(self.cp_async_bytes)} bytes per copy) into "
                     f"{self.stages} shared-memory stages (prefetch {self.prefetch}) by a "
                     f"persistent grid of {self.grid} blocks")
        elif self.stages:
            text += (f"; TMA: inputs {list(self.tma_inputs)} copied {self._copies} into "
                     f"{self.stages} shared-memory stages (prefetch {self.prefetch}) by a "
                     f"persistent grid of {self.grid} blocks")
        return text + (f"\n  why: {self.reason}" if self.reason else "")

    @property
    def _copies(self) -> str:
        return "a stage per tensor-map box" if self.tensor_map else "row by row (1D bulk)"


def same_row_dims(red: TensorView, ref: TensorView, graph) -> bool:
    """True if reduction `red` reduces the dims reduction `ref` reduces and keeps those it keeps
    (size-1 dims aside), one for one in the exact ID graph: the dims schedule() splits on
    `ref` and replays onto every reduction. Their logical order may differ (a reduction of a
    permuted view of the rows). A kept dim of ref may be a broadcast in red: the reduction of
    a one-row tensor ([1, N], as `from_pytorch` defines a batch of 1) broadcast against ref's
    rows reduces the same row for each of them."""
    def dims(t, reduced):
        return [i for i in t.domain.maybe_root
                if i.is_reduction == reduced and not i.is_broadcast and i.extent.value != 1]

    for reduced in (True, False):
        mine, theirs = dims(red, reduced), dims(ref, reduced)
        one_rows = 0 if reduced else sum(1 for i in red.domain.maybe_root
                                         if not i.is_reduction and i.is_broadcast)
        if not len(theirs) - one_rows <= len(mine) <= len(theirs):
            return False
        left = list(theirs)
        for i in mine:
            j = next((x for x in left if graph.mapped(i, x)), None)
            if j is None:
                return False
            left.remove(j)
    return True


def can_schedule(fusion) -> tuple[bool, str]:
    reds = reduction_tensors(fusion)
    if not reds:
        return False, "no reductions"
    graph = IdGraph(fusion)
    if not any(broadcast_back(fusion, r, graph) for r in reds):
        return False, "no reduction result is broadcast back over the row (a plain reduction)"
    ref = reference_reduction(reds)
    pattern = [i.is_reduction for i in ref.domain.maybe_root]
    for r in reds:
        if not same_row_dims(r, ref, graph):
            return False, "reductions over different dims (row and column: inner-outer)"
    inner, _ = _layout(ref)
    if not inner:
        return False, "the reduced dims are not innermost in logical order"
    from . import outer_persistent
    if outer_persistent.outer_layout(fusion, ref, graph)[0] and \
            outer_persistent.can_schedule(fusion)[0]:
        # Innermost logically, outermost in memory (the softmax of a transposed input): a
        # block's row would be read one element per 32-byte sector. The outer persistent
        # scheduler's, or, where its heuristic refuses the shapes, a plan of kernels.
        return False, "the reduced dims are outermost in memory (the outer persistent scheduler's)"
    rank = len(ref.domain.maybe_root)
    if sum(pattern) == rank:
        # The rows are the kept dims: a full reduction ([M, N] -> []) has none to spread
        # over blocks and threads.
        return False, "a full reduction (no kept dims) is not supported yet"
    for v in fusion.inputs:
        if isinstance(v, TensorView) and len(v.domain.logical) not in (rank, rank - sum(pattern)) \
                and len(v.domain.logical) != sum(pattern):
            return False, f"input T{v.name} has a rank the row schedule does not cover"
    for k, o in enumerate(fusion.outputs):
        # A block holds its rows: an output over other dims (a flattening reshape of the
        # input, [M, N] -> [M * N]) needs elements of other blocks' rows.
        if not is_over_reduced_tensor_dims(o, ref, graph):
            return False, (f"output {k} iterates dims other than the rows' (such as a reshape "
                           "of the input): its elements are not within one row")
    return True, "row reductions broadcast back over the row: keep the row on chip"


def compute_heuristics(fusion, info: RuntimeInfo) -> InnerPersistentParams:
    red = reference_reduction(reduction_tensors(fusion))
    _, rpos = _layout(red)
    n, m = reduced_and_kept(red, rpos, info)
    looped = info.feature("looped_inner_persistent")
    along = _along_row(fusion, red)     # one IdGraph for every rule below
    if looped:
        return looped_params(fusion, info, rpos, n, m,
                             "looped variant forced on (looped_inner_persistent)", along)
    writes_rows = _writes_rows(fusion, along)
    try:
        p = register_params(fusion, info, rpos, n, m, row_vector_width(fusion, n, rpos), along)
    except SchedulerError as too_long:
        if looped is False or not writes_rows:
            # Every output per row: reduction kernels reading the rows twice.
            raise
        return looped_params(fusion, info, rpos, n, m, str(too_long), along)
    if looped is not False and writes_rows:
        why = _looped_is_faster(fusion, info, along, p)
        if why:
            return looped_params(fusion, info, rpos, n, m, why, along)
    if (p.cluster >= REREAD_CLUSTER and p.persistent_batch * p.vector >= REREAD_VALUES
            and not writes_rows):
        # Measured on the H200 (bench/results/2026-11-27/h200-bench-reread-rule-bd29aa3.txt,
        # tools/bench_reread_rule.py): over rows of [8192, 128256] bf16 (a cluster of 8, 32
        # values per thread, 2 blocks per SM) the reduction kernels that read the rows twice
        # ran a var at 2224 GB/s against the cluster kernel's 1610 (and the argmax of that
        # time, before its one-pass keys, at 1819 against 1150); over [4096, 65536] fp32 (16
        # values per thread) the cluster kernel ran a var at 2924 against 2204, and over
        # [4096, 65536] bf16 (a cluster of 4) a var_mean at 2204 against 2098.
        raise SchedulerError(
            f"inner persistent: rows of {n} elements would be split over a cluster of "
            f"{p.cluster} blocks holding {p.persistent_batch * p.vector} values per thread "
            "only to feed reductions (no output runs along the row): reduction kernels that "
            "read the row again are faster")
    if p.cluster > 1:
        widest = row_element_bytes(fusion, along)
        return dataclasses.replace(p, reason=(
            f"a row of {n} x {widest} bytes is split over a cluster of {p.cluster} blocks "
            f"({n // p.cluster} elements each in registers; rows above "
            f"{CLUSTER_ROW_BYTES // 1024} KB spilled registers on one SM), reduced through "
            "distributed shared memory"))
    return choose_variant(fusion, info, p, n, m, rpos)


def _looped_is_faster(fusion, info: RuntimeInfo, along, p: InnerPersistentParams) -> str:
    """Why the looped variant beats register rows `p` for a fusion with an output along the
    row, or "" where it does not. Measured on the H200 (bf16, GB/s, the register rows first,
    the looped kernel second; bench/results/2026-11-29/h200-looped-vs-registers-session20.txt):
    - A cluster, where the looped kernel reads the row twice in all (one reduction pass after
      fusing a max and sum of exp, and the row the only input along it): softmax over
      [4096, 65536] 2479 / 2875, [2048, 131072] 2364 / 2732, [4096, 128256] 2392 / 2777;
      log-softmax 2387 / 2957, 2259 / 2732, 2263 / 2777; cross-entropy's loss and dlogits over
      [8192, 128256] 1911 / 2283. Where it reads more, the cluster wins: RMSNorm (the weight
      read in the second pass) 3163 / 2034 at 65536, LayerNorm (three passes) 2354 / 1536.
      The cluster holds the row once, but its blocks of 512 threads keep a quarter of the
      rows in flight that two 1024-thread blocks per SM keep, and wait on each other at
      every reduction.
    - Lone elements (no vector) whose registers do not leave room for two blocks per SM:
      [4096, 24577] (64 per thread of 385, one block per SM at 128 registers in the
      log-softmax): softmax 1915 / 2104, log-softmax 1360 / 2220, LayerNorm 1810 / 1844,
      RMSNorm 2300 / 2547. At 257 threads (two blocks fit) the register rows mostly won:
      [4096, 16385] softmax 1958 / 1788, LayerNorm 2272 / 1730, RMSNorm 2732 / 2318
      (log-softmax 1775 / 1877)."""
    if p.cluster > 1:
        row_inputs = sum(1 for v in fusion.inputs if isinstance(v, TensorView) and along(v))
        passes = len(reduction_tensors(fusion)) - pairs_fused_for_passes(fusion) + 1
        if row_inputs * passes <= 2:
            return (f"a cluster of {p.cluster} blocks would hold the row once, slower than "
                    f"reading it in {passes} passes (measured)")
        return ""
    if p.vector == 1:
        threads = -(-p.bdimx // 32) * 32 * p.bdimy
        row_regs = p.persistent_batch * -(-row_element_bytes(fusion, along) // 4)
        if row_regs > ROW_REGISTER_SHARE * register_cap(info, threads, blocks=2):
            return (f"{p.persistent_batch} lone elements per thread of {threads} in registers "
                    "leave no room for two blocks per SM")
    return ""


# Clusters, and values held per thread, from which a fusion whose outputs are all per row (a
# variance in two passes) is better run as reduction kernels reading the rows again
# (compute_heuristics): such a kernel fits 2 blocks per SM.
REREAD_CLUSTER = 8
REREAD_VALUES = 32


def _writes_rows(fusion, along) -> bool:
    """Whether an output runs along the reduced dims (`along`, _along_row: a normalization's
    result), as opposed to every output being per row (a reduction's result, an argmax)."""
    return any(along(o) for o in fusion.outputs if isinstance(o, TensorView))


def _along_row(fusion, red):
    """A test of whether a tensor has a dim (not a broadcast) along `red`'s reduced dims."""
    graph = IdGraph(fusion)
    red_ids = [i for i in red.domain.maybe_root if i.is_reduction and not i.is_broadcast]
    return lambda t: any(graph.mapped(i, r) for i in t.domain.logical_no_reductions
                         if not i.is_broadcast for r in red_ids)


def _divides_along(fusion, along) -> bool:
    """Whether the fusion divides in float32 elements that lie along the row (`along`:
    _along_row's test), not one value per row (a mean: a row's sum over its length)."""
    return any(isinstance(e, BinaryOp) and e.op == BinaryOpType.Div
               and compute_type(e.operand_dtype) == DataType.Float and along(e.outputs[0])
               for e in fusion.exprs())


def row_vector_width(fusion, n: int, rpos) -> int:
    """The scheduled width of a row of n elements: vectors of the row's innermost reduced dim,
    16 bytes of the widest input along it."""
    red = reference_reduction(reduction_tensors(fusion))
    return vector_width(fusion, n, red.domain.maybe_root[rpos[-1]])


def row_element_bytes(fusion, along=None) -> int:
    """Bytes a row element holds in registers: the widest input's that lies along the reduced
    dims (the caches stay resident). A per-row input (cross-entropy's int64 targets [M]) is one
    value per row, not part of it. A fusion without such inputs (a segment of fills: full,
    zeros) recomputes its row in the 4-byte compute type. `along`: _along_row's test, where
    the caller has it."""
    if along is None:
        along = _along_row(fusion, reference_reduction(reduction_tensors(fusion)))
    return max((i.dtype.size for i in fusion.inputs if isinstance(i, TensorView) and along(i)),
               default=4)


# Threads per row of the looped variant: two 1024-thread blocks per SM keep 2 x 132 rows in
# flight, whose bytes (100 KB for a [*, 50257] bf16 row: 26 MB) stay in L2 between the passes.
LOOPED_THREADS = 1024
# Bytes of the row one thread loads per serial step: several loads in flight each. At most
# LOOPED_STEP_REGISTERS registers of all the inputs along the row per step: with two 1024-thread
# blocks per SM a thread has 32, and ptxas spilled LayerNorm's x, w and b at 8 lone 16-bit
# loads each (24 registers; 4 each fit), and a LayerNorm-like var_mean with weight and bias at
# 2 vectors of 8 each (24 registers, 252 B spilled: GPU fuzz 20262002:17).
LOOPED_STEP_BYTES = 32
LOOPED_MAX_UNROLL = 8
LOOPED_STEP_REGISTERS = 16
# A float division along the row takes a quarter of that step. The output pass then holds the
# divisor, its reciprocal and a range check's flag across the steps (lower/shared_divisor.py),
# or before that div.rn's slow-path calls: at the full step ptxas spilled 12-40 B at 32
# registers in every such kernel measured (softmax and RMSNorm written with a division at
# [4096, 50257] and [4096, 65536], cross-entropy's dlogits at [8192, 128256]), none at a quarter.
# H200, session 23: cross-entropy 1620 us at one vector a step, 1614 at two (spilling); softmax
# with a division at [4096, 50257] bf16 474 us at 2 lone elements a step, 590 at 4, 455 at 8
# with div.rn before this pass (spilling).
LOOPED_DIVISION_STEP_SHARE = 4


def looped_params(fusion, info: RuntimeInfo, rpos, n: int, m: int,
                  why: str, along=None) -> InnerPersistentParams:
    """The looped variant's parameters for rows of n elements that registers cannot hold
    (`why`): one row per block of up to LOOPED_THREADS threads, each step `unroll` vectors per
    thread (LOOPED_STEP_BYTES of the widest row input, at most LOOPED_MAX_UNROLL loads of each
    and LOOPED_STEP_REGISTERS for all the row inputs)."""
    red = reference_reduction(reduction_tensors(fusion))
    vector = row_vector_width(fusion, n, rpos)
    vec_inputs = vector_inputs(fusion, info, vector, red.domain.maybe_root[rpos[-1]])
    if not vec_inputs:
        vector = 1
    if along is None:
        along = _along_row(fusion, red)
    widest = row_element_bytes(fusion, along)
    vecs = max(1, -(-n // vector))
    bdimx = min(LOOPED_THREADS, max(32, _pow2_floor(vecs)))
    # Registers a step's vector of each row input holds: a 16-byte vector 4, a lone element
    # one whatever its width (a vector the input cannot take is read lane by lane).
    step_regs = max(1, sum(-(-vector * v.dtype.size // 4) if k in vec_inputs else vector
                           for k, v in enumerate(fusion.inputs)
                           if isinstance(v, TensorView) and along(v)))
    unroll = _pow2_floor(max(1, min(LOOPED_MAX_UNROLL, LOOPED_STEP_BYTES // (vector * widest),
                                    LOOPED_STEP_REGISTERS // step_regs)))
    if _divides_along(fusion, along):
        unroll = max(1, unroll // LOOPED_DIVISION_STEP_SHARE)
    per_sm = max(1, info.device.max_threads_per_sm // bdimx)
    rows_in_l2 = info.device.sm_count * per_sm
    return InnerPersistentParams(
        vector, 1, bdimx, 1, vec_inputs, keep_weights=False, looped=True, unroll=unroll,
        blocks_per_sm=per_sm,
        reason=(f"{why}; looped instead: each pass reads the row again, "
                f"{rows_in_l2} rows of {n * widest // 1024} KB in flight "
                f"({'within' if rows_in_l2 * n * widest <= info.device.l2_bytes else 'beyond'} "
                f"the {info.device.l2_bytes >> 20} MB L2)"))


def register_params(fusion, info: RuntimeInfo, rpos, n: int, m: int,
                    vector: int, along=None) -> InnerPersistentParams:
    """The register-row parameters for rows of n elements read with `vector`-wide accesses
    (1 when no input allows them), m rows. `along`: _along_row's test, where the caller has
    it."""
    red = reference_reduction(reduction_tensors(fusion))
    vec_inputs = vector_inputs(fusion, info, vector, red.domain.maybe_root[rpos[-1]])
    if not vec_inputs:
        vector = 1
    widest = row_element_bytes(fusion, along)
    cluster = cluster_size(n, vector, widest, info.device.max_cluster_size, len(rpos))
    batch, bdimx = persistent_batch(max(1, -(-n // (vector * cluster))))
    bdimy = 1
    while bdimx * bdimy * 2 <= 256 and bdimy * 2 <= _pow2_floor(max(m, 1)):
        bdimy *= 2
    threads = -(-bdimx // 32) * 32 * bdimy
    cap = register_cap(info, threads)
    # A 16-bit element takes half a register in a vector and a whole one alone.
    row_regs = batch * -(-(vector * widest) // 4)
    if batch * vector > MAX_ELEMENTS_PER_THREAD:
        # ptxas put such rows partly on the stack: [*, 32769] bf16 (128 lone elements per
        # thread of 257) took 167 registers and a 256-byte frame; [*, 50257], refused by the
        # estimate below, ran at 871 GB/s that way, 2366 looped (H200).
        raise SchedulerError(
            f"inner persistent: a row of {n} elements needs {batch * vector} elements per "
            f"thread of {bdimx} in registers (at most {MAX_ELEMENTS_PER_THREAD}); rows this "
            "long need shared memory or a cluster")
    if row_regs > ROW_REGISTER_SHARE * cap:
        raise SchedulerError(
            f"inner persistent: a row of {n} elements needs {row_regs} registers per thread of "
            f"{threads} (cap {cap}); rows this long need shared memory or a cluster")
    # Weights kept in registers across the block's rows cost registers (occupancy) for L2 reads
    # saved; worth it only while a thread's row share is small.
    keep_weights = batch * vector <= MAX_ELEMENTS_PER_THREAD // 2 and bdimx * bdimy < 512
    root = red.domain.maybe_root
    row_extents = tuple(info.extent(root[k].extent) for k in rpos)
    return InnerPersistentParams(vector, batch, bdimx, bdimy, vec_inputs,
                                 keep_weights=keep_weights, row_extents=row_extents,
                                 cluster=cluster)


# Row bytes one block keeps in registers before the row is split over a cluster: 16384 bf16
# elements ran at 99.7% of copy in one block, 65536 spilled (0.68-0.72x of Quack's cluster
# kernel, bench/results/2026-11-22-h100-catalogue.json).
CLUSTER_ROW_BYTES = 32 * 1024


def cluster_size(n: int, vector: int, elem_bytes: int, max_cluster: int, reduced_dims: int) -> int:
    """Blocks per row: 1 while the row fits CLUSTER_ROW_BYTES, else the smallest power of two
    that brings each block's share under it (and divides the row into whole vectors)."""
    c = 1
    if reduced_dims != 1:
        return 1
    while n * elem_bytes > c * CLUSTER_ROW_BYTES and c * 2 <= max_cluster and \
            n % (c * 2 * vector) == 0:
        c *= 2
    return c


# Persistent blocks per SM of the TMA variant, by row length: the best of the sweep in
# bench/results/2026-11-22-h100-sweep-inner-persistent.md (short rows need more blocks to keep
# enough stores in flight).
def _tma_blocks_per_sm(n: int) -> int:
    return 4 if n <= 1024 else 2 if n <= 4096 else 1


# Shared memory a block keeps out of the TMA stages: reduction workspaces and mbarriers.
TMA_SMEM_RESERVE = 27 * 1024


def _tma_budget(info: RuntimeInfo) -> int:
    """Shared-memory bytes one block may give to TMA stages."""
    return info.device.max_shared_memory_per_block_optin - TMA_SMEM_RESERVE


def _stage_problems(rows, bdimy: int, stage_bytes: int, budget: int,
                    mbarrier: bool = True) -> list:
    """Why stages of `stage_bytes` (bdimy rows of every TMA input) cannot be buffered; with
    `mbarrier`, a stage completes on one mbarrier phase (TMA)."""
    problems = []
    if rows and 2 * stage_bytes > budget:
        problems.append(f"two stages of {bdimy} row(s) need {2 * stage_bytes} bytes of shared "
                        f"memory, more than {budget}")
    if mbarrier and stage_bytes > MAX_TX_BYTES:
        problems.append(f"a stage of {stage_bytes} bytes exceeds one mbarrier phase's "
                        f"transaction count ({MAX_TX_BYTES})")
    return problems


def choose_variant(fusion, info: RuntimeInfo, p: InnerPersistentParams, n: int, m: int,
                   rpos) -> InnerPersistentParams:
    """Registers, TMA pipelined or TMA warp-specialized. Measured on the H100 (the sweeps named
    below), both TMA variants are slower than the register kernel for every row that fits
    registers, so one runs only when PYFUSER_ENABLE=ws_inner_persistent or
    tma_inner_persistent (or a per-call option) asks for it and its rules hold; a forced choice
    that cannot run says why and keeps the register kernel."""
    if info.feature("ws_inner_persistent"):
        ws, problems = warp_specialized_variant(fusion, info, p, n, m, rpos)
        if ws is not None:
            return ws
        p = dataclasses.replace(p, reason="warp-specialized TMA forced on but not possible: "
                                + "; ".join(problems))
    forced = info.feature("tma_inner_persistent")
    if not forced:
        if p.reason:
            return dataclasses.replace(p, reason=p.reason + "; register rows instead")
        why = ("TMA disabled (PYFUSER_DISABLE=tma_inner_persistent)" if forced is False else
               "register rows: the TMA circular-buffered variants measured slower on the H100, "
               "for rows that fit registers: pipelined by 2-5%, warp-specialized by 1.5-27% "
               "(PYFUSER_ENABLE=tma_inner_persistent or ws_inner_persistent forces one)")
        return dataclasses.replace(p, reason=why)
    tensor_map = bool(info.feature("tma_tensor_map"))
    rows, problems = _tma_rows(fusion, info, rpos, tensor_map)
    if problems and len(rpos) == 1:
        # A row the bulk copy cannot take may still be copied with cp.async, per thread.
        return cp_async_variant(fusion, info, p, n, m, rpos, problems)
    budget = _tma_budget(info)
    stage_bytes = p.bdimy * sum(n * fusion.inputs[k].dtype.size for k in rows)
    stages = 4 if 4 * stage_bytes <= budget else 2
    problems += _stage_problems(rows, p.bdimy, stage_bytes, budget)
    if problems or not rows:
        return dataclasses.replace(p, reason="TMA forced on but not possible, register rows "
                                   "instead: " + ("; ".join(problems) or "no row input"))
    per_sm, grid = _persistent_grid(info, n, m, p.bdimy, stages * stage_bytes)
    return dataclasses.replace(
        p, stages=stages, prefetch=stages - 1, grid=grid, tma_inputs=rows, blocks_per_sm=per_sm,
        tensor_map=tensor_map,
        reason="TMA forced on (tma_inner_persistent): "
               + ("one tensor-map box per stage (tma_tensor_map)" if tensor_map else
                  "1D bulk copies of each row")
               + f" into a {stages}-stage circular buffer, {per_sm} persistent block(s) per SM")


def _persistent_grid(info: RuntimeInfo, n: int, m: int, bdimy: int,
                     stages_bytes: int) -> tuple[int, int]:
    """(blocks per SM, grid) of a persistent grid striding over row groups of bdimy rows, whose
    blocks hold `stages_bytes` of circular-buffer stages."""
    per_sm = min(_tma_blocks_per_sm(n),
                 max(1, info.device.shared_memory_per_sm // (stages_bytes + TMA_SMEM_RESERVE)))
    groups = -(-max(m, 1) // bdimy)
    return per_sm, max(1, min(info.device.sm_count * per_sm, groups))


# Bytes one cp.async copies per thread: 4, 8 or 16, both addresses aligned to it.
CP_ASYNC_BYTES = (4, 8, 16)


def cp_async_elems(f, elem_bytes: int, vector: int) -> int:
    """The widest copy (in elements, a power of two dividing `vector`, which divides the row)
    that input facts `f` allow cp.async to make: the row contiguous, the data pointer and every
    outer stride aligned to the copy. 0 when the rows are not contiguous."""
    if f.sizes and f.sizes[-1] != 1 and f.strides[-1] != 1:
        return 0
    w = vector
    while w > 1 and not (w * elem_bytes <= 16 and f.alignment % (w * elem_bytes) == 0 and all(
            st % w == 0 for d, st in enumerate(f.strides[:-1]) if f.sizes[d] != 1)):
        w //= 2
    return w


def cp_async_variant(fusion, info: RuntimeInfo, p: InnerPersistentParams, n: int, m: int, rpos,
                     bulk_problems: list) -> InnerPersistentParams:
    """TMA forced, but a row input breaks a bulk-copy rule: every row input is staged with
    cp.async instead (one staging kind per kernel), each thread copying the vectors of the
    register split it later reads, into the circular buffer the TMA variant would use. The
    kernel's vector becomes the widest copy every row input allows (a narrower one than the
    register rows' when an input's pointer or strides are less aligned). Keeps the register
    rows, and says why, when a copy would be under 4 bytes or the stages do not fit."""
    bulk = "1D bulk copy not possible (" + "; ".join(bulk_problems) + ")"
    rows = _row_inputs(fusion)
    widths, problems = {}, []
    for k in rows:
        elem = fusion.inputs[k].dtype.size
        w = cp_async_elems(info.inputs[k], elem, row_vector_width(fusion, n, rpos))
        if w * elem < CP_ASYNC_BYTES[0]:
            problems.append(f"input {k}: rows not contiguous" if w == 0 else
                            f"input {k}: cp.async copies 4, 8 or 16 bytes, and its pointer, "
                            f"strides and row allow {w * elem}-byte copies")
        widths[k] = w
    vector = min(widths.values(), default=p.vector)
    if not problems and vector != p.vector:
        try:
            p = register_params(fusion, info, rpos, n, m, vector)
        except SchedulerError as e:
            problems.append(str(e))
    if not problems and (p.cluster > 1 or (p.vector > 1 and
                                           not set(rows) <= set(p.vector_inputs))):
        problems.append(f"the rows need {p.vector}-wide vectors that not every input allows")
    # Each thread copies the vectors it later reads (the register split's accesses, of the
    # widths the vector rule gives each input), not the widths cp_async_elems allowed: an input
    # read element-wise copies under 4 bytes.
    nbytes = tuple((access_width(fusion.inputs[k].dtype, p.vector) if k in p.vector_inputs
                    else 1) * fusion.inputs[k].dtype.size for k in rows)
    if not problems:
        problems += [f"input {k}: the row split reads it {nb} bytes at a time"
                     + ("" if k in p.vector_inputs else " (no vector loads along its rows)")
                     + ", and a cp.async copy moves 4, 8 or 16"
                     for k, nb in zip(rows, nbytes) if nb < CP_ASYNC_BYTES[0]]
    budget = _tma_budget(info)
    # A slot holds the register split of bdimy rows: P x bdimx x V elements per row.
    row_elems = p.persistent_batch * p.bdimx * p.vector
    stage_bytes = p.bdimy * sum(row_elems * fusion.inputs[k].dtype.size for k in rows)
    stages = 4 if 4 * stage_bytes <= budget else 2
    if not problems:
        problems += _stage_problems(rows, p.bdimy, stage_bytes, budget, mbarrier=False)
    if problems or not rows:
        return dataclasses.replace(p, reason=f"TMA forced on: {bulk}; cp.async not possible "
                                   "either, register rows instead: "
                                   + ("; ".join(problems) or "no row input"))
    per_sm, grid = _persistent_grid(info, n, m, p.bdimy, stages * stage_bytes)
    return dataclasses.replace(
        p, stages=stages, prefetch=stages - 1, grid=grid, cp_async_inputs=rows,
        cp_async_bytes=nbytes, blocks_per_sm=per_sm,
        reason=f"TMA forced on (tma_inner_persistent), {bulk}: cp.async instead, each thread "
               f"copying its share of the row ({'/'.join(map(str, sorted(set(nbytes))))}-byte "
               f"copies) into a {stages}-stage circular buffer, {per_sm} persistent block(s) "
               "per SM")


# Bytes the producer of the warp-specialized variant keeps in flight per SM (its stages): one
# block per SM must cover the memory latency alone; 3 TB/s x ~2 us / 132 SMs is about 45 KB.
WS_BYTES_IN_FLIGHT = 96 * 1024
# Compute threads of the warp-specialized variant by the bytes of one input row, from the
# sweep in bench/results/2026-11-22-h100-sweep-ws-inner-persistent.md: throughput rose with
# compute warps at 1024 (softmax 919 -> 1603 GB/s from 256 to 768 threads; stages made no
# difference), and 512 was at or near the best at 4096.
WS_COMPUTE_THREADS = ((2048, 768), (1 << 62, 512))
WS_MAX_STAGES = 8
WARP_GROUP = 128


def warp_specialized_variant(fusion, info: RuntimeInfo, p: InnerPersistentParams, n: int,
                             m: int, rpos) -> tuple[InnerPersistentParams | None, list]:
    """The warp-specialized TMA parameters for rows `p` describes, or None and why not.
    Compute threads are whole warp groups: WS_COMPUTE_THREADS by row bytes when a row takes
    at most 128 threads, else the row's threads; the producer rows along threadIdx.y are one
    warp group, or one row of threads when a row takes more than 128."""
    tensor_map = bool(info.feature("tma_tensor_map"))
    rows, problems = _tma_rows(fusion, info, rpos, tensor_map)
    if not rows:
        problems = problems or ["no row input"]
    bdimx, batch = p.bdimx, p.persistent_batch
    if WARP_GROUP % bdimx and bdimx % WARP_GROUP:
        # Another split of the row into threads x vectors per thread that makes whole warp
        # groups (5120 bf16: 640 vectors = 128 threads x 5), within the register budget.
        vecs = -(-n // p.vector)
        for b in range(1, MAX_ELEMENTS_PER_THREAD // p.vector + 1):
            t = -(-vecs // b)
            if t <= 512 and (WARP_GROUP % t == 0 or t % WARP_GROUP == 0) and t * b - vecs < t:
                bdimx, batch = t, b
                break
    # Ping-pong: two compute roles share the compute threads (whole warp groups each).
    roles = 2 if info.feature("ws_pingpong") else 1
    if WARP_GROUP % bdimx == 0:
        row_in_bytes = n * max(fusion.inputs[k].dtype.size for k in rows) if rows else 0
        compute = next(t for limit, t in WS_COMPUTE_THREADS if row_in_bytes <= limit)
        bdimy = max(1, compute // roles // WARP_GROUP) * WARP_GROUP // bdimx
    elif bdimx % WARP_GROUP == 0:
        bdimy = 1
        if roles > 1 and (roles + 1) * bdimx > 1024:
            # The producer is a row of threads too (its rows are along threadIdx.y).
            problems.append(f"two compute roles of {bdimx} threads and a producer row of "
                            f"{bdimx} exceed 1024 threads (ping-pong takes rows of at most "
                            "341 threads)")
    else:
        problems.append(f"{bdimx} threads per row neither divide 128 nor are a multiple of it "
                        "(warp groups)")
        bdimy = 1
    stage_bytes = bdimy * sum(n * fusion.inputs[k].dtype.size for k in rows)
    budget = _tma_budget(info)
    stages = min(WS_MAX_STAGES, max(2, -(-WS_BYTES_IN_FLIGHT // max(stage_bytes, 1))),
                 budget // max(stage_bytes, 1))
    problems += _stage_problems(rows, bdimy, stage_bytes, budget)
    if problems:
        return None, problems
    groups = -(-max(m, 1) // bdimy)
    grid = max(1, min(info.device.sm_count, groups))
    return dataclasses.replace(
        p, bdimx=bdimx, persistent_batch=batch, bdimy=bdimy, stages=stages, prefetch=stages - 1,
        grid=grid, tma_inputs=rows,
        blocks_per_sm=1, warp_specialized=True, tensor_map=tensor_map, compute_roles=roles,
        reason=f"warp-specialized TMA forced on (ws_inner_persistent): a producer warp group "
               f"fills {stages} stages of {bdimy} row(s)"
               + (" with one tensor-map box each" if tensor_map else "")
               + (", two compute roles taking them in turn (ws_pingpong)" if roles > 1 else "")
               + ", one persistent block per SM"), []


def _row_inputs(fusion) -> tuple:
    """Inputs shaped like the rows (the reduction's rank, no broadcast dim: a per-row scalar
    such as a norm backward's rstd [M, 1] has no row to copy) that the fusion reads."""
    rank = len(reference_reduction(reduction_tensors(fusion)).domain.maybe_root)
    return tuple(k for k, v in enumerate(fusion.inputs)
                 if isinstance(v, TensorView) and cached_uses(v)
                 and len(v.domain.logical) == rank
                 and not any(i.is_broadcast for i in v.domain.logical))


def _tma_rows(fusion, info: RuntimeInfo, rpos, tensor_map: bool = False) -> tuple[tuple, list]:
    """Inputs whose rows (the one reduced, innermost dim) 1D bulk copies (or tensor-map boxes
    of whole rows) can load, and the rules that fail for the other row-shaped inputs."""
    rows, problems = [], []
    if len(rpos) != 1:
        return (), ["the row spans several reduced dims"]
    for k in _row_inputs(fusion):
        v = fusion.inputs[k]
        f = info.inputs[k]
        bad = (check_bulk_rows(f.sizes, f.strides, f.alignment, v.dtype.size) if not tensor_map
               else check_row_box(f.sizes, f.strides, f.alignment, v.dtype.size))
        if bad:
            problems += [f"input {k}: {b}" for b in bad]
        else:
            rows.append(k)
    return tuple(rows), problems


def persistent_batch(vecs: int) -> tuple[int, int]:
    """(P, threads per row) for a row of `vecs` vectors. Threads per row stay <= 512 (a
    1024-thread block caps each thread at 64 registers; 65536-wide rows spilled, ptxas report);
    at least 4 vectors per thread when the row allows 128 threads, so each thread has several
    loads in flight."""
    batch = 1
    while -(-vecs // batch) > 512 or (batch < 4 and -(-vecs // (batch * 2)) >= 128):
        batch *= 2
    return batch, -(-vecs // batch)


_EXPENSIVE = {"exp", "exp2", "log", "tanh", "erf", "sigmoid", "silu", "gelu_tanh", "gelu_erf", "pow"}


def _chain_is_expensive(t: TensorView, stop: set) -> bool:
    """True if recomputing t from `stop` repeats a transcendental op (exp in softmax): a
    register row of floats is then cheaper than the second pass of special-function work."""
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        if u in stop or u in seen or u.definition is None:
            continue
        seen.add(u)
        op = getattr(getattr(u.definition, "op", None), "value", "")
        if op in _EXPENSIVE:
            return True
        stack.extend(i for i in u.definition.inputs if isinstance(i, TensorView))
    return False


def _is_row_data(t: TensorView, graph, red_ids) -> bool:
    """A tensor with both the row's reduced dim and another, non-broadcast dim: [M, N] data."""
    ids = [i for i in t.domain.logical_no_reductions if not i.is_broadcast]
    along = [i for i in ids if any(graph.mapped(i, x) for x in red_ids)]
    return bool(along) and len(ids) > len(along)


def _project_to_inputs(fusion, caches: set, reds, allow_expensive: bool = False) -> None:
    """Recompute every tensor used on both sides of a reduction from the input caches, so that
    only the (16-bit) caches stay resident. Cloning stops at the caches and at row-reduced
    tensors (one value per row, e.g. the mean); broadcasts of those are recomputed per use,
    which costs nothing, instead of being held as a row of copies."""
    done = set()
    while True:
        graph = IdGraph(fusion)     # rebuilt: clones carry IDs the last graph did not know
        # Which dims each broadcast dim is broadcast to (and nothing more).
        to = IdGraph(fusion, permissive=True, transforms=False)
        red_ids = [i for r in reds for i in r.domain.maybe_root if i.is_reduction]

        def row_reduced(t: TensorView) -> bool:
            # No dim along the row: neither one of the reduced dims nor a broadcast of the
            # result back over them (the [M, 1] of a keepdim mean). A size-1 dim among the
            # kept dims ([A, 1, N] reduced over N keeps [A, 1]) is a row dim of extent 1,
            # not a broadcast back.
            return not any((to if i.is_broadcast else graph).mapped(i, x)
                           for i in t.domain.logical_no_reductions for x in red_ids)
        pending = [(t, out) for t, out in uses_across_reductions(fusion, reds)
                   if t not in caches and t not in done and not row_reduced(t)]
        if not pending:
            return
        t, outside = pending[0]
        done.add(t)
        # Row-shaped sources only: weights stay in registers anyway and per-row scalars are
        # one value. Two row inputs (a residual sum) hold as much as one float buffer.
        srcs = [u for u in upstream(fusion, t) if u in caches and _is_row_data(u, graph, red_ids)]
        if len(srcs) > 1:
            continue
        stop = set(caches) | {u for u in fusion.tensors() if row_reduced(u)}
        if not allow_expensive and _chain_is_expensive(t, stop):
            continue
        recompute_for(t, outside, stop)


def _holds_part_of_the_row(t: TensorView, graph: IdGraph, row_ids: list) -> bool:
    """t has some of the row's dims but not all (w [N] beside rows [K, N] merged into one):
    its own split of the row is not the row's split."""
    ids = [i for i in t.domain.logical_no_reductions if not i.is_broadcast]
    covered = [x for x in row_ids if any(graph.mapped(i, x) for i in ids)]
    return 0 < len(covered) < len(row_ids)


def _reload_partial_rows(fusion, reds, row_ids: list) -> None:
    """Give the uses after a reduction their own copy of each tensor that holds part of a
    merged row and is used on both sides of it (a weight w [N] of rows [K, N]).

    Before: T1 = cache(w [N]); T2 = sum(x [M, K, N] * T1); T5 = T2 * T1    T1 resident
    After:  T1 = cache(w);     T2 = sum(x * T1);           T1' = cache(w); T5 = T2 * T1'

    A resident tensor is laid out by its own split of the dims it has, which the merged row's
    loops map to only across the broadcast of the dims it lacks: each thread would read, at
    its place in the row, a slot another thread loaded for another element (fuzz
    20261130:4029). Reloaded at each use (from L1/L2), the copies are inlined into the row's
    loops and indexed from them."""
    row_ids = [i for i in row_ids if not i.is_broadcast]
    if len(row_ids) < 2:
        return
    done = set()
    while True:
        graph = IdGraph(fusion)     # rebuilt: clones carry IDs the last graph did not know
        pending = [(t, out) for t, out in uses_across_reductions(fusion, reds)
                   if t not in done and _holds_part_of_the_row(t, graph, row_ids)]
        if not pending:
            return
        t, outside = pending[0]
        done.add(t)
        recompute_for(t, outside, set(reds))


def schedule_looped(fusion, p: InnerPersistentParams) -> None:
    """The looped variant: [I, R] -> [I/By, By, S, 1, U, Bx, V], S serial steps over the row of U
    vectors per thread (unrolled, their loads issued together; the steps in bounds run
    unchecked through an Unswitch axis), Bx = threadIdx.x. Each pass
    over the row (each reduction's, then the outputs') has its own copy of what it reads, back
    to the inputs (recompute_each_pass), and its own S loop:

        for blockIdx.x: for threadIdx.y:
          for s: x[U][V] = loads; partial = f(partial, x)      <- pass 1, reads the row
          m = block_allreduce_x(partial)
          for s: x[U][V] = loads; out[...] = g(x, m)           <- pass 2, reads it again (L2)
    """
    # A softmax's max and sum of exp become one pass: the key's (max, sum) (logsumexp.py).
    fuse_logsumexp_for_passes(fusion)
    red = reduction_tensors(fusion)[0]
    orient_vector_inputs(fusion, p.vector_inputs, red.domain.maybe_root[_layout(red)[1][-1]])
    for v in fusion.inputs:
        if isinstance(v, TensorView) and cached_uses(v):
            cache_after(v)
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    reds = reduction_tensors(fusion)
    recompute_each_pass(fusion, reds)
    # The input caches, with each pass's copies of them.
    copies = [t for t in fusion.tensors() if isinstance(t.definition, LoadStoreOp)
              and t.definition.inputs[0].is_input()]
    ref = reference_reduction(reds)
    reds = [ref] + [r for r in reds if r is not ref]
    _, rpos = _layout(ref)
    # The row's extent stays a kernel argument (no row_extents), and the steps are kept rolled
    # (below) where the row's length is a constant anyway (an iota's, cross-entropy's one-hot).
    _merge_dims(ref, rpos)
    # [I, R] -> [I/By, By, S, 1 (Unswitch), U, Bx, V]: every step but the last is in bounds, and
    # the unswitch runs those without per-element checks (lower/unswitch.py).
    ref.split(1, p.vector).split(1, p.bdimx).split(1, p.unroll).split(1, 1)
    ref.split(0, p.bdimy)
    ref.parallelize(0, PT.BIDx).parallelize(1, PT.TIDy).parallelize(3, PT.Unswitch)
    ref.parallelize(5, PT.TIDx)
    propagate_transforms(ref)
    rfs = [rfactor(r, [2, 3, 4, 6]) for r in reds]
    parallelize_like(rfs[0], parallel_types={PT.BIDx, PT.TIDy, PT.TIDx, PT.Unswitch})
    if p.vector > 1:
        vec_graph = IdGraph(fusion, permissive=True)
        vec_axis = rfs[0].domain.loop[6]
        vector_reads = {fusion.inputs[k] for k in p.vector_inputs}
        for t in copies:
            if t.definition.inputs[0] in vector_reads:
                vectorize_along(t, vec_axis, vec_graph, p.vector)
        for o in outputs:
            vectorize_along(o, vec_axis, vec_graph, p.vector)
    inline_most(fusion=fusion)
    # Each input cache holds a step's U vectors, loaded together before any is used.
    for t in copies:
        if t.compute_at_pos > 4:
            inline_at(t, 4)
    # The steps stay one rolled loop per pass (IterDomain.rolled), also where the row's length
    # is a constant. Unrolled, each pass's body was repeated per step: cross-entropy
    # [8192, 128256] (an iota of 128256 fixes the row) took 9592 SASS instructions, 1744
    # rolled, and ran 1803-1811 us against 1767-1777 rolled; a division slow path inlined
    # at every element grew the unrolled code by a fifth and made it 1.4x slower, by code size
    # (H200, session 22).
    exact = IdGraph(fusion)
    steps = [r.domain.loop[2] for r in rfs]
    for t in fusion.tensors():
        for i in t.domain.loop:
            if any(exact.mapped(i, step) for step in steps):
                i.rolled = True
    # The rows in flight the heuristic counted on (two 1024-thread blocks per SM): ptxas, told
    # so, keeps 32 registers. Left to itself it took 44 for the unswitched log-softmax, one
    # block per SM: 2349 -> 1991 GB/s (H200, [4096, 50257] bf16).
    fusion.launch_hints["max_threads"] = p.bdimx * p.bdimy
    fusion.launch_hints["min_blocks"] = p.blocks_per_sm


def schedule(fusion, p: InnerPersistentParams) -> None:
    if p.looped:
        return schedule_looped(fusion, p)
    red = reduction_tensors(fusion)[0]
    orient_vector_inputs(fusion, p.vector_inputs, red.domain.maybe_root[_layout(red)[1][-1]])
    # TMA variant: input -> shared-memory slot (one bulk copy per row) -> registers.
    load = LoadKind.TmaTensor if p.tensor_map else LoadKind.TmaBulk
    staged = {k: cache_after(fusion.inputs[k], load) for k in p.tma_inputs}
    # cp.async variant: input -> shared-memory slot (each thread copies the vectors it reads)
    # -> registers.
    copied = {k: cache_after(fusion.inputs[k], LoadKind.CpAsync) for k in p.cp_async_inputs}
    slots = {**staged, **copied}
    caches = {k: cache_after(slots.get(k, v)) for k, v in enumerate(fusion.inputs)
              if isinstance(v, TensorView) and cached_uses(v)}
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    reds = reduction_tensors(fusion)
    if p.project_to_inputs:
        # Long rows need every register: recompute even transcendental chains then.
        long_rows = p.persistent_batch * p.vector > MAX_ELEMENTS_PER_THREAD // 2
        _project_to_inputs(fusion, set(caches.values()), reds, allow_expensive=long_rows)
    ref = reference_reduction(reds)
    reds = [ref] + [r for r in reds if r is not ref]      # rfs[0] is the reference's
    _, rpos = _layout(ref)
    _reload_partial_rows(fusion, reds, [ref.domain.maybe_root[k] for k in rpos])
    if p.row_extents:
        fusion.static_extents = {ref.domain.maybe_root[k].extent: v
                                 for k, v in zip(rpos, p.row_extents)
                                 if ref.domain.maybe_root[k].extent.value is None}
    _merge_dims(ref, rpos)
    # [I, R] -> [I/By, By, P, ceilDiv(R / V, P), V]; with a cluster of C blocks per row,
    # [I/By, By, C (blockIdx.y), P, ceilDiv(R / C / V, P), V]
    c = 1 if p.cluster > 1 else 0
    if c:
        ref.split(1, p.row_extents[0] // p.cluster, inner_split=True)
    ref.split(1 + c, p.vector).split(1 + c, p.persistent_batch, inner_split=False)
    ref.split(0, p.bdimy)
    rows = PT.GridStride if p.stages else PT.BIDx
    ref.parallelize(0, rows).parallelize(1, PT.TIDy).parallelize(3 + c, PT.TIDx)
    if c:
        ref.parallelize(2, PT.BIDy)
    propagate_transforms(ref, tensors=[t for t in fusion.tensors() if t not in staged.values()])
    rfs = [rfactor(r, [2 + c, 4 + c]) for r in reds]
    parallelize_like(rfs[0], parallel_types={rows, PT.TIDy, PT.TIDx, PT.BIDy})
    for slot in staged.values():
        # [I, R] -> [I/By (grid-stride), By (serial: one thread copies the stage's rows), R (bulk)]
        # With a tensor map, By is Bulk too: one box moves the stage.
        _merge_dims(slot, rpos)
        slot.split(0, p.bdimy)
        slot.parallelize(0, PT.GridStride).parallelize(2, PT.Bulk)
        if p.tensor_map:
            slot.parallelize(1, PT.Bulk)
    if p.vector > 1:
        # Each tensor takes the width its dtype and layout allow along the row's vector split:
        # a per-row statistic [M, 1] is written element-wise, an fp32 output of bf16 rows in
        # two 4-wide stores.
        vec_graph = IdGraph(fusion, permissive=True)
        vec_axis = rfs[0].domain.loop[4 + c]
        for k in p.vector_inputs:
            vectorize_along(caches[k], vec_axis, vec_graph, p.vector)
        for o in outputs:
            vectorize_along(o, vec_axis, vec_graph, p.vector)
    for k, nbytes in zip(p.cp_async_inputs, p.cp_async_bytes):
        # [I/By (grid-stride), By TIDy, P, bdimx TIDx, V]: the split of the input's register
        # cache, so each thread copies exactly the elements it reads back (no block barrier).
        width = vectorize(copied[k], -1, p.vector) if k in p.vector_inputs else 1
        if width * fusion.inputs[k].dtype.size != nbytes:
            raise SchedulerError(f"inner persistent: input {k} copied with cp.async in "
                                 f"{nbytes}-byte copies, but its split reads {width} elements")
    inline_most([t for t in fusion.tensors() if t not in slots.values()], fusion=fusion)
    kind = (WarpSpecialized(PT.TIDy, p.producer_registers or None, p.compute_registers or None,
                            p.compute_roles)
            if p.warp_specialized else None)
    for slot in staged.values():
        # Inlined right after the grid-stride loop: the rows of a stage share one slot and one
        # mbarrier; circular-buffered over that loop.
        inline_at(slot, 1)
        circular_buffer(slot, p.stages, p.prefetch, kind=kind)
    for slot in copied.values():
        # Inlined right after the grid-stride loop like the TMA slots; each stage is one
        # cp.async group of every thread.
        inline_at(slot, 1)
        circular_buffer(slot, p.stages, p.prefetch, kind=CpAsyncPipelined())
    # Each input cache holds the thread's whole share of the row, loaded before any use.
    graph = IdGraph(fusion, permissive=True)
    batch_axis = rfs[0].domain.loop[2 + c]
    # A cache without the row dim (a weight) computed outside the row loop stays in registers
    # across rows; when a row already fills the registers, it is reloaded per row (from L2).
    # A one-row input [1, N] broadcast over the rows has a row dim (a broadcast, mapped to the
    # rows): it is inlined like the rows.
    # A cache is kept (a weight across rows, a row across its reduction) only if it spans the
    # whole (merged) row: its split is then the row's split, element for element. A cache of
    # part of a merged row (x [M, K, N] reduced over [K, N] times w [N], or times r [M, 1, N])
    # has a split of its own that the row's loops map to only across the broadcast of K: each
    # thread would read, at its position in the row, a register slot that another thread
    # loaded for another element (fuzz 20261130:4029), or lowering cannot index it from the
    # row's loops (20261203:613). It is loaded where used.
    exact = IdGraph(fusion)
    row_axis = rfs[0].domain.loop[0]
    keep_weights = p.keep_weights
    for cache in caches.values():
        pos = next((k for k, i in enumerate(cache.domain.loop) if graph.mapped(i, batch_axis)), None)
        if pos is None or cache.compute_at_pos <= pos:
            continue
        if cache.domain.loop[pos].is_broadcast:
            continue        # a per-row scalar ([M, 1]): inlined, not a row of copies
        has_row = any(graph.mapped(i, row_axis) for i in cache.domain.loop)
        if (has_row or keep_weights) and exact.mapped(cache.domain.loop[pos], batch_axis):
            inline_at(cache, pos)
    launch = fusion.launch_hints
    if c:
        launch["cluster"] = (1, p.cluster, 1)
    if p.grid:
        launch["grid_x"] = p.grid
    launch["max_threads"] = p.bdimx * p.bdimy     # the block's threads (a static block)
    threads = -(-p.bdimx // 32) * 32 * p.bdimy    # in whole warps
    # Two resident 512-thread blocks per SM (64 registers each): with one block per SM a row's
    # reduction and stores leave the memory idle (layernorm 16384 at 80 registers: 74% of
    # copy). Smaller blocks already fit several per SM; longer rows need their registers.
    if p.stages:
        # The persistent grid plans this many blocks per SM; ptxas, told so, keeps the register
        # budget it allows (without it ptxas spilled a few bytes at 80-96 registers).
        launch["min_blocks"] = max(1, p.blocks_per_sm)
    elif threads == 512 and p.persistent_batch * p.vector <= MAX_ELEMENTS_PER_THREAD // 2:
        launch["min_blocks"] = 2

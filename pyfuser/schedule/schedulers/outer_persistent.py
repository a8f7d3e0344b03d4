"""Outer persistent scheduler: normalizations over the outer dims, each column on chip.

Fusions whose reductions are over the dims outermost in memory and whose results are broadcast
back over them: softmax or log_softmax over dim 0 of [R, C], a normalization over dim 0
((x - mean(x, 0)) * rsqrt(var(x, 0) + eps) * w[C] + b[C]), and the same over dim 1 of a
column-major [C, R] input (the order in memory decides, not the logical order). The reduced
dims are merged into R and the kept dims into I, each in memory order, so I's innermost dim is
the input's stride-1 dim:

    for blockIdx.x (column tiles of Bx * V):
      for threadIdx.y (By = ceilDiv(R, P) row slots): for threadIdx.x (Bx): V columns each
        x_regs[P][V] = x[p * By + tidy, tile + tidx * V + 0..V)    <- P 16-byte loads, issued
                                                                      together, kept in regs
        partial[0..V) = max over P of x_regs                        <- per thread
        m[0..V) = block_allreduce_y_group<V>(partial)              <- the column reduction
        partial[0..V) = sum over P of exp(x_regs - m)
        s[0..V) = block_allreduce_y_group<V>(partial)
        out[p * By + tidy, cols] = exp(x_regs - m) / s               <- 16-byte stores

Each thread keeps P x V elements of its columns in registers between the reductions (P a
constant, the reduced extents specialized as in the inner persistent scheduler); persistent
buffers are projected to the (16-bit) inputs unless that recomputes a transcendental chain
(inner_persistent._project_to_inputs). The column reductions across threadIdx.y are the
grouped block all-reductions of the outer reduction scheduler (lower/reductions.py groups the
V columns of a thread in one). Weights over the columns ([C]) are loaded once per block.

Limits: the reduced extent must fit one block's registers: By <= MAX_THREADS (512) threads of
P x V elements each (at most 64, and PERSISTENT_REGISTERS registers); narrower vectors are
tried first. A block that would then read under a 32-byte sector of each row, where one
twice as wide would still leave a column tile for every SM, is refused (8192 bf16 rows fit
8-byte vectors only; it is the registers, not the grid, that keep it narrow): the executor plans
the fusion split at its reductions (schedule/split_normalizations.py), whose kernels read
whole sectors. A softmax whose 16-bit columns are too long to hold exp(x - max) as floats
reduces its max and sum of exp as one logsumexp key reduction (logsumexp_keys). Longer columns
take the looped variant
(P = 0): the same block, a serial loop over ceilDiv(R, By) rows per thread, and every pass
(each reduction, then the outputs) reads the inputs again from global memory (L2), as a
non-persistent reduction does: correct for any extent, three reads for softmax instead of
one (shared-memory persistence, a grid-persistent or a two-kernel plan is later work).
One block per SM at 128 registers: loads of the next tile do not overlap the reductions of
this one. Reductions over dims that interleave with kept dims in memory, and reductions over
different dims, are refused.
"""
from __future__ import annotations

import dataclasses
import math

from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ..cache import cached_uses
from ...ir.tensor import TensorView
from .. import (inline_at, inline_most, parallelize_like,
                propagate_transforms, rfactor)
from .base import (RuntimeInfo, SchedulerError, cache_inputs_and_outputs, orient_vector_inputs,
                   reduction_tensors, reference_reduction, vector_inputs, vector_width,
                   vectorize_along)
from ..logsumexp import fuse_logsumexp_for_passes, pairs_fused_for_passes
from ..recompute import recompute_each_pass
from ..tma_rules import SECTOR_BYTES
from .inner_persistent import (MAX_ELEMENTS_PER_THREAD, _project_to_inputs, row_element_bytes,
                               same_row_dims)
from .reduction import (_pow2_floor, broadcast_back, is_over_reduced_tensor_dims,
                        iterates_part_of_reduced_dims)

NAME = "outer_persistent"

# Persistent data per thread: P x V elements, at most MAX_ELEMENTS_PER_THREAD (64, as the inner
# persistent scheduler) and PERSISTENT_REGISTERS registers, half of the 128 a 512-thread block
# allows each thread. Measured with ptxas on softmax over dim 0 of [2048, 8192] bf16: 64
# elements in 512 threads, 128 registers, no spill; 128 elements (16 x 8) spilled 124 bytes,
# and 64 elements in a 1024-thread block (64 registers) spilled 148 bytes: the grouped
# accumulators of the reductions and the index math need the other half.
PERSISTENT_REGISTERS = 64
MAX_THREADS = 512
# Bytes of one row a block reads at least (when the columns allow): two 32-byte sectors.
MIN_ROW_BYTES = 64
# The most threads along the rows a block should fold a column's values over (see
# compute_heuristics).
MAX_FOLD_ROWS = 128


@dataclasses.dataclass(frozen=True)
class OuterPersistentParams:
    vector: int                  # V: columns per thread, one 16-byte access per row
    bdimx: int                   # Bx: threads along the columns
    bdimy: int                   # By = ceilDiv(R, P): threads along the reduced rows
    persistent_batch: int        # P: rows per thread, held in registers (constant); 0: looped
    vector_inputs: tuple = ()
    project_to_inputs: bool = True
    # A softmax's max and sum of exp(x - max) reduced as one logsumexp key reduction
    # (logsumexp.fuse_logsumexp_for_passes): one block reduction, and exp(x - max) evaluated
    # for the outputs only (see compute_heuristics).
    logsumexp_keys: bool = False
    # The reduced extents the kernel is specialized on (constants: splits divide, predicates
    # fold). Part of the kernel's key.
    reduced_extents: tuple = ()
    reason: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        if self.persistent_batch == 0:
            return (f"outer persistent (looped): block {self.bdimx}x{self.bdimy}, "
                    f"{self.bdimx * self.vector} columns per block, each pass over the rows "
                    f"reads the inputs again, vector loads for inputs {list(self.vector_inputs)}"
                    + (f"\n  why: {self.reason}" if self.reason else ""))
        text = (f"outer persistent: block {self.bdimx}x{self.bdimy}, {self.bdimx * self.vector} "
                f"columns per block, {self.persistent_batch} x {self.vector} elements per thread "
                f"in registers, vector loads for inputs {list(self.vector_inputs)}"
                + (", buffers projected to inputs" if self.project_to_inputs else "")
                + (", max and sum of exp as one logsumexp key reduction"
                   if self.logsumexp_keys else ""))
        return text + (f"\n  why: {self.reason}" if self.reason else "")


def memory_order(fusion, red: TensorView, graph=None) -> list[int]:
    """The root positions of reduction `red`, outermost in memory first: the allocation order
    of the widest fusion input that has every (non-broadcast) dim of red, read through the
    exact ID graph (a column-major [C, R] input reduced over R has R outermost). The logical
    order when no input has them all (a fusion of fills)."""
    graph = graph or IdGraph(fusion)
    root = red.domain.maybe_root
    want = [k for k, i in enumerate(root) if not i.is_broadcast]
    best = None
    for v in fusion.inputs:
        if not isinstance(v, TensorView) or not cached_uses(v):
            continue
        alloc = [i for i in v.domain.maybe_allocation if not i.is_broadcast]
        where = {}
        for k in want:
            at = next((a for a, i in enumerate(alloc) if graph.mapped(i, root[k])), None)
            if at is None:
                break
            where[k] = at
        else:
            if best is None or v.dtype.size > best[0]:
                best = (v.dtype.size, where)
    if best is None:
        return list(range(len(root)))
    where = best[1]
    placed = sorted(want, key=lambda k: where[k])
    # Broadcast dims keep their logical place relative to nothing: put them outermost.
    return [k for k in range(len(root)) if k not in want] + placed


def outer_layout(fusion, red: TensorView, graph=None):
    """(outer, reduced positions, kept positions), both in memory order; `outer` is True when
    every reduced dim is outside every kept dim in memory (dims of extent 1 and broadcasts do
    not count), None when they interleave, False when the reduced dims are innermost."""
    root = red.domain.maybe_root
    order = memory_order(fusion, red, graph)
    real = [k for k in order if not root[k].is_broadcast and root[k].extent.value != 1]
    rpos = [k for k in order if root[k].is_reduction]
    kpos = [k for k in order if not root[k].is_reduction]
    r_real = [real.index(k) for k in real if root[k].is_reduction]
    k_real = [real.index(k) for k in real if not root[k].is_reduction]
    if not r_real or not k_real:
        return False, rpos, kpos
    if max(r_real) < min(k_real):
        return True, rpos, kpos
    if min(r_real) > max(k_real):
        return False, rpos, kpos
    return None, rpos, kpos


def can_schedule(fusion) -> tuple[bool, str]:
    reds = reduction_tensors(fusion)
    if not reds:
        return False, "no reductions"
    graph = IdGraph(fusion)
    if not any(broadcast_back(fusion, r, graph) for r in reds):
        return False, "no reduction result is broadcast back over the reduced dims"
    ref = reference_reduction(reds)
    for r in reds:
        if not same_row_dims(r, ref, graph):
            return False, "reductions over different dims"
    root = ref.domain.maybe_root
    if all(i.is_reduction or i.is_broadcast for i in root):
        return False, "a full reduction (no kept dims) is not supported yet"
    outer, _, _ = outer_layout(fusion, ref, graph)
    if outer is None:
        return False, "the reduced dims interleave with the kept dims in memory"
    if not outer:
        return False, "the reduced dims are not outermost in memory"
    rank = len(root)
    nred = sum(1 for i in root if i.is_reduction)
    for v in fusion.inputs:
        if isinstance(v, TensorView) and len(v.domain.logical) not in (rank, rank - nred):
            return False, f"input T{v.name} has a rank the column schedule does not cover"
    for k, o in enumerate(fusion.outputs):
        # A block holds its columns: an output over other dims (a reshape) needs elements of
        # other blocks' columns.
        if not is_over_reduced_tensor_dims(o, ref, graph):
            return False, (f"output {k} iterates dims other than the reduction's (such as a "
                           "reshape of the input): its elements are not within one column tile")
    for v in [*fusion.inputs, *fusion.outputs]:
        if isinstance(v, TensorView) and iterates_part_of_reduced_dims(v, ref, graph):
            # The rows are one merged loop along threadIdx.y; this tensor's loop there, a merge
            # that forwards its broadcasts, has another extent: an output's elements were never
            # written (fuzz 20261327:2369), an input's column cache read registers never
            # written (20261330:1384, x [3, 13, N] and w [1, 13, 1] over dims 0 and 1).
            return False, (f"T{v.name} iterates some of the reduced dims and broadcasts the "
                           "others: the merged row loop does not cover it")
    return True, ("reductions over the outermost dims broadcast back over them: keep the "
                  "columns on chip")


def compute_heuristics(fusion, info: RuntimeInfo) -> OuterPersistentParams:
    red = reference_reduction(reduction_tensors(fusion))
    _, rpos, kpos = outer_layout(fusion, red)
    root = red.domain.maybe_root

    def extent(k):
        return 1 if root[k].is_broadcast else info.extent(root[k].extent)
    r = math.prod(extent(k) for k in rpos)
    cols = math.prod(extent(k) for k in kpos)
    vec_id = next((root[k] for k in reversed(kpos) if not root[k].is_broadcast), None)
    widest = vector_width(fusion, info.extent(vec_id.extent), vec_id) if vec_id is not None else 1
    elem = row_element_bytes(fusion)
    reduced_extents = tuple(info.extent(root[k].extent) for k in rpos)
    # The widest vectors whose P x V elements per thread hold the reduced extent: narrower
    # accesses (more rows per thread) before no kernel at all.
    # Narrower vectors also while the block holds its columns with more than MAX_FOLD_ROWS
    # threads along the rows: each column reduction folds By values (a tree of log2(By) barrier
    # steps). Measured on the H100, softmax over dim 0 of [2048, 8192] bf16: V=8 (By=256) 960
    # GB/s, V=4 (By=128) 1093, V=2 (By=64) 1093, V=1 (By=32) 1049; torch.compile 973.
    vector, problem, chosen = widest, None, None
    while True:
        vec_inputs = vector_inputs(fusion, info, vector, vec_id) if vector > 1 else ()
        v = vector if vec_inputs else 1
        try:
            found = plan(r, cols, v, elem, vec_inputs, reduced_extents, info.device)
            if chosen is not None and found.bdimx * v * elem < SECTOR_BYTES:
                break       # narrower still: a block would read under a 32-byte sector a row
            if found.bdimy <= MAX_FOLD_ROWS or v == 1:
                chosen = found
                break
            chosen = chosen or found
        except SchedulerError as e:
            problem = problem or e
        if v == 1:
            break
        vector = v // 2
    if chosen is not None:
        # (outside the search: a plan refused for its narrow rows is not one to narrow further)
        return _with_logsumexp_keys(fusion, _wide_enough(chosen, cols, elem, info.device.sm_count),
                                    elem)
    vec_inputs = vector_inputs(fusion, info, widest, vec_id) if widest > 1 else ()
    return looped_plan(r, cols, widest if vec_inputs else 1, elem, vec_inputs, str(problem),
                       info.device.sm_count)


def _wide_enough(p: OuterPersistentParams, cols: int, elem: int,
                 sms: int) -> OuterPersistentParams:
    """`p`, unless its blocks read under a 32-byte sector of each row although tiles twice as
    wide would still fill every SM: the reduced extent is too long for the registers of a
    wider block. Each warp's load then fetches a sector per row for a fraction of it, and
    one 512-thread block per SM at about 100 registers leaves nothing to overlap its
    reductions with. Measured on the H200 (softmax over 8192 rows of bf16, 4 columns a block,
    8 bytes of each row; bench/results/2026-11-30/h200-outer-narrow-session26.txt): 865 GB/s
    of a transposed [4096, 8192] and 566 of a row-major [8192, 4096], where a plan of
    reduction kernels and one pass that recomputes from the input (schedule/
    split_normalizations.py) ran at 1193 and 1196 as three kernels. 16 columns of 2048 rows
    (32 bytes a row) stay: 1055 against 968."""
    wider_tiles = -(-cols // (2 * p.bdimx * p.vector))
    if p.bdimx * p.vector * elem < SECTOR_BYTES and wider_tiles >= sms:
        raise SchedulerError(
            f"outer persistent: {p.bdimy * p.persistent_batch} reduced rows fit a block's "
            f"registers only {p.bdimx * p.vector} columns wide, {p.bdimx * p.vector * elem} "
            f"bytes of each row, under a {SECTOR_BYTES}-byte sector: the statistics' kernels "
            "and one pass over the columns read whole sectors")
    return p


def recomputes_transcendental(p: OuterPersistentParams) -> bool:
    """Whether `p` holds too many elements a thread for a float row in registers, so that
    `schedule` projects the buffers to the inputs even through a transcendental chain (softmax's
    exp(x - max), evaluated for the sum and again for the outputs):
    inner_persistent._project_to_inputs' allow_expensive."""
    return p.persistent_batch * p.vector * 2 > PERSISTENT_REGISTERS


def _with_logsumexp_keys(fusion, p: OuterPersistentParams, elem: int) -> OuterPersistentParams:
    """`p` with logsumexp_keys where the fusion has a max / sum-of-exp pair, its 16-bit columns
    are too long to hold exp(x - max) as floats (recomputes_transcendental) and the option
    one_pass_logsumexp is not off. Both reductions then become one of (max, sum) keys: each
    element's exp goes into the key's running sum (ex2.approx, logsumexp.py), one block
    reduction instead of two, and exp(x - max) is evaluated once more, for the outputs.
    Measured on the H200, softmax over dim 0 in bf16, 64 elements a thread
    (bench/results/2026-12-01/h200-outer-logsumexp-session32.txt): 1.31-1.34x at
    [2048, 4096], [1024, 8192], [4096, 2048] and [2048, 8192], 1.28 for a transposed input of
    2048 x 4096; ncu: 60 registers against 104 (two 512-thread blocks an SM instead of one),
    27.1M warp instructions against 27.0M. Not taken where exp(x - max) is held as floats (32
    elements a thread or fewer: 0.90-1.02) nor for float32 columns (0.89-0.98: 64 floats a
    thread keep one block an SM)."""
    if (elem == 2 and recomputes_transcendental(p) and pairs_fused_for_passes(fusion)):
        return dataclasses.replace(p, logsumexp_keys=True, reason=(
            f"{p.reason}; the max and the sum of exp as one logsumexp key reduction (exp(x - "
            "max) would otherwise be evaluated twice, a thread's columns too long to hold it)"))
    return p


def looped_plan(r: int, cols: int, vector: int, elem: int, vec_inputs: tuple,
                why: str, sms: int) -> OuterPersistentParams:
    """Columns too long for registers: P = 0, a serial loop over ceilDiv(R, By) rows per
    thread, every pass over the rows (each reduction, the output) reads the inputs again.
    Raises SchedulerError when the column tiles would leave most SMs idle (BatchNorm of a
    channels-last [32, 256, 56, 56]: 100352 rows of 256 columns in 8 blocks ran at 30 GB/s on
    the H200): the executor then plans the fusion without this scheduler."""
    vecs = -(-cols // vector)
    bdimx = 1
    while bdimx * vector * elem < MIN_ROW_BYTES and bdimx * 2 <= _pow2_floor(vecs):
        bdimx *= 2
    tiles = -(-vecs // bdimx)
    if tiles < MIN_LOOPED_SM_FRACTION * sms:
        raise SchedulerError(
            f"outer persistent: {r} reduced rows are too many for registers, and looped over "
            f"in {tiles} column tiles they would keep {tiles} of {sms} SMs busy: that needs a "
            "grid-persistent plan (not yet)")
    bdimy = MAX_THREADS // bdimx
    return OuterPersistentParams(vector, bdimx, bdimy, 0, vec_inputs, reason=(
        f"looped: {why.removeprefix('outer persistent: ')}; instead each pass over the "
        f"{r} rows (every reduction, then the outputs) reads the inputs again"))


# The looped variant is refused when its column tiles cover under this fraction of the SMs:
# each tile loops over every row in one block, so the kernel runs at that share of the
# machine's bandwidth at best, and a plan of reduction and pointwise kernels reads the inputs
# as many times with every SM.
MIN_LOOPED_SM_FRACTION = 0.5


def max_batch(vector: int, elem: int) -> int:
    """The most rows P one thread holds: P x V elements, at most MAX_ELEMENTS_PER_THREAD and
    PERSISTENT_REGISTERS registers of `elem`-byte elements."""
    return max(1, min(MAX_ELEMENTS_PER_THREAD // vector,
                      PERSISTENT_REGISTERS * 4 // (vector * elem)))


def plan(r: int, cols: int, vector: int, elem: int, vec_inputs: tuple, reduced_extents: tuple,
         device) -> OuterPersistentParams:
    """The block for R reduced rows of `cols` columns read `vector` wide, `elem` bytes per
    element held: P, the fewest rows per thread (a power of two) that fit By = ceilDiv(R, P)
    in MAX_THREADS, raised while a thread holds under 4 vectors and By stays over 128 (loads in
    flight); then Bx threads along the columns while the block has at most MAX_THREADS and the
    grid keeps a column tile per SM, and more rows per thread (fewer threads along them) until
    a block reads MIN_ROW_BYTES of each row, when the columns, the SMs and the registers
    allow. Raises SchedulerError when the reduced extent does not fit."""
    most = max_batch(vector, elem)
    batch = 1
    while -(-r // batch) > MAX_THREADS:
        batch *= 2
    if batch > most:
        raise SchedulerError(
            f"outer persistent: {r} reduced rows need {batch} x {vector} elements of {elem} "
            f"bytes per thread of {MAX_THREADS} (at most {most} x {vector} fit registers): "
            "columns this long need shared memory or a grid-persistent plan (not yet)")
    while batch * 2 <= most and batch < 4 and -(-r // (batch * 2)) >= 128:
        batch *= 2
    vecs = -(-cols // vector)

    def wider(bdimx, bdimy):
        # Twice the columns per block, if the columns, the block size and the SMs allow it:
        # the column tiles stay at least one per SM, unless the block is under 4 warps.
        return (bdimx * 2 <= _pow2_floor(vecs) and 2 * bdimx * bdimy <= MAX_THREADS
                and (-(-vecs // (2 * bdimx)) >= device.sm_count or bdimx * bdimy < 128))

    def widest_block(batch):
        bdimy = -(-r // batch)
        bdimx = 1
        while wider(bdimx, bdimy):
            bdimx *= 2
        return bdimx, bdimy
    bdimx, bdimy = widest_block(batch)
    # Fewer threads along the rows (more rows each) for more along the columns, until a block
    # reads MIN_ROW_BYTES of each row, within the registers.
    while (bdimx * vector * elem < MIN_ROW_BYTES and batch * 2 <= most
           and wider(bdimx, -(-r // (batch * 2)))):
        batch *= 2
        bdimx, bdimy = widest_block(batch)
    tiles = -(-vecs // bdimx)
    reason = (f"{r} reduced rows x {bdimx * vector} columns per block in registers "
              f"({batch} x {vector} per thread), {tiles} column tiles on {device.sm_count} SMs")
    return OuterPersistentParams(vector, bdimx, bdimy, batch, vec_inputs,
                                 reduced_extents=reduced_extents, reason=reason)


def _merge_in_order(red: TensorView, kpos: list, rpos: list) -> None:
    """Reorder red's loop to kept dims then reduced dims, each in memory order, and merge each
    group into one: [I, R]."""
    order = kpos + rpos
    red.reorder({old: new for new, old in enumerate(order)})
    for _ in range(len(kpos) - 1):
        red.merge(0, 1)
    for _ in range(len(rpos) - 1):
        red.merge(1, 2)


def schedule(fusion, p: OuterPersistentParams) -> None:
    if p.logsumexp_keys:
        fuse_logsumexp_for_passes(fusion)
    red = reference_reduction(reduction_tensors(fusion))
    _, rpos, kpos = outer_layout(fusion, red)
    root = red.domain.maybe_root
    vec_id = next((root[k] for k in reversed(kpos) if not root[k].is_broadcast), None)
    orient_vector_inputs(fusion, p.vector_inputs, vec_id)
    caches, outputs = cache_inputs_and_outputs(fusion)
    reds = reduction_tensors(fusion)
    looped = p.persistent_batch == 0
    if looped:
        recompute_each_pass(fusion, reds)
    elif p.project_to_inputs:
        _project_to_inputs(fusion, set(caches.values()), reds,
                           allow_expensive=recomputes_transcendental(p))
    ref = reference_reduction(reds)
    reds = [ref] + [r for r in reds if r is not ref]
    _, rpos, kpos = outer_layout(fusion, ref)
    if p.reduced_extents:
        fusion.static_extents = {ref.domain.maybe_root[k].extent: v
                                 for k, v in zip(rpos, p.reduced_extents)
                                 if ref.domain.maybe_root[k].extent.value is None}
    _merge_in_order(ref, kpos, rpos)
    # [I, R] -> [I/(V*Bx), Bx, V, P, ceilDiv(R, P)] -> [I/(V*Bx), P, By, Bx, V]
    ref.split(0, p.vector).split(0, p.bdimx)
    if looped:
        ref.split(3, p.bdimy)
    else:
        ref.split(3, p.persistent_batch, inner_split=False)
    ref.reorder([0, 3, 4, 1, 2])
    ref.parallelize(0, PT.BIDx).parallelize(2, PT.TIDy).parallelize(3, PT.TIDx)
    propagate_transforms(ref)
    rfs = [rfactor(r, [1]) for r in reds]
    parallelize_like(rfs[0], parallel_types={PT.BIDx, PT.TIDy, PT.TIDx})
    if p.vector > 1:
        vec_graph = IdGraph(fusion, permissive=True)
        vec_axis = rfs[0].domain.loop[4]
        for k in p.vector_inputs:
            vectorize_along(caches[k], vec_axis, vec_graph, p.vector)
        for o in outputs:
            vectorize_along(o, vec_axis, vec_graph, p.vector)
    inline_most(fusion=fusion)
    if looped:
        fusion.launch_hints["max_threads"] = p.bdimx * p.bdimy
        return
    # Each input cache over the reduced dims holds the thread's P x V elements, all loaded
    # before the first reduction uses them; a weight over the columns is loaded once per block.
    graph = IdGraph(fusion, permissive=True)
    exact = IdGraph(fusion)
    batch_axis = rfs[0].domain.loop[1]
    for cache in caches.values():
        pos = next((k for k, i in enumerate(cache.domain.loop) if graph.mapped(i, batch_axis)),
                   None)
        if pos is None or cache.compute_at_pos <= pos:
            continue
        if cache.domain.loop[pos].is_broadcast:
            continue
        if exact.mapped(cache.domain.loop[pos], batch_axis):
            inline_at(cache, pos)
    fusion.launch_hints["max_threads"] = p.bdimx * p.bdimy

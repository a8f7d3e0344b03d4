"""Reduction scheduler: sums, maxima and minima whose results are not broadcast back.

Inner reduction (the reduced dims are innermost in memory), e.g. row sums of [M, N]:

    for blockIdx.x: for threadIdx.y (rows of this block):        rf = per-thread partial
      for r in serial: for u in U (unrolled): for threadIdx.x:     over 16-byte vectors
        partial += x[row, ((r * U + u) * Bx + tidx) * V + 0..V)
      sum = block_allreduce_x(partial); tidx 0 writes out[row]

Outer reduction (the reduced dims are outermost), e.g. column sums of [M, N]:

    for blockIdx.x (column tiles of Bx * V): for threadIdx.x, V columns each:
      for r in serial: for u in U: for threadIdx.y:  partial[0..V) += x[row, cols]
      sum[0..V) = block_allreduce_y_group<V>(partial); tidy 0 writes out[cols]

When rows are few and long (inner) or columns few (outer), each reduction is also split over
`grid_split` blocks along blockIdx.y: every block reduces its share, writes partials to a
workspace, and the last block to finish combines them with all its threads (each a fixed
strided share of the partials, then a block all-reduce: deterministic; codegen/cuda.py).
With `interleave` (outer reductions of few columns, full reductions of many steps) block g's
serial step r takes rows chunk r * G + g instead of its own contiguous share: the grid
sweeps the input together.

Full reduction (no kept dim iterates: [M, N] -> [], or [M, 1] -> [1]), e.g. sum(x * x):

    for blockIdx.y (G blocks): for r in serial: for u in U: for threadIdx.x:
      partial += x[((((by * S + r) * U + u) * Bx + tidx) * V + 0..V)]   <- pointwise prologue
    sum = block_allreduce_x(partial); partials[by] = sum; the last block:
      mine = partials[tidx], partials[tidx + Bx], ...; sum = block_allreduce_x(mine)

The same grid reduction as the grid-split inner reduction, with one row: the reduced dims
merged into one, split into 16-byte vectors, threads, unrolled loads and G blocks.

Dims are ordered by memory, not by their logical order: the reference input's allocation order
(`memory_order`: the input iterating the most dims of the reduction) decides which dims are
innermost, so a sum over dims (0, 2) of [A, B, C] is an inner reduction of the merged A*C
keeping B, and a sum over N, H, W of a channels-last [N, C, H, W] is an outer reduction keeping
C. The reduced dims are merged into one and the kept dims into one, each in memory order (the
merge of dims that are not adjacent is indexed by division and remainder); the vector width
divides the extent of the innermost dim alone, so every vector lies within it. Outputs keep
their own layout: each is indexed through the ID graph, and stores along a dim that is not its
stride-1 dim are element-wise (`vectorize`).
"""
from __future__ import annotations

import dataclasses
import functools

from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.tensor import TensorView
from .. import (inline_at, inline_most, parallelize_like,
                propagate_transforms, rfactor)
from ..inlining import upstream
from .base import (RuntimeInfo, SchedulerError, cache_inputs_and_outputs, mapped_dim,
                   orient_vector_inputs, own_copy, reduced_and_kept, reduction_tensors,
                   vector_inputs, vector_width, vectorize)

NAME = "reduction"


@dataclasses.dataclass(frozen=True)
class ReductionParams:
    inner: bool              # reduced dims innermost in memory
    vector: int              # elements per vector access along the contiguous dim
    bdimx: int
    bdimy: int
    unroll: int              # independent vector loads per thread per serial step
    vector_inputs: tuple = ()
    grid_split: int = 1      # blocks sharing one reduction (blockIdx.y), combined by the last
    full: bool = False       # no kept dim iterates: one value, the grid split over blockIdx.y
    stream_rows: bool = False  # the rows' (full: the) inputs loaded past L1 (_read_once)
    # Inner: the serial steps in bounds run without per-element checks (an Unswitch axis,
    # lower/unswitch.py), where a block's share of a row takes several steps and
    # UNSWITCH_STEPS is on.
    unswitch: bool = False
    # Full and outer: the blocks' steps interleaved (step s of block g reads chunk s * G + g,
    # the grid sweeping the input together) instead of each block reading one contiguous share.
    interleave: bool = False

    def describe(self) -> str:
        kind = "full" if self.full else ("inner" if self.inner else "outer")
        split = f", split over {self.grid_split} blocks" if self.grid_split > 1 else ""
        stream = (f", {'inputs' if self.full else 'rows'} streamed past L1"
                  if self.stream_rows else "")
        unswitch = ", steps in bounds unchecked" if self.unswitch and self.inner else ""
        sweep = (", blocks' steps interleaved" if self.interleave and (self.full or not self.inner)
                 else "")
        return (f"reduction ({kind}): block {self.bdimx}x{self.bdimy}, vector {self.vector}, "
                f"unroll {self.unroll}{split}, vector loads for inputs {list(self.vector_inputs)}"
                f"{stream}{unswitch}{sweep}")


def broadcast_back(fusion, red: TensorView, graph=None) -> bool:
    """True if a tensor computed from the reduction's result still has the reduced dims, i.e. the
    result is broadcast back over them (a normalization or softmax): a persistent pattern."""
    from ...ir.id_graph import IdGraph
    graph = graph or IdGraph(fusion)
    red_ids = [i for i in red.domain.maybe_root if i.is_reduction]
    stack, seen = [red], set()
    while stack:
        t = stack.pop()
        for c in fusion.consumers(t):
            if c in seen:
                continue
            seen.add(c)
            if any(graph.mapped(i, r) for i in c.domain.logical if not i.is_broadcast
                   for r in red_ids):
                return True
            stack.append(c)
    return False


def _layout(red: TensorView):
    """(inner, reduced logical positions): which end of the logical order the reduction is at
    (None: the reduced dims interleave with the kept ones). The inner persistent scheduler's
    view, which iterates the logical order; this scheduler reads the memory order (`layout`)."""
    root = red.domain.maybe_root
    rpos = [k for k, i in enumerate(root) if i.is_reduction and not (i.extent.value == 1)]
    ipos = [k for k, i in enumerate(root) if not i.is_reduction and not i.is_broadcast]
    if not rpos:
        return True, rpos
    if not ipos or min(rpos) > max(ipos):
        return True, rpos
    if max(rpos) < min(ipos):
        return False, rpos
    return None, rpos


def memory_order(red: TensorView, graph=None) -> list[int]:
    """Positions of the reduction's root dims, outermost in memory first: the allocation order
    of the fusion input that iterates the most of them (exact ID graph), a channels-last input
    putting C innermost. Dims that input lacks (a broadcast's new dims, broadcasts) keep their
    logical place; the dims it has fill the other places in its allocation order. With no such
    input (every input lacks the dims), the logical order."""
    graph = graph or IdGraph(red.fusion)
    root = red.domain.maybe_root
    best: list[int] = []
    for v in red.fusion.inputs:
        if not isinstance(v, TensorView):
            continue
        pos: list[int] = []
        for i in v.domain.maybe_allocation:
            if i.is_broadcast or i.is_reduction:
                continue
            k = next((k for k, r in enumerate(root) if k not in pos and not r.is_broadcast
                      and graph.mapped(i, r)), None)
            if k is not None:
                pos.append(k)
        if len(pos) > len(best):
            best = pos
    mapped = set(best)
    fill = iter(best)
    return [next(fill) if k in mapped else k for k in range(len(root))]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How reduction `red` is scheduled, from the memory order of its dims (memory_order)."""
    inner: bool             # the innermost dim in memory (not a broadcast nor of extent 1) is reduced
    full: bool              # no kept dim iterates (all kept dims are broadcasts)
    reduced: tuple          # root positions of the reduced dims, in memory order
    kept: tuple             # root positions of the kept dims, in memory order (broadcasts first)


def layout(red: TensorView, graph=None) -> Layout:
    root = red.domain.maybe_root
    order = memory_order(red, graph)
    reduced = tuple(k for k in order if root[k].is_reduction)
    # Kept broadcasts first: they iterate nothing, so where they go in the merge is free, and
    # outermost they never stand between the vector lanes and the dim those step through.
    kept = tuple([k for k in order if not root[k].is_reduction and root[k].is_broadcast]
                 + [k for k in order if not root[k].is_reduction and not root[k].is_broadcast])
    full = all(root[k].is_broadcast and root[k].expanded_extent is None for k in kept)
    live = [k for k in order if not root[k].is_broadcast and root[k].extent.value != 1]
    inner = full or not live or root[live[-1]].is_reduction
    return Layout(inner, full, reduced, kept)


def is_over_reduced_tensor_dims(tv: TensorView, red: TensorView, graph=None) -> bool:
    """True if tv's dims (broadcasts aside) are distinct dims of reduction `red`'s input, kept
    or reduced (exact ID graph): schedule() gives the reduction's iteration, which it replays
    onto every tensor through that graph; an output over some of those dims (a column [M, 1]
    beside column sums) is written once per element under write guards. A reshape of the
    input, or another input of as many dims, iterates other elements."""
    from ...ir.id_graph import IdGraph
    graph = graph or IdGraph(red.fusion)
    dims = [i for i in red.domain.maybe_root if not i.is_broadcast]
    ids = [i for i in tv.domain.logical_no_reductions if not i.is_broadcast]
    if len(ids) > len(dims):
        return False
    matched = set()
    for i in ids:
        j = next((k for k, x in enumerate(dims) if k not in matched and graph.mapped(i, x)), None)
        if j is None:
            return False
        matched.add(j)
    return True


def iterates_part_of_reduced_dims(tv: TensorView, red: TensorView, graph) -> bool:
    """True if tv iterates some of reduction `red`'s reduced dims (exact graph) and broadcasts
    the others. The schedules merge the reduced dims into one loop and split it; tv's loop,
    a merge that forwards its broadcasts, has another extent, so the splits of it that depend
    on the extent (shares of blocks along blockIdx.y, rows along threadIdx.y) do not line up
    with the kernel's: elements written twice or never (fuzz 20261327:2369, 20261328:431)."""
    reduced = [i for i in red.domain.maybe_root if i.is_reduction and not i.is_broadcast]
    dims = [i for i in tv.domain.logical_no_reductions if not i.is_broadcast]
    hit = [r for r in reduced if any(graph.mapped(i, r) for i in dims)]
    return 0 < len(hit) < len(reduced)


def can_schedule(fusion) -> tuple[bool, str]:
    reds = reduction_tensors(fusion)
    if not reds:
        return False, "no reductions"
    ref = reds[0]
    for r in reds:
        if [i.is_reduction for i in r.domain.maybe_root] != [i.is_reduction for i in ref.domain.maybe_root]:
            return False, "reductions over different dims"
        if broadcast_back(fusion, r):
            return False, f"T{r.name} is broadcast back to the reduced shape (a normalization)"
    graph = IdGraph(fusion)
    for r in reds[1:]:
        # schedule() gives every reduction the first one's loops (sum(dy) and sum(dy * x_hat)
        # of BatchNorm backward): their dims must be the same dims, not only as many.
        if not all(a.is_broadcast == b.is_broadcast and (a.is_broadcast or graph.mapped(a, b))
                   for a, b in zip(r.domain.maybe_root, ref.domain.maybe_root)):
            return False, (f"reductions T{ref.name} and T{r.name} reduce tensors of different "
                           "dims")
    lay = layout(ref, graph)
    reduced = [i for i in ref.domain.maybe_root if i.is_reduction and not i.is_broadcast]
    for k, o in enumerate(fusion.outputs):
        if not is_over_reduced_tensor_dims(o, ref, graph):
            return False, (f"an output whose dims are not the reduction's dims (output {k} "
                           "iterates other dims, such as a reshape of the input)")
        dims = [i for i in o.domain.logical_no_reductions if not i.is_broadcast]
        if (any(graph.mapped(i, r) for i in dims for r in reduced)
                and not all(any(graph.mapped(i, r) for r in reduced) for i in dims)):
            # The schedule's loops over the reduced dims are the reduction's (rfactor splits,
            # unrolled rows); caches of an output over kept and reduced dims were laid out by
            # that replay and indexed wrongly (a [1, N] input's cache read in vectors at
            # unaligned offsets: fuzz 20261123:226).
            return False, (f"output {k} iterates both the reduced and the kept dims (the "
                           "reduction's input itself, beside the reduction)")
        if iterates_part_of_reduced_dims(o, ref, graph):
            return False, (f"output {k} iterates some of the reduced dims and broadcasts the "
                           "others: its loop does not line up with the reduction's")
        if (dims and all(any(graph.mapped(i, r) for r in reduced) for i in dims)
                and len(o.domain.logical_no_reductions) < len(ref.domain.maybe_root)):
            # Over reduced dims only, it is written under guards on the loops of the kept
            # dims, which it must hold as broadcasts: squeezed away (a [1, N] row squeezed to
            # [N]), its loop nest lacks them and its producers cannot be inlined into it
            # (buffers of runtime size; fuzz 20261310:1533).
            return False, (f"output {k} iterates only reduced dims and lacks the kept ones (a "
                           "squeeze or reshape of a broadcast row, beside the reduction)")
    kept = [i for i in ref.domain.maybe_root if not i.is_reduction and not i.is_broadcast]
    kept_or_broadcast = [i for i in ref.domain.maybe_root if not i.is_reduction]
    for v in fusion.inputs:
        if not isinstance(v, TensorView) or len(v.domain.logical) == len(ref.domain.maybe_root):
            continue
        # An input of another rank (broadcast or squeezed in the fusion) over kept dims only
        # (a bias added to the result, running statistics), reduced dims only (a weight [N]
        # of a row's weighted sum), or some of both (x [M, K] of sum(x[:, None] * w[None], K),
        # a matmul of few rows as a reduction): its loops are some of the reduction's, and
        # its index along a merged loop of the kept dims is taken from that loop's index
        # (before, such an input was refused, and the segmenter wrote the broadcast product
        # to global memory for a reduction kernel to read back).
        dims = [i for i in v.domain.logical if not i.is_broadcast]
        over_kept = all(any(graph.mapped(i, k) for k in kept) for i in dims)
        over_reduced = all(any(graph.mapped(i, r) for r in reduced) for i in dims)
        size_one = [i for i in v.domain.logical if i.is_broadcast]
        if over_reduced and not over_kept and size_one and (len(kept) > 1 or (
                len(kept_or_broadcast) > 1
                and any(graph.mapped(i, k) for i in size_one for k in kept_or_broadcast))):
            # Its size-1 dim stands for one of several kept dims (some may be size-1 dims of
            # the reduction's input too: x [1, K] of sum(x[:, None] * w[None], K)): the kept
            # dims' merge replayed on it alone does not line up with the merged kept loop, and
            # its cache could not be inlined (a register buffer of runtime size; fuzz
            # 20263006:1396, 2530:53). Squeezed first, the same input is a row's weight.
            return False, (f"input T{v.name} has another rank than the reduction's input, over "
                           "reduced dims and a size-1 dim among the kept ones")
    kind = "full" if lay.full else ("inner" if lay.inner else "outer")
    return True, f"{kind} reduction, results not broadcast back"


def compute_heuristics(fusion, info: RuntimeInfo) -> ReductionParams:
    red = reduction_tensors(fusion)[0]
    lay = layout(red)
    red_n, iter_n = reduced_and_kept(red, lay.reduced, info)
    vec_id = vector_dim(red, lay)
    streamed = _streamed_inputs(fusion, red)
    vector = (vector_width(fusion, info.extent(vec_id.extent), vec_id, counted=streamed)
              if vec_id is not None else 1)
    vec_inputs = vector_inputs(fusion, info, vector, vec_id) if vec_id is not None else ()
    if not vec_inputs:
        vector = 1
    sms = info.device.sm_count
    # LOADS_PER_STEP shared among the inputs read at every step.
    max_unroll = _pow2_floor(max(1, LOADS_PER_STEP // max(1, len(streamed))))
    if lay.full:
        return _full_heuristics(red_n, vector, vec_inputs, sms)
    if lay.inner:
        vecs = max(1, red_n // vector)
        # Threads along the row until each holds two 16-byte pieces of it: more threads issuing
        # two loads each beat fewer issuing four (H200, row sums of [16384, 8192] bf16 with the
        # rows streamed past L1: 512 x 2 vectors 3987-4014 GB/s, 256 x 4 3734-3749). Counted
        # in bytes, not loads: a row that holds no vector (1001 bf16) got 256 threads of 4
        # elements and one row per block, 991 GB/s; 32 threads by 8 rows, 1555.
        pieces = max(1, red_n * max([v.dtype.size for v in streamed] + [1]) // 16)
        bdimx = 32
        while bdimx < 512 and pieces >= bdimx * 2 * 2:
            bdimx *= 2
        bdimy = max(1, min(256 // bdimx, _pow2_floor(iter_n)))
        # Element-wise loads move 2 or 4 bytes: twice as many in flight where each thread has
        # the elements (row sums of [4096, 50257] bf16: 512 x 8 3370 GB/s, 512 x 4 3085).
        cap = max_unroll * 2 if vector == 1 else max_unroll
        unroll = min(cap, 8 if vecs >= bdimx * 16 else 4 if vecs >= bdimx * 4
                     else 2 if vecs >= bdimx * 2 else 1)
        blocks = -(-iter_n // bdimy)
        # Few long rows: share each row among blocks until the grid covers the SMs twice, as
        # long as every block keeps several serial steps of work.
        split = 1
        step = _step_loads(unroll, max_unroll)
        while blocks * split < 2 * sms and vecs // (bdimx * step * split * 2) >= 4:
            split *= 2
        # A row read in one step, all its loads in flight at once, is streamed past L1: 3-5%
        # faster on the H200 at 4096 and 8192 columns (rows sums of bf16, 3910 against 3785
        # and 3970 against 3791 GB/s). Rows of many steps were not faster (65536 columns 3704
        # against 3727; logsumexp over 128256 columns 1689 against 1723).
        stream = bool(vec_inputs) and split == 1 and vecs <= bdimx * unroll
        steps = -(-vecs // (bdimx * unroll * split))
        return ReductionParams(True, vector, bdimx, bdimy, unroll, vec_inputs, split,
                               stream_rows=stream, unswitch=UNSWITCH_STEPS and steps >= 2)
    # Outer: rows of 32 x 16-byte vectors per block (512 contiguous bytes, full DRAM bursts);
    # if that leaves too few column tiles for the SMs, split the rows among blocks too.
    # Sweep on the H100, col_sum 16384x8192 bf16: 64 threads x 16 B (1 KB per row) by 8 rows,
    # unroll 4, 16 blocks per column tile: 2345 GB/s; 32x8: 2215; 128x2: 2053.
    cols = max(1, iter_n // vector)
    # Registers of a column's accumulators (a float64 accumulator takes two).
    accumulators = sum(max(1, r.dtype.size // 4) for r in reduction_tensors(fusion))
    step_registers = functools.partial(
        _unroll_in_registers, registers=info.device.registers_per_sm, vector=vector,
        held=accumulators + sum(
            1 for v in fusion.inputs
            if isinstance(v, TensorView) and v not in streamed and fusion.uses_of(v)),
        streamed_bytes=sum(v.dtype.size for v in streamed))
    if FEW_COLUMNS[0] <= cols <= FEW_COLUMNS[1] and FEW_COLUMNS_RULE:
        return _few_columns(red_n, cols, vector, vec_inputs, sms, max_unroll, step_registers,
                            accumulators, info.device.registers_per_sm)
    bdimx = min(64, _pow2_floor(cols))
    bdimy = max(1, min(512 // bdimx, _pow2_floor(red_n)))
    unroll = step_registers(max_unroll if red_n >= bdimy * max_unroll else 1, bdimx * bdimy)
    tiles = -(-cols // bdimx)
    split = 1
    step = _step_loads(unroll, max_unroll)
    while 2 * tiles * split < 3 * sms and red_n // (bdimy * step * split * 2) >= 4:
        split *= 2
    return ReductionParams(False, vector, bdimx, bdimy, unroll, vec_inputs, split)


# Unswitched steps in the inner reduction's heuristic: off, measured no faster on the H200
# (bench/results/2026-11-29/h200-looped-rows-session19.txt, same run as eager and compile: row
# sums of [16383, 1001] bf16 1578 GB/s against 1603-1608 without, [4096, 50257] 3333 against
# 3370-3390, [4096, 1002] 934 against 924; the GPU tests and fuzz passed with it on). The
# looped inner persistent kernels, whose steps are heavier, gained from it.
UNSWITCH_STEPS = False

# An outer reduction of 16 to 64 column vectors of 16 bytes (128 to 512 bf16 columns) takes the
# few-columns rule; FEW_COLUMNS_RULE off gives the general rule (tools/sweep_few_columns.py).
FEW_COLUMNS = (16, 64)
FEW_COLUMNS_RULE = True


# Vector loads in flight per thread per serial step, over the inputs read at every step: 4 of
# one input (the sweeps below), 2 each of two. BatchNorm backward's sums of dy and dy * x_hat
# of a channels-last [32, 256, 56, 56] (H200, tools/sweep_bn_stats.py --backward,
# bench/results/2026-11-29/h200-sweep-bn-backward-sums.txt): unroll 4 1325-1329 GB/s, 2
# 1657-1681, 1 1768, 8 943; of an NCHW one 2654 / 2712 / - (unroll 4 / 2, one block a row).
# One input (BatchNorm forward's sum): unroll 4 2335 (NCHW) and 1625 (NHWC) GB/s, 2 2015, 1587.
LOADS_PER_STEP = 4

# Registers a thread of an outer reduction holds besides its accumulators, its per-column
# operands and its loads in flight: addresses, indices, predicates, loop counters.
OTHER_REGISTERS = 24


def _unroll_in_registers(unroll: int, threads: int, *, registers: int, vector: int, held: int,
                         streamed_bytes: int) -> int:
    """The largest unroll up to `unroll` whose serial step fits in the registers a thread of a
    `threads`-thread block has (one block an SM), `unroll` halved until it does (1 at least).
    A thread of an outer reduction holds, for its `vector` columns, one fp32 value per
    reduction (the accumulators) and per input read once per column (a per-channel mean: the
    compiler keeps it out of the loop), and its loads in flight: `unroll` vectors of each
    streamed input (`streamed_bytes` per element, summed). Past the budget, ptxas spills the
    hoisted operands and reloads them from local memory at every step. BatchNorm backward's
    two sums of a channels-last [32, 256, 56, 56] (16 + 16 held, 2 bf16 inputs, 1024
    threads; H200, bench/results/2026-11-29/h200-sweep-bn-backward-unroll.txt): unroll 2
    68.6 us with 44-72 B of spills, unroll 1 51.8 us."""
    budget = _register_budget(registers, threads)
    while unroll > 1 and vector * held + unroll * vector * streamed_bytes / 4 > budget:
        unroll //= 2
    return unroll


def _register_budget(registers: int, threads: int) -> int:
    """Registers a thread of a `threads`-thread block (one block an SM) has for its
    accumulators, per-column operands and loads in flight."""
    return min(255, registers // threads) - OTHER_REGISTERS


def _step_loads(unroll: int, max_unroll: int) -> int:
    """A serial step's work in the loads of a single-input step (`unroll` of the `max_unroll`
    a step of this fusion's inputs allows), for the rules that split the rows among blocks
    while every block keeps several steps: a split the unroll cap alone made room for lost
    (H200: two sums over 2 blocks 2431 GB/s, over 1 2712)."""
    return unroll * (LOADS_PER_STEP // max_unroll)


def _inputs_over(fusion, red: TensorView, dims, inputs=None) -> list:
    """Those of `inputs` (default: all of the fusion's) that iterate every one of `dims` (IDs of
    red's root)."""
    graph = IdGraph(fusion)
    candidates = fusion.inputs if inputs is None else inputs
    return [v for v in candidates if isinstance(v, TensorView)
            and all(mapped_dim(v, d, graph) is not None for d in dims)]


def _streamed_inputs(fusion, red: TensorView) -> list:
    """The inputs that iterate every reduced dim of `red`: read at every serial step (an input
    over the kept dims only, such as a per-column mean, is read once per column)."""
    return _inputs_over(fusion, red, [i for i in red.domain.maybe_root
                                      if i.is_reduction and not i.is_broadcast])


def _read_once(fusion, red: TensorView, vec_inputs: tuple) -> set:
    """The vector-loaded inputs of a row reduction that iterate every dim of `red`: each
    element is read once, by a warp whose vectors cover whole sectors of a row, so keeping its
    lines in L1 serves nothing (H200, row sums of [16384, 8192] bf16 at 512 threads x 2 vectors:
    3762 GB/s allocating in L1, 3987-4014 without). A broadcast input (a weight over the
    columns) is read again for every row: it keeps L1."""
    return set(_inputs_over(fusion, red, [i for i in red.domain.maybe_root if not i.is_broadcast],
                            [fusion.inputs[k] for k in vec_inputs]))


def _few_columns(red_n: int, cols: int, vector: int, vec_inputs, sms: int, max_unroll: int,
                 step_registers, accumulators: int, registers: int) -> ReductionParams:
    """Few columns (BatchNorm's statistics of a channels-last image: 256 channels, N * H * W =
    100352 rows): 1024-thread blocks of 16 column vectors (256-byte row segments) by 64 rows,
    the rows split among blocks until the grid is about 1024 threads per SM (half the vector
    and 512-thread blocks where the accumulators take most of the registers; 2-byte elements
    by 32 threads of 8 bytes along the same segment otherwise; 512-thread blocks, one an SM,
    where the loads in flight would cut the unroll: below), the rows read past L1 with the
    blocks' steps interleaved. Swept on the H100 for
    that sum (bench/results/2026-11-27/h100-sweep-bn-stats.txt): 16x64 threads over 64 blocks
    1344 GB/s; 16x32 over 64: 1236; 32x32 over 128: 1219; the general rule's 32x16 over 256:
    883. Against the general rule, same run (h100-sweep-few-columns.txt): column sums of
    [100352, 256], [16384, 512], [16384, 256], [65536, 128] and [1024, 512] bf16 and [100352,
    128], [16384, 256] fp32 1.10-1.90x; [4096, 256] bf16 (2 MB) 0.88x. Below 16 vectors
    (narrower rows than 256 bytes) it lost: [8192, 64] 0.93x, [262144, 32] 0.94x."""
    def rows_and_unroll(bdimx: int) -> tuple[int, int]:
        # The rows of a block of at most 1024 threads, bdimx along the columns, and the unroll
        # the rows allow (before the registers).
        bdimy = max(1, min(1024 // bdimx, _pow2_floor(red_n)))
        return bdimy, (max_unroll if red_n >= bdimy * max_unroll else 1)
    bdimx = 16
    bdimy, unroll = rows_and_unroll(bdimx)
    fitted = step_registers(unroll, bdimx * bdimy)
    per_sm = 1024               # threads an SM holds (split rule below)
    if (fitted < unroll and vector >= 8
            and 2 * vector * accumulators > _register_budget(registers, bdimx * bdimy)):
        # The accumulators of 8 columns take more than half of a 1024-thread block's
        # registers and cut the unroll: half the columns a thread (twice the column
        # tiles) and half the rows a block, the unroll kept. BatchNorm's one-pass
        # statistics, two float64 sums (32 registers of 40; H200, tools/sweep_bn_stats.py
        # --one-pass): 16x64 vector 8 unroll 2, split 64 40.7-41.5 us; 16x32 vector 4
        # unroll 4, split 64 34.0-34.8; 32x32 vector 4 unroll 4 35.5. Not where they take
        # less: BatchNorm backward's two float32 sums (16 registers), cut to unroll 1 by
        # its two inputs, ran 50.8 us at vector 8 and 54.5 at 16x32 vector 4 unroll 2.
        vector, bdimy = vector // 2, max(1, bdimy // 2)
        cols *= 2
        unroll = step_registers(unroll, bdimx * bdimy, vector=vector)
    elif vector >= 8:
        # 16-byte vectors of 2-byte elements: two threads a vector instead (8-byte loads, 32
        # threads along the same 256-byte row segment), 1024-thread blocks, the unroll their
        # registers allow: a thread's accumulators and per-column operands halve. H200,
        # channels-last [32, 256, 56, 56] bf16, rows interleaved and streamed (tools/
        # sweep_bn_stats.py, bench/results/2026-12-01/h200-few-columns-session31.txt):
        # BatchNorm backward's two sums 16x32 vector 8 unroll 2 (104 registers, one block an
        # SM, the rule before) 42.8-42.9 us, 32x32 vector 4 unroll 2 (58 registers) 38.8-39.6,
        # 32x16 vector 4 unroll 4 39.3-39.5, 16x32 vector 4 unroll 4 (64-column tiles) 51.4;
        # the float32 sum 16x64 vector 8 unroll 4 25.6, 32x32 vector 4 unroll 4 23.0.
        vector, bdimx = vector // 2, bdimx * 2
        cols *= 2
        bdimy, unroll = rows_and_unroll(bdimx)
        unroll = step_registers(unroll, bdimx * bdimy, vector=vector)
    elif fitted < unroll and step_registers(unroll, bdimx * bdimy // 2) > fitted:
        # The unroll cut by a 1024-thread block's registers: 512-thread blocks keep it, one
        # block an SM (their registers then exceed half of it). BatchNorm backward's two
        # float32 sums beside the per-channel mean and rstd, at vector 8 (H200, tools/
        # sweep_bn_stats.py --backward --nhwc, rows interleaved and streamed,
        # bench/results/2026-11-30/h200-outer-rows-session30.txt): 16x64 unroll 1 46.1 us,
        # 16x32 unroll 2 43.4-43.8.
        bdimy //= 2
        unroll = step_registers(unroll, bdimx * bdimy)
        per_sm = bdimx * bdimy
    else:
        unroll = fitted
    tiles = -(-cols // bdimx)
    threads = bdimx * bdimy
    split = 1
    step = _step_loads(unroll, max_unroll)
    # Rows split until the grid holds about per_sm threads an SM: one block of 1024 or two of
    # 512, or the one 512-thread block whose registers leave no room for a second.
    while 2 * tiles * split * threads <= sms * per_sm and red_n // (bdimy * step * split * 2) >= 4:
        split *= 2
    # Each element is read once (stream_rows: past L1), and the blocks sweep the rows together
    # (interleave: block g's step s takes rows chunk s * G + g). H200, channels-last
    # [32, 256, 56, 56] bf16 (do_bench, L2 cleared; h200-outer-rows-session30.txt): BatchNorm
    # backward's two sums 52.2 -> 46.1 us (2229 GB/s), the forward's float64 statistics 34.7
    # -> 29.5, a float32 sum 29.3 -> 26.0; streaming alone 47.4 (the backward), interleaving
    # alone 50.8.
    return ReductionParams(False, vector, bdimx, bdimy, unroll, vec_inputs, split,
                           stream_rows=bool(vec_inputs), interleave=split > 1)


# Blocks of a full reduction per SM: two blocks of 512 threads, each with `unroll` 16-byte
# loads in flight per thread, keep 64 KB of loads in flight per SM; more blocks only lengthen
# the last block's pass over the partials (one per block, G / Bx of them per thread).
FULL_BLOCKS_PER_SM = 2
# Serial steps each block keeps at least (a step: bdimx * unroll vectors), so that the cost of
# a block (its block reduction, its partial's store and atomic) is spread over enough loads.
FULL_MIN_STEPS = 4
# A full reduction whose blocks take at most this many serial steps reads its inputs past L1
# (each element is read once). On the H200 (bench/results/2026-11-30/
# h200-full-reduction-streams-session29.txt, CUDA-graph time of one call): mse_mean of
# [2048, 4096] (4 steps) 19.5 -> 17.3 us, of [8192, 4096] (8 steps) 45.9 -> 42.3, amax of
# [8192, 8192] (16) 46.8 -> 43.8; of [16384, 8192] (32 steps) 137.1 -> 147.8, slower. An L2
# evict_first policy on the same loads measured the same as without it.
FULL_STREAM_MAX_STEPS = 16


def _full_heuristics(red_n: int, vector: int, vec_inputs: tuple, sms: int) -> ReductionParams:
    """One value from red_n elements: a block of up to 512 threads along x, 4 unrolled vector
    loads each, and as many blocks along y (at most FULL_BLOCKS_PER_SM per SM) as leave each
    FULL_MIN_STEPS serial steps."""
    vecs = max(1, -(-red_n // vector))
    bdimx = 32
    while bdimx < 512 and vecs >= bdimx * 2 * 4:
        bdimx *= 2
    unroll = 4 if vecs >= bdimx * 4 else (2 if vecs >= bdimx * 2 else 1)
    per_step = bdimx * unroll
    split = max(1, min(FULL_BLOCKS_PER_SM * sms, vecs // (per_step * FULL_MIN_STEPS)))
    steps = -(-vecs // (per_step * split))
    stream = bool(vec_inputs) and steps <= FULL_STREAM_MAX_STEPS
    # More steps: the blocks sweep the input together (interleave), 3% faster at 32 steps
    # (mse_mean of [16384, 8192]: 140.0 -> 135.2 us, CUDA graph; the same at 8 steps,
    # h200-full-reduction-streams-session29.txt).
    return ReductionParams(True, vector, bdimx, 1, unroll, vec_inputs, split, full=True,
                           stream_rows=stream, interleave=steps > FULL_STREAM_MAX_STEPS)


def vector_dim(red: TensorView, lay: Layout):
    """The root ID of reduction `red` whose split the vector lanes step through: the innermost
    dim in memory of the reduced ones (inner and full reductions) or of the kept ones (outer),
    not a broadcast, since schedule() merges each group in memory order and splits the vector
    off the merge. None when there is no such dim."""
    root = red.domain.maybe_root
    pos = lay.reduced if lay.inner else lay.kept
    return next((root[k] for k in reversed(pos) if not root[k].is_broadcast), None)


def _pow2_floor(x: int) -> int:
    v = 1
    while v * 2 <= x:
        v *= 2
    return v


def _merge_dims(red: TensorView, rpos: list[int], keep: list[int] | None = None) -> tuple[int, int]:
    """Merge the reduction's kept dims into one and its reduced dims into one, each group in the
    order given (`keep`: by default the dims not in `rpos`, in logical order).
    Returns the loop positions (iteration, reduction) after merging."""
    n = len(red.domain.loop)
    if keep is None:
        keep = [k for k in range(n) if k not in rpos]
    order = list(keep) + list(rpos)
    red.reorder({old: new for new, old in enumerate(order)})
    nk, nr = len(keep), len(rpos)
    if nk == 0:
        raise SchedulerError("reduction: no kept dims (a full reduction); merge_all instead")
    # Each group merges from its innermost dim outwards, a (b c) not (a b) c: the same loop, but
    # a run of dims contiguous in memory inside it is one merge, which indexing addresses
    # without division (lower/index._contiguous_runs): BatchNorm's sum over N, H and W of an
    # NCHW tensor divides by H * W once, not by W and then by H.
    for k in range(nk + nr - 2, nk - 1, -1):
        red.merge(k, k + 1)
    for k in range(nk - 2, -1, -1):
        red.merge(k, k + 1)
    return 0, 1


def _merge_all(red: TensorView, lay: Layout) -> None:
    """A full reduction's dims into one reduction axis: its kept broadcasts (iterating nothing)
    outermost, then the reduced dims in memory order. A merge with a broadcast forwards the
    other ID, so tensors without those broadcast dims (a squeeze upstream) get the same loops."""
    order = list(lay.kept) + list(lay.reduced)
    red.reorder({old: new for new, old in enumerate(order)})
    # From the innermost dim outwards, as _merge_dims.
    for k in range(len(order) - 2, -1, -1):
        red.merge(k, k + 1)


def _own_copies_beside_the_reduction(fusion, red: TensorView) -> None:
    """Uses of the reduction's operand chain that do not lead to the reduction (an output of
    the input's own shape beside a full reduction: sum(x) and x < 0.5) get their own copy of
    the chain, loads included.

    Before: C = set(x); S = sum(C); O = lt(C, 0.5)       C read in the reduction's loops and
                                                         in O's: one buffer for both nests,
                                                         of runtime size
    After:  C = set(x); S = sum(C); C' = set(x); O = lt(C', 0.5)

    Each copy inlines into its own loop nest; x is read twice (the second read mostly from
    the cache). Fuzz 20263002:259."""
    graph = IdGraph(fusion)
    reduced = [i for i in red.domain.maybe_root if i.is_reduction and not i.is_broadcast]

    def along_reduced(t: TensorView) -> bool:
        # Iterated by loops over the reduced dims: those are the reduction's own loops.
        return any(graph.mapped(i, r) for i in t.domain.logical_no_reductions
                   if not i.is_broadcast for r in reduced)
    feeding = {t for t in upstream(fusion, red) if t.definition is not None}
    # Tensors that lead to any reduction (a schedule that takes several keeps their sharing).
    reducing = set().union(*(upstream(fusion, r) | {r} for r in reduction_tensors(fusion)))
    for t in sorted(feeding, key=lambda t: t.name):
        outside = [u for u in fusion.uses_of(t)
                   if not any(o in reducing for o in u.outputs)
                   and any(isinstance(o, TensorView) and along_reduced(o) for o in u.outputs)]
        if outside:
            own_copy(t, outside, NAME)


def schedule(fusion, p: ReductionParams) -> None:
    red = reduction_tensors(fusion)[0]
    lay = layout(red)
    vec_id = vector_dim(red, lay)
    orient_vector_inputs(fusion, p.vector_inputs, vec_id)
    caches, _ = cache_inputs_and_outputs(fusion)
    reds = reduction_tensors(fusion)
    red = reds[0]
    for r in reds:
        _own_copies_beside_the_reduction(fusion, r)
    if p.stream_rows:
        fusion.streamed_inputs |= _read_once(fusion, red, p.vector_inputs)
    g = p.grid_split
    if p.full:
        # [R] -> [G, R/(G*V*Bx*U), U, Bx, V]; blockIdx.y takes G (the grid-split inner
        # reduction's loops with no row loops): split into vectors first, so that each block's
        # share starts at a multiple of V.
        _merge_all(red, lay)
        red.split(0, p.vector)
        if p.interleave:
            # [R] -> [R/(V*Bx*U*G), G, U, Bx, V] -> [G, R/(V*Bx*U*G), U, Bx, V]: block g's
            # step s is chunk s * G + g of U * Bx vectors.
            red.split(0, p.bdimx).split(0, p.unroll).split(0, g)
            red.reorder([1, 0, 2, 3, 4])
        else:
            red.split(0, g, inner_split=False)
            red.split(1, p.bdimx).split(1, p.unroll)
        red.parallelize(3, PT.TIDx)
        if g > 1:
            red.parallelize(0, PT.BIDy)
        rf_axes = [1, 2, 4]
        unroll_axis = 2
    elif p.inner:
        _merge_dims(red, list(lay.reduced), list(lay.kept))
        # [I, R] -> [I/By, By, G, R/(G*V*Bx*U), U, Bx, V]; blockIdx.y takes G. The row is
        # split into vectors before it is shared among the G blocks, so that each block's share
        # starts at a multiple of V (a share of ceilDiv(R, G) elements may not). With
        # p.unswitch, a size-1 Unswitch axis after the serial steps (..., R/(G*V*Bx*U), 1, U,
        # ...): the steps in bounds, all but the last, run without per-element checks
        # (lower/unswitch.py).
        us = 1 if p.unswitch else 0
        red.split(1, p.vector)
        red.split(1, g, inner_split=False)
        red.split(2, p.bdimx).split(2, p.unroll)
        if us:
            red.split(2, 1)
        red.split(0, p.bdimy)
        red.parallelize(0, PT.BIDx).parallelize(1, PT.TIDy).parallelize(5 + us, PT.TIDx)
        if us:
            red.parallelize(4, PT.Unswitch)
        if g > 1:
            red.parallelize(2, PT.BIDy)
        rf_axes = [3, 4, 6] if not us else [3, 4, 5, 7]
        unroll_axis = 4 + us
    else:
        _merge_dims(red, list(lay.reduced), list(lay.kept))
        # [I, R] -> [I/(V*Bx), Bx, V] x [G, R/(G*By*U), U, By], ordered
        # [I/(V*Bx), G, R/(G*By*U), U, By, Bx, V]; blockIdx.y takes G
        red.split(0, p.vector).split(0, p.bdimx)
        if p.interleave:
            # [R] -> [R/(By*U*G), G, U, By]: block g's step s is rows chunk s * G + g of
            # U * By rows (the grid sweeping the rows together).
            red.split(3, p.bdimy).split(3, p.unroll).split(3, g)
            red.reorder([0, 4, 3, 5, 6, 1, 2])
        else:
            red.split(3, g, inner_split=False)
            red.split(4, p.bdimy).split(4, p.unroll)
            red.reorder([0, 3, 4, 5, 6, 1, 2])
        red.parallelize(0, PT.BIDx).parallelize(4, PT.TIDy).parallelize(5, PT.TIDx)
        if g > 1:
            red.parallelize(1, PT.BIDy)
        rf_axes = [2, 3]
        unroll_axis = 3
    # Every reduction of the same dims (can_schedule) gets the first one's loops and its own
    # partials over the same axes. Forced onto another fusion, a reduction the propagation
    # does not reach keeps its serial loops (one thread each: correct, slow).
    propagate_transforms(red)
    rf = rfactor(red, rf_axes)
    for r in reds[1:]:
        if len(r.domain.loop) == len(red.domain.loop):
            rfactor(r, rf_axes)
    parallelize_like(rf, parallel_types={PT.BIDx, PT.BIDy, PT.TIDx, PT.TIDy, PT.Unswitch})
    if p.vector > 1:
        # The vector lanes' dim holds whole vectors (vector_width divides it; the executor
        # checks it before each launch), so the vector split, and one of the merged rows it is
        # part of, has no padding lanes: a lane needs no bounds check beyond its vector's
        # (lower/indexing.py). A logsumexp row of 128256 bf16 checked every element: about 5
        # instructions each of a kernel bound by the SM's issue rate.
        fusion.extent_multiples = {**fusion.extent_multiples, vec_id.extent: p.vector}
        for k in p.vector_inputs:
            vectorize(caches[k], -1, p.vector)
        for o in fusion.outputs:
            if not p.inner and o.definition is not None:
                vectorize(o, -1, p.vector)
    inline_most(fusion=fusion)
    # The input caches hold all `unroll` vectors of a serial step: their loads are issued
    # back to back before any of them is used (inlined deeper, each load would wait for the
    # math on the previous one, one load in flight per thread; seen in the SASS).
    for cache in caches.values():
        if cache.compute_at_pos > unroll_axis:
            inline_at(cache, unroll_axis)

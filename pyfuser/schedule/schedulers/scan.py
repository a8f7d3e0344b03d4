"""Scan scheduler: cumsum and cumprod along rows (a block scan), with the pointwise ops around
them in the same kernel.

Each row is scanned by one block, by a thread-block cluster of C blocks along blockIdx.y when it
is longer than one block holds, or, longer than a cluster of the device's largest portable size
holds, by as many blocks along blockIdx.y as it needs, chained through global memory. Many rows
of 4-byte inputs two blocks long or more are chained over 512-thread blocks instead of a
cluster (CHAIN_SPLIT_ROWS: two blocks an SM hide each other's wait for the prefix). Each
thread owns a contiguous chunk of P x V elements of its block's share of the row (the "blocked"
arrangement, so a thread's serial scan runs in row order):

    for blockIdx.x: for threadIdx.y (rows of the block): [for blockIdx.y (the row's blocks)]:
      carry = identity
      for threadIdx.x: for p, v:                  <- lower/scans.py: the thread's own scan
        x = f(in[row, ((bidy * T + tidx) * P + p) * V + v])     (16-byte loads of V)
        carry = carry + x;  s[p, v] = carry
      carry = block_exclusive_scan_x(carry)       <- warp shuffles, shared memory across warps;
                                                     + the totals of the row's blocks before
                                                     this one: a cluster's through distributed
                                                     shared memory, or else through global
                                                     memory (a decoupled look-back, scan.cuh)
      for threadIdx.x: for p, v: s[p, v] = carry + s[p, v]
      for threadIdx.x: for p, v: out[...] = g(s[p, v])          (16-byte stores of V)

The chained form reads and writes the row once (a single pass, as CUB's device scan), where a
multi-kernel plan would read it twice: a block publishes its total as soon as its own scan has
it, and takes its prefix from the block before it (or from the totals of up to 32 blocks before
it at a time, while those have no prefix yet). Measured on the H100 (tools/bench_issue18.py,
fp32 GB/s): [64, 1048576] 2032 (torch.compile 1081), [4, 16777216] 1820 (903); blocks that wait
for the block before them alone (no look-back) were as fast with 64 rows (2070) and 3.4x slower
with 4 (539: a chain of 1024 blocks, about 0.9 us a link).

The row length is a compile-time constant (splits divide, predicates fold). Taken: fusions of
element-wise ops (unary, binary, where, casts, broadcasts, fills) and scans, every scan along
the same dim, which is the innermost logical dim and the stride-1 dim of every input and output
that has it; every output iterates all the rows' dims. Refused (each with its reason; the scan
then runs as a library op, op_support.LIBRARY_FALLBACK_OPS, and the ops around it in kernels of
their own): reductions beside a scan (a top-p softmax is a persistent kernel, then this one), a
scan along a dim strided in memory, rows of more than 65535 blocks, 0-dim scans.

Memory access: a thread's chunk is contiguous, so read straight from global memory a warp's
16-byte loads would step by P x 16 bytes, each using half of every 32-byte sector it brings to
L2 (ncu on [4096, 4096] fp32: L2 at 85% of its peak, DRAM at 56%). With `staged` (STAGED),
the row's vector inputs and its outputs go through shared memory instead: the global
side is warp-striped ([.., P, T, V]: the threads of a p access consecutive vectors, CUB's
BLOCK_LOAD_WARP_TRANSPOSE), the register side blocked, one barrier between them each way:

      for p: for threadIdx.x: smem_in[(p * T + tidx) * V] = in[...]        (coalesced)
      for threadIdx.x: for p, v: x = smem_in[(tidx * P + p) * V + v] ...  (the scan as above)
      for threadIdx.x: for p: smem_out[(tidx * P + p) * V] = g(s[p, :])
      for p: for threadIdx.x: out[...] = smem_out[(p * T + tidx) * V]     (coalesced)

Rows stacked along threadIdx.y are staged too when a thread's chunk is STAGED_MIN_VECTORS
vectors or more. Each shared tensor is then computed in the block's loop alone (compute-at 1),
so that its buffer holds every row of the block; the copy in, the scan and the copy out are
three threadIdx.y loops with a barrier between them. The register side's shared reads are 4-way
bank conflicted (16-byte reads at a 64-byte stride); shared memory is not what limits these
kernels.
"""
from __future__ import annotations

import dataclasses

from ...ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, LoadStoreOp, ScanOp,
                         UnaryOp, WhereOp)
from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.scalar import ScalarOp
from ...ir.tensor import MemoryType, TensorView
from .. import (cache_after, cache_before, inline_at, inline_most, parallelize_like,
                propagate_transforms, set_memory_type)
from ..inlining import _downstream, upstream
from .base import (RuntimeInfo, SchedulerError, cache_inputs_and_outputs, chunked_row_shape,
                   mapped_dim, ops_beside, orient_vector_inputs, own_copy,
                   schedule_rows_in_chunks, strided_along, vector_inputs, vector_width,
                   vectorize_along)

NAME = "scan"            # offered the fusions with scans alone (op_support.DEDICATED_OPS)

# Ops the scan kernel computes beside its scans.
_ELEMENTWISE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, FullOp, ScalarOp)
# Threads per block at most, and bytes of the row one thread holds (16 fp32 elements: 1024
# threads x 16 registers of row data stay within the 64 registers a 1024-thread block allows).
MAX_THREADS = 1024
BYTES_PER_THREAD = 64
# A row is split over more blocks of a cluster (up to the device's largest) while the grid has
# fewer blocks than SMs, down to this many elements per block.
MIN_CLUSTER_SHARE = 2048
# Threads of a block at most when rows are stacked along threadIdx.y.
ROWS_BLOCK_THREADS = 256
# Blocks per row along blockIdx.y at most (gridDim.y's limit).
MAX_CHAIN_BLOCKS = 65535
# Rows of 4-byte inputs at least two blocks long, CHAIN_MIN_ROWS_PER_SM x SMs rows or more:
# blocks of CHAIN_THREADS threads chained through global memory (two share an SM, so one scans
# while the other waits for its prefix) rather than a cluster of full blocks or full chained
# blocks. Same call on the H100 (h100-sweep-scan-chain512.txt), fp32 GB/s, cluster or full
# blocks -> 512-thread chained blocks: [64, 128256] 1400 -> 1702, [256, 32768] 1632 -> 1919,
# [512, 262144] 2032 -> 2426, [64, 1048576] 2009 -> 1979; not taken where it lost: bf16 inputs
# ([64, 128256] 1387 -> 1253, [128, 65536] 1427 -> 1321), rows under two blocks ([4096, 20000]
# 2418 -> 2231), few rows ([2, 40000] 92 -> 69; [8, 131072] gained, 732 -> 822).
CHAIN_SPLIT_ROWS = True
CHAIN_THREADS = 512
CHAIN_MIN_ROWS_PER_SM = 0.25
# Stage the row through shared memory (ScanParams.staged): the same call on the H100 (tools/
# sweep_scan.py), cumsum fp32 [64, 128256] 1184 -> 1396 GB/s, [4096, 4096] 2016 -> 2525,
# [1024, 16384] 1858 -> 2259, bf16 [64, 128256] 1800 -> 2138.
STAGED = True
# Rows stacked along threadIdx.y are staged when a thread's chunk is at least this many vectors
# (its blocked global accesses then step by 64 bytes or more): same call, [8192, 1000] fp32
# (P = 4) 1670 -> 2163 GB/s, [16384, 256] fp32 (4) 1862 -> 2015, but [32768, 128] bf16 (P = 2,
# 8 threads of a warp busy) 2006 -> 1775.
STAGED_MIN_VECTORS = 4


@dataclasses.dataclass(frozen=True)
class ScanParams:
    vector: int                  # V: elements per access (16 bytes of the widest row input)
    per_thread: int              # P: vectors per thread (its contiguous chunk is P x V)
    bdimx: int                   # threads per row: ceilDiv(vectors, P) in whole warps
    bdimy: int = 1               # rows per block
    cluster: int = 1             # blocks per row in a thread-block cluster along blockIdx.y
    chain: int = 1               # or: blocks per row chained through global memory (blockIdx.y)
    block_elements: int = 0      # elements of the row per block (the row in one block)
    row_extent: int = 0          # the scanned extent the kernel is specialized on
    vector_inputs: tuple = ()
    # Row inputs and outputs staged through shared memory: global accesses warp-striped
    # (coalesced), registers read and written in the blocked order (STAGED).
    staged: bool = False
    reason: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        text = (f"scan: {self.bdimy} row(s) per block, {self.bdimx} threads per row, each a "
                f"contiguous chunk of {self.per_thread} x {self.vector} elements in registers, "
                f"vector loads for inputs {list(self.vector_inputs)}")
        if self.staged:
            text += ", row inputs and outputs staged through shared memory (coalesced)"
        if self.cluster > 1:
            text += (f"; each row of {self.row_extent} split over a cluster of {self.cluster} "
                     f"blocks ({self.block_elements} elements each), the blocks' totals "
                     "combined through distributed shared memory")
        if self.chain > 1:
            text += (f"; each row of {self.row_extent} split over {self.chain} blocks along "
                     f"blockIdx.y ({self.block_elements} elements each), each block's prefix "
                     "from the blocks before it through global memory (a decoupled look-back)")
        return text + (f"\n  why: {self.reason}" if self.reason else "")


def _scans(fusion) -> list:
    return [e for e in fusion.exprs() if isinstance(e, ScanOp)]


def _reference(fusion) -> ScanOp:
    return _scans(fusion)[0]


def can_schedule(fusion) -> tuple[bool, str]:
    scans = _scans(fusion)
    if not scans:
        return False, "no scans"
    why = ops_beside(fusion, _ELEMENTWISE + (ScanOp,), "scan")
    if why:
        return False, why
    ref = scans[0]
    out = ref.outputs[0]
    rank = len(out.domain.logical)
    if rank == 0:
        return False, "a 0-dim scan (the identity)"
    if ref.dim != rank - 1:
        return False, (f"a scan along dim {ref.dim} of {rank}: the kernel scans the innermost "
                       "logical dim (a scan across rows needs a column scan, not built)")
    graph = IdGraph(fusion)
    scanned = out.domain.logical[ref.dim]
    if scanned.is_broadcast:
        return False, "the scanned dim has one element (the frontend makes that scan a copy)"
    row_ids = [i for i in out.domain.logical if not i.is_broadcast]
    for e in scans[1:]:
        o = e.outputs[0]
        if len(o.domain.logical) != rank or not graph.mapped(o.domain.logical[e.dim], scanned):
            return False, "scans along different dims"
    for k, o in enumerate(fusion.outputs):
        if not isinstance(o, TensorView):
            return False, f"output {k} is a scalar"
        ids = [i for i in o.domain.logical if not i.is_broadcast]
        if len(ids) != len(row_ids) or not all(any(graph.mapped(i, r) for r in row_ids)
                                               for i in ids):
            return False, (f"output {k} does not iterate every dim of the scanned rows (the "
                           "kernel writes whole rows)")
    why = strided_along(fusion, scanned, graph, list(fusion.inputs) + list(fusion.outputs),
                        "scanned dim", "scan")
    if why:
        return False, why
    return True, "element-wise ops around scans along the innermost dim: a block scan per row"


def _row_bytes(fusion, ref: ScanOp, graph) -> int:
    """Bytes a row element takes in registers: the widest of the scans' dtypes and the row
    inputs' (16-bit inputs are scanned in float32)."""
    scanned = ref.outputs[0].domain.logical[ref.dim]
    sizes = [e.outputs[0].dtype.size for e in _scans(fusion)]
    sizes += [v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
              and mapped_dim(v, scanned, graph) is not None]
    return max(sizes)


def _row_input_bytes(fusion, ref: ScanOp, graph) -> int:
    """The widest dtype of the inputs along the scanned dim (0 without one)."""
    scanned = ref.outputs[0].domain.logical[ref.dim]
    return max((v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
                and mapped_dim(v, scanned, graph) is not None), default=0)


def compute_heuristics(fusion, info: RuntimeInfo) -> ScanParams:
    ref = _reference(fusion)
    out = ref.outputs[0]
    graph = IdGraph(fusion)
    scanned = out.domain.logical[ref.dim]
    n = info.extent(scanned.extent)
    m = 1
    for i in out.domain.logical[:ref.dim]:
        m *= info.extent(i.maybe_expanded_extent)
    elem = _row_bytes(fusion, ref, graph)
    vector = vector_width(fusion, max(n, 1), scanned)
    vec_inputs = vector_inputs(fusion, info, vector, scanned)
    if not vec_inputs:
        vector = 1
    per_thread_elems = max(1, BYTES_PER_THREAD // elem)
    capacity = MAX_THREADS * per_thread_elems
    max_cluster = info.device.max_cluster_size
    why = [f"a row of {n} elements"]
    cluster = chain = 1
    if (CHAIN_SPLIT_ROWS and n >= 2 * capacity and _row_input_bytes(fusion, ref, graph) == 4
            and m >= CHAIN_MIN_ROWS_PER_SM * info.device.sm_count):
        # Longer than a block holds: blocks of CHAIN_THREADS chained through global memory
        # along blockIdx.y (one pass over the row; see the module docstring).
        share = CHAIN_THREADS * per_thread_elems
        chain = -(-n // share)
        why.append(f"more than one block holds ({capacity} elements of {elem} bytes), so "
                   f"{chain} blocks of {share} chain their totals through global memory")
    elif n > capacity:
        while -(-n // cluster) > capacity and cluster < max_cluster:
            cluster *= 2
        if -(-n // cluster) > capacity:
            # Longer than a cluster holds: blocks of a full share each, chained.
            cluster, chain = 1, -(-n // capacity)
            why.append(f"more than a cluster of {max_cluster} blocks holds ({capacity} elements "
                       f"of {elem} bytes a block), so {chain} blocks chain their totals through "
                       "global memory")
        else:
            why.append(f"more than one block holds ({capacity} elements of {elem} bytes: "
                       f"{per_thread_elems} per thread of {MAX_THREADS})")
    if chain > MAX_CHAIN_BLOCKS:
        raise SchedulerError(f"a row of {n} x {elem} bytes needs {chain} blocks, over "
                             f"gridDim.y's {MAX_CHAIN_BLOCKS}; the library op runs it")
    grown = cluster
    while (chain == 1 and m * cluster < info.device.sm_count and cluster < max_cluster
           and -(-n // (cluster * 2)) >= MIN_CLUSTER_SHARE):
        cluster *= 2
    if cluster > grown:
        why.append(f"{m} row(s) fill fewer than {info.device.sm_count} SMs, so each row is "
                   f"split over {cluster} blocks")
    row_blocks = cluster * chain
    vecs_per_block = -(-(-(-n // row_blocks)) // vector)
    block_elements = vecs_per_block * vector
    if row_blocks > 1 and -(-n // block_elements) != row_blocks:
        raise SchedulerError(f"{n} elements do not split over {row_blocks} blocks of "
                             f"{block_elements}")
    # Rows stack along threadIdx.y only in one-block rows (up to ROWS_BLOCK_THREADS threads).
    p, bdimx, bdimy = chunked_row_shape(vecs_per_block, max(1, per_thread_elems // vector),
                                        MAX_THREADS, m if row_blocks == 1 else 1,
                                        ROWS_BLOCK_THREADS)
    return ScanParams(vector=vector, per_thread=p, bdimx=bdimx, bdimy=bdimy, cluster=cluster,
                      chain=chain, block_elements=block_elements, row_extent=n, vector_inputs=vec_inputs,
                      staged=STAGED and (bdimy == 1 or p >= STAGED_MIN_VECTORS),
                      reason=", ".join(why))


def schedule(fusion, p: ScanParams) -> None:
    ref = _reference(fusion)
    scanned = ref.outputs[0].domain.logical[ref.dim]
    orient_vector_inputs(fusion, p.vector_inputs, scanned)
    caches, outputs = cache_inputs_and_outputs(fusion)
    _own_copies_after_the_scans(fusion)
    staged, shared = (_stage_through_shared(fusion, caches, outputs, scanned, p.vector_inputs)
                      if p.staged else ([], []))
    ref = _reference(fusion)              # cache_before moved an output scan's result
    tv = ref.outputs[0]
    if scanned.extent.value is None:
        fusion.static_extents = {scanned.extent: p.row_extent}
    _row_schedule(tv, p, striped=False)
    others = [t for t in fusion.tensors() if t not in staged]
    propagate_transforms(tv, others)
    parallelize_like(tv, others, parallel_types={PT.BIDx, PT.TIDy, PT.BIDy, PT.TIDx})
    for g in staged:
        # The global side of a staged row: a warp's vector accesses at one p are consecutive;
        # shared memory gives the registers the blocked order.
        _row_schedule(g, p, striped=True)
    if p.vector > 1:
        graph = IdGraph(fusion, permissive=True)
        vec_axis = tv.domain.loop[-1]
        for k in p.vector_inputs:
            vectorize_along(caches[k], vec_axis, graph, p.vector)
        for o in outputs:
            vectorize_along(o, vec_axis, graph, p.vector)
        for g in staged + shared:
            vectorize_along(g, vec_axis, graph, p.vector)
    # Each scan's result stops at its threadIdx.x loop (inlining.max_inline_position): its own
    # loops are the thread's scan, followed by the block scan and the prefix (lower/scans.py).
    inline_most(fusion=fusion)
    if staged and p.bdimy > 1:
        # Rows stacked along threadIdx.y: each staged shared tensor is computed in the block's
        # loop alone, so that its threadIdx.y loop is its own and its buffer holds every row of
        # the block (allocation covers the loops right of the compute-at position).
        for g in shared:
            inline_at(g, 1)
    launch = fusion.launch_hints
    if p.cluster > 1:
        launch["cluster"] = (1, p.cluster, 1)
    launch["block_x"] = p.bdimx
    launch["max_threads"] = p.bdimx * p.bdimy


def _own_copies_after_the_scans(fusion) -> None:
    """A tensor that does not lead into a scan, read both by a use of a scan's result and by
    another use, gives the use of the result its own copy of its chain, loads included.

    Before: B = set(b); L = lt(B, C); S = cumsum(f(C)); W = where(B, S, ...)
    After:  B = set(b); L = lt(B, C); S = cumsum(f(C)); B' = set(b); W = where(B', S, ...)

    Inlined into both, B put W in L's loop nest, which is also the scan's own (L reads C, the
    scan's input): W read S before the block scan added each thread's prefix (wrong values on
    every chunk but the first: fuzz 20263014:64). A tensor that leads into the scan (x beside
    cumsum(x)) is held across it instead (inlining's persistent limits)."""
    results = [e.outputs[0] for e in _scans(fusion)]
    after = set().union(*(_downstream(fusion, r) for r in results))
    into = set().union(*(upstream(fusion, r) | {r} for r in results))
    for t in sorted(fusion.tensors(), key=lambda t: t.name):
        if t.definition is None or t in after or t in into:
            continue
        uses = fusion.uses_of(t)
        reading = [u for u in uses if any(o in after for o in u.outputs)]
        if reading and len(reading) < len(uses):
            own_copy(t, reading, NAME)


def _row_schedule(tv: TensorView, p: ScanParams, striped: bool) -> None:
    """base.schedule_rows_in_chunks with the heuristic's shape."""
    schedule_rows_in_chunks(tv, p.vector, p.per_thread, p.bdimx, p.bdimy,
                            p.cluster * p.chain, p.block_elements, striped)


def _stage_through_shared(fusion, caches: dict, outputs: list, scanned,
                          vector_inputs: tuple) -> tuple[list, list]:
    """Stage the row's vector inputs (those the heuristic reads with vectors: the others,
    misaligned or strided in this call, stay element-wise reads in the blocked order) and its
    outputs through shared memory: each such input's cache becomes a shared tensor read into a
    register cache, each output along the row is written from a shared copy of its value.
    Returns (the tensors whose loops face global memory: the shared input caches and the
    outputs, which schedule() gives the warp-striped order; the shared tensors)."""
    graph = IdGraph(fusion)
    ref = _reference(fusion).outputs[0]
    shape = [i.is_broadcast for i in ref.domain.logical]

    def like_the_row(t) -> bool:
        # Scheduled like the reference on its own (_row_schedule): the same dims.
        return (mapped_dim(t, scanned, graph) is not None
                and [i.is_broadcast for i in t.domain.logical] == shape)

    staged, shared = [], []
    for k, c in list(caches.items()):
        if k not in vector_inputs or not like_the_row(c):
            continue
        set_memory_type(c, MemoryType.Shared)
        caches[k] = cache_after(c)
        staged.append(c)
        shared.append(c)
    for o in outputs:
        if not like_the_row(o):
            continue
        copy = cache_before(o)
        set_memory_type(copy, MemoryType.Shared)
        staged.append(o)
        shared.append(copy)
    return staged, shared


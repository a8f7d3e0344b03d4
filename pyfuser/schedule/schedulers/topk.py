"""Top-k scheduler: torch.topk along rows that fit on chip (a block top-k per row), with the
element-wise ops before it on the row and after it on the k selected elements in the same
kernel.

Each row is held by the threads of one row of the block, each thread a contiguous chunk of
P x V elements in registers (the scan scheduler's "blocked" arrangement: element n of the row is
register n - threadIdx.x * P * V of thread threadIdx.x). The k results are spread over the same
threads, result j in register j / B of thread j % B (B = blockDim.x, or k when k is smaller;
k = 1 is a broadcast dim, torch's [.., 1], and every thread of the row holds the result):

    for blockIdx.x: for threadIdx.y (rows of the block):
      for threadIdx.x: for p, v:
        x[p, v] = f(in[row, (tidx * P + p) * V + v])        (16-byte loads of V)
      block_topk_x(x -> values, indices)                   <- lower/topk.py: k rounds of a
                                                              row-wide max of int64 keys
      for j_out: for threadIdx.x:                          <- j = j_out * B + threadIdx.x < k
        out_values[row, j] = g(values[j_out]); out_indices[row, j] = h(indices[j_out])

A round's key orders the values (the argmax key of runtime/arg_key.py: value order high,
2^32 - 1 - index low), so of equal values the lowest index comes first; NaN counts above every
number, as torch.topk. The row length is a compile-time constant (splits divide, predicates
fold).

Taken: fusions of element-wise ops (unary, binary, where, casts, broadcasts, fills) and one top-k
with a constant k along the innermost logical dim, the stride-1 dim of every input that has it;
every tensor iterates the rows and either the row's elements or the k selected ones; float32,
16-bit float and int32 values. Refused (each with its reason; the top-k then runs as
torch.topk, op_support.LIBRARY_FALLBACK_OPS, and the ops around it in kernels of their own):
reductions or scans beside it, a runtime k, k above MAX_K (k rounds of a block-wide max each),
rows longer than one block holds (MAX_THREADS x MAX_CHUNK elements), 64-bit values (their
order does not fit the key's 32 bits), a top-k along a dim strided in memory.
"""
from __future__ import annotations

import dataclasses

from ...ir.dtype import DataType
from ...ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, LoadStoreOp, TopKOp, UnaryOp,
                         WhereOp)
from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.scalar import ScalarOp
from ...ir.tensor import TensorView
from .. import inline_most, parallelize_like, propagate_transforms
from .base import (RuntimeInfo, SchedulerError, cache_inputs_and_outputs, chunked_row_shape,
                   ops_beside, orient_vector_inputs, schedule_rows_in_chunks, strided_along,
                   vector_inputs, vector_width, vectorize_along)

NAME = "topk"            # offered the fusions with a top-k alone (op_support.DEDICATED_OPS)

_ELEMENTWISE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, FullOp, ScalarOp)
# Value dtypes whose order fits the key's high 32 bits.
VALUE_DTYPES = (DataType.Float, DataType.BFloat16, DataType.Half, DataType.Int32)
MAX_THREADS = 1024
# Elements of the row one thread holds: each also takes an int64 key in registers (16 elements:
# 32 registers of keys beside the values).
MAX_CHUNK = 16
# Each selected element costs a row-wide max (a barrier when the row spans warps): beyond this
# many, torch.topk's radix select is the better plan.
MAX_K = 64
# Threads of a block at most when rows are stacked along threadIdx.y.
ROWS_BLOCK_THREADS = 256


@dataclasses.dataclass(frozen=True)
class TopKParams:
    vector: int                  # V: elements per access (16 bytes of the widest row input)
    per_thread: int              # P: vectors per thread (its contiguous chunk is P x V)
    bdimx: int                   # threads per row: ceilDiv(vectors, P) in whole warps
    bdimy: int = 1               # rows per block
    k_threads: int = 1           # B: threads the k results are spread over (result j: j % B)
    row_extent: int = 0          # the row length the kernel is specialized on
    vector_inputs: tuple = ()
    reason: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        text = (f"topk: {self.bdimy} row(s) per block, {self.bdimx} threads per row, each a "
                f"contiguous chunk of {self.per_thread} x {self.vector} elements in registers, "
                f"the k results over {self.k_threads} threads, vector loads for inputs "
                f"{list(self.vector_inputs)}")
        return text + (f"\n  why: {self.reason}" if self.reason else "")


def _topks(fusion) -> list:
    return [e for e in fusion.exprs() if isinstance(e, TopKOp)]


def _sides(op: TopKOp) -> tuple:
    """(x's logical ID along the top-k's dim, the values' ID of the k selected elements, which
    the ID graph maps to the indices')."""
    return op.inputs[0].domain.logical_no_reductions[op.dim], op.outputs[0].domain.logical[op.dim]


def can_schedule(fusion) -> tuple[bool, str]:
    ops = _topks(fusion)
    if not ops:
        return False, "no top-k"
    if len(ops) > 1:
        return False, f"{len(ops)} top-ks (the kernel computes one)"
    why = ops_beside(fusion, _ELEMENTWISE + (TopKOp,), "top-k")
    if why:
        return False, why
    op = ops[0]
    x = op.inputs[0]
    rank = len(x.domain.logical_no_reductions)
    if op.k is None:
        return False, "a runtime k (the kernel is specialized on k)"
    if op.k < 1:
        return False, "k = 0 selects nothing"
    if op.k > MAX_K:
        return False, (f"k = {op.k} is more than {MAX_K} (one row-wide max per selected "
                       "element; torch.topk's radix select is faster there)")
    if x.dtype not in VALUE_DTYPES:
        return False, (f"{x.dtype.short_name} values (the kernel orders float32, 16-bit float and "
                       "int32 values)")
    if op.dim != rank - 1:
        return False, (f"a top-k along dim {op.dim} of {rank}: the kernel selects along the "
                       "innermost logical dim")
    graph = IdGraph(fusion)
    row_id, k_id = _sides(op)
    if row_id.is_broadcast:
        return False, ("a top-k along a dim the definition makes a broadcast (one element); "
                       "torch.topk runs it")
    rows = [i for d, i in enumerate(x.domain.logical_no_reductions)
            if d != op.dim and not i.is_broadcast]

    def iterates(tv, i) -> bool:
        return any(graph.mapped(j, i) for j in tv.domain.logical if not j.is_broadcast)

    for tv in fusion.tensors():
        on_row = iterates(tv, row_id)
        on_k = iterates(tv, k_id)
        if on_row and on_k:
            return False, (f"T{tv.name} iterates both the row and the k selected elements (a "
                           "top-k result combined with the row)")
    for n, o in enumerate(fusion.outputs):
        if not isinstance(o, TensorView):
            return False, f"output {n} is a scalar"
        if not all(iterates(o, r) for r in rows):
            return False, (f"output {n} does not iterate every row dim (the kernel writes whole "
                           "rows)")
        if not (iterates(o, row_id) or iterates(o, k_id) or op.k == 1):
            return False, f"output {n} iterates neither the row nor the k selected elements"
    why = strided_along(fusion, row_id, graph, list(fusion.inputs), "top-k's dim", "top-k")
    if why:
        return False, why
    return True, (f"element-wise ops around a top-k of {op.k} along the innermost dim: a block "
                  "top-k per row")


def compute_heuristics(fusion, info: RuntimeInfo) -> TopKParams:
    op = _topks(fusion)[0]
    x = op.inputs[0]
    row_id = x.domain.logical_no_reductions[op.dim]
    n = info.extent(row_id.extent)
    m = 1
    for i in x.domain.logical_no_reductions[:op.dim]:
        m *= info.extent(i.maybe_expanded_extent)
    if op.k > n:
        raise SchedulerError(f"k = {op.k} is more than the row's {n} elements")
    vector = vector_width(fusion, max(n, 1), row_id)
    vec_inputs = vector_inputs(fusion, info, vector, row_id)
    if not vec_inputs:
        vector = 1
    capacity = MAX_THREADS * MAX_CHUNK
    if n > capacity:
        raise SchedulerError(f"a row of {n} elements is more than one block holds ({capacity}: "
                             f"{MAX_CHUNK} per thread of {MAX_THREADS}); torch.topk runs it")
    vectors = -(-n // vector)
    # Chunks as long as MAX_CHUNK allows, but short enough that the row spans a warp: each
    # round, the thread holding the element taken scans its chunk again.
    p, bdimx, bdimy = chunked_row_shape(vectors, max(1, min(MAX_CHUNK // vector,
                                                            -(-vectors // 32))),
                                        MAX_THREADS, m, ROWS_BLOCK_THREADS)
    why = [f"a row of {n} elements in {bdimx} threads of {p * vector}"]
    if bdimy > 1:
        why.append(f"{bdimy} rows per block")
    return TopKParams(vector=vector, per_thread=p, bdimx=bdimx, bdimy=bdimy,
                      k_threads=min(op.k, bdimx), row_extent=n, vector_inputs=vec_inputs,
                      reason=", ".join(why))


def schedule(fusion, p: TopKParams) -> None:
    op = _topks(fusion)[0]
    row_id = op.inputs[0].domain.logical_no_reductions[op.dim]
    orient_vector_inputs(fusion, p.vector_inputs, row_id)
    caches, outputs = cache_inputs_and_outputs(fusion)
    op = _topks(fusion)[0]
    x, values = op.inputs[0], op.outputs[0]
    if row_id.extent.value is None:
        fusion.static_extents = {row_id.extent: p.row_extent}
    # The row side, from the top-k's input: [rows..., N] -> [M / By, By, T, P, V].
    schedule_rows_in_chunks(x, p.vector, p.per_thread, p.bdimx, p.bdimy)
    propagate_transforms(x)
    parallelize_like(x, parallel_types={PT.BIDx, PT.TIDy, PT.TIDx})
    # The k side, from the values (the indices are their sibling: the same loops):
    # [M / By, By, K] -> [M / By, By, K / B, B]; k = 1 is a broadcast, every thread of the row
    # holds the one result.
    graph = IdGraph(fusion)
    k_id = _sides(op)[1]
    k_side = [tv for tv in fusion.tensors()
              if any(graph.mapped(j, k_id) for j in tv.domain.logical if not j.is_broadcast)]
    pos = len(values.domain.loop) - 1
    if not values.domain.loop[pos].is_broadcast:
        values.split(pos, p.k_threads)
        values.parallelize(pos + 1, PT.TIDx)
        propagate_transforms(values, k_side)
        parallelize_like(values, k_side, parallel_types={PT.BIDx, PT.TIDy, PT.TIDx})
    if p.vector > 1:
        pgraph = IdGraph(fusion, permissive=True)
        vec_axis = x.domain.loop[-1]
        for k in p.vector_inputs:
            vectorize_along(caches[k], vec_axis, pgraph, p.vector)
        for o in outputs:
            if o not in k_side:
                vectorize_along(o, vec_axis, pgraph, p.vector)
    # The top-k's results stop before their k loops (inlining.max_inline_position): the block
    # top-k fills them whole, then their consumers' loops read them (lower/topk.py).
    inline_most(fusion=fusion)
    launch = fusion.launch_hints
    launch["block_x"] = p.bdimx
    launch["max_threads"] = p.bdimx * p.bdimy



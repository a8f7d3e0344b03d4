"""Scatter scheduler: the atomic adds of a scatter_add or index_add into zeros, with the
element-wise ops that compute what is added and where (an embedding's backward: dweight[ids[i],
:] += dy[i, :], dy cast to float32 on the way).

One flat loop over the scatter's iteration (ir.exprs.ScatterOp: its output's root, the index's
shape, an index_add's source's), split as the pointwise scheduler splits an output, without
vectors (each element is one atomic add):

    for blockIdx.x: for u (unrolled): for threadIdx.x:        i = flat iteration index
      v = f(src[i]); k = g(index[i])                          element-wise ops, inlined
      if (0 <= k < R) pf::atomic_add(&out[k * out_s_dim + i's other dims * their strides], v)
      else pf::report_index_error(...)                        (runtime/index_check.py)

The output is zeroed by the executor before the launch (kir/launch.py `zeroed_outputs`); adds
to one element from several threads land in any order (float sums differ in their last bits
from run to run; integer sums are exact). A deterministic order would need the iteration sorted
by index first (a segmented sum): not built.

Taken: one ScatterOp that adds into zeros (frontend/indexing.scatter_add makes every
scatter_add and index_add so, 16-bit floats summed in float32), of float32, float64, int32 or
int64 (what red.global.add adds), with element-wise ops, fills, iotas, windows and gathers
over its iteration, its output read by nothing in the fusion: its sums are complete only when
the kernel ends, so the segmenter puts their readers (x + sums, the cast back to bf16) in
kernels of their own. Other outputs must iterate the scatter's dims (written once each in the
same loop). Refused, each with its reason, so that the op runs as torch's scatter (a library
segment, op_support.LIBRARY_FALLBACK_OPS): a scatter that stores (torch.scatter other than a
one-hot, which the frontend makes element-wise), one into a tensor other than zeros, bool sums.
"""
from __future__ import annotations

import dataclasses

from ...ir.dtype import DataType
from ...ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, GatherOp, IndexCheckOp, IotaOp,
                         LoadStoreOp, RandOp, ScatterOp, UnaryOp, WhereOp, WindowOp)
from ...ir.id_graph import IdGraph
from ...ir.scalar import ScalarOp
from ...ir.tensor import TensorView
from .. import cache_after, cache_before, inline_most
from ..cache import cached_uses
from .base import RuntimeInfo, ops_beside, split_flat_loop

NAME = "scatter"         # offered the fusions with a scatter alone (op_support.DEDICATED_OPS)

# Ops the scatter kernel computes beside its scatter, over the scatter's iteration.
_BESIDE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, FullOp, IotaOp,
           RandOp, WindowOp, GatherOp, IndexCheckOp, ScalarOp, ScatterOp)
# What pf::atomic_add adds (red.global.add.{f32,f64,s32,u64}).
ATOMIC_DTYPES = (DataType.Float, DataType.Double, DataType.Int32, DataType.Int)


@dataclasses.dataclass(frozen=True)
class ScatterParams:
    threads: int = 128           # threads per block (TIDx)
    unroll: int = 1              # iterations per thread, strided by threads

    def describe(self) -> str:
        return (f"scatter: {self.threads} threads, unroll {self.unroll}, one atomic add per "
                "element of the iteration")


def _scatters(fusion) -> list:
    return [e for e in fusion.exprs() if isinstance(e, ScatterOp)]


def can_schedule(fusion) -> tuple[bool, str]:
    ops = _scatters(fusion)
    if not ops:
        return False, "no scatter"
    if len(ops) > 1:
        return False, f"{len(ops)} scatters (the kernel computes one)"
    op = ops[0]
    out = op.outputs[0]
    if op.op != "add":
        return False, ("a scatter that stores (torch.scatter, not a one-hot): "
                       "torch.Tensor.scatter_ runs it")
    if op.x is not None:
        return False, ("a scatter into a tensor other than zeros (the kernel adds into zeros): "
                       "torch.Tensor.scatter_add_ runs it")
    if out.dtype not in ATOMIC_DTYPES:
        return False, (f"{out.dtype.short_name} sums (the kernel's atomic adds take float32, "
                       "float64, int32 and int64): torch.Tensor.scatter_add_ runs them")
    why = ops_beside(fusion, _BESIDE, "scatter")
    if why:
        return False, why
    if fusion.uses_of(out):
        return False, ("the fusion reads the scatter's result: its sums are complete only when "
                       "the kernel ends")
    if out not in fusion.outputs:
        return False, "the scatter's result is not an output of the fusion"
    graph = IdGraph(fusion)
    root = [i for i in out.domain.root if not i.is_broadcast]
    for k, o in enumerate(fusion.outputs):
        if o is out or not isinstance(o, TensorView):
            continue
        for d, i in enumerate(o.domain.logical_no_reductions):
            if not i.is_broadcast and not any(graph.mapped(i, r) for r in root):
                return False, (f"output {k}'s dim {d} is none of the scatter's iteration: the "
                               "kernel loops over the scatter's elements")
    return True, ("element-wise ops and a scatter that adds: one atomic add per element of "
                  "its iteration")


def compute_heuristics(fusion, info: RuntimeInfo) -> ScatterParams:
    out = _scatters(fusion)[0].outputs[0]
    numel = 1
    for i in out.domain.root:
        numel *= info.extent(i.maybe_expanded_extent)
    # As the pointwise scheduler's element-wise loops (bench/results/2026-11-22-h100-sweeps.md):
    # larger blocks while there are elements for 16 of them per SM, then up to 4 iterations
    # per thread (independent atomics in flight). Not measured for atomics: no device time.
    threads, unroll = 128, 1
    sms = info.device.sm_count
    while threads < 512 and numel >= threads * 2 * sms * 16:
        threads *= 2
    while unroll < 4 and numel >= threads * unroll * 2 * sms * 16:
        unroll *= 2
    return ScatterParams(threads=threads, unroll=unroll)


def schedule(fusion, params: ScatterParams) -> None:
    for v in fusion.inputs:
        if isinstance(v, TensorView) and cached_uses(v):
            cache_after(v)
    out = _scatters(fusion)[0].outputs[0]
    # Other outputs get a register cache; the scatter's output is written by its atomic adds
    # alone, in global memory.
    for o in fusion.outputs:
        if isinstance(o, TensorView) and o is not out and o.definition is not None:
            cache_before(o)
    # The iteration flattened in its own order (the index's dims: an index_add's source's
    # rows, then their elements).
    while len(out.domain.loop) > 1:
        out.merge(0, 1)
    split_flat_loop(out, params.threads, params.unroll)
    inline_most(fusion=fusion)

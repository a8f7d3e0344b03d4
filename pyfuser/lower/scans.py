"""Pass `lower_scans`: a scan's running value, its block scan and the prefix fixup.

Before: a scan is a TensorOp `T3 = scan(T2)` inside T3's own loops, the first bound to
threadIdx.x (schedulers/scan.py: each thread owns a contiguous chunk of the row, its loops
p, v iterate it in row order):

    alloc local float T3[16]
    for threadIdx.x: for p: for v:
      T3[p, v] = sum_scan(T2[p, v])

After:

    alloc local float pf_scan0[1]
    pf_scan0[*] = 0                              <- InitValue: the identity (1 for a product)
    alloc local float T3[16]
    for threadIdx.x: for p: for v:
      T3[p, v] = sum_scan(T2[p, v]) (carry pf_scan0)   <- carry += T2[p, v]; T3[p, v] = carry
    block_scan<x>(sum, pf_scan0[0])              <- BlockScan: carry becomes the exclusive prefix
                                                    of the thread's chunk in its row (and, with
                                                    the row split along blockIdx.y, of its
                                                    block: through a cluster's distributed
                                                    shared memory, or else chained through two
                                                    global workspaces, pf_scan_chain0 (each
                                                    block's total and inclusive prefix) and
                                                    pf_scan_flag0 (their flags, tagged with
                                                    the launch's generation): scan.cuh's
                                                    decoupled look-back)
    for threadIdx.x: for p: for v:               <- the same loops again (label SCAN_FIXUP)
      T3[p, v] = sum_scan_fixup(T3[p, v]) (carry pf_scan0)   <- T3 = carry + T3

The scan step is guarded like an accumulation (index_and_predicate: elements past the row do
not reach the carry); the fixup is register math, unguarded.

Limits (a LoweringError, so the fusion falls back, never a wrong kernel): the scan's output is
a register tensor whose own loops all iterate the scanned dim, the first bound to threadIdx.x
and the rest serial (the scan scheduler's shape); a scanned dim bound to a block dim is spanned
by the launch's cluster, or else is blockIdx.y. A chained block waits on the blocks before it
along y, whose linear block indices are lower: the GPU dispatches blocks in linear order, so
they have started and publish their totals (CUB's single-pass scan relies on the same order).
"""
from __future__ import annotations

import dataclasses

from ..ir import scalar as S
from ..ir.dtype import DataType
from ..ir.exprs import ScanOp
from ..ir.iter_domain import ParallelType
from ..ir.tensor import MemoryType
from ..kir import nodes as K
from ..kir.verifier import establishes
from .context import LoweringError
from .reductions import _block_extent


@establishes()
def lower_scans(kernel: K.Kernel) -> K.Kernel:
    for n, (op, parents) in enumerate(K.ops_in_loops(kernel.body, ScanOp)):
        _lower_scan(kernel, op, parents, n)
    return kernel


def _lower_scan(kernel, op: K.TensorOp, parents: list, n: int) -> None:
    ctx = kernel.ctx
    tv = op.out
    expr: ScanOp = op.expr
    if tv.memory_type != MemoryType.Local:
        raise LoweringError(f"T{tv.name}: a scan's result is computed in registers (the scan "
                            "scheduler caches an output scan's result)")
    scanned = set(expr.scanned_ids())
    own = [ctx.loop_of[(tv, j)] for j in range(tv.compute_at_pos, len(tv.domain.loop))]
    if not own or own[0].parallel != ParallelType.TIDx:
        raise LoweringError(f"T{tv.name}: a scan's own loops start with its threadIdx.x loop "
                            f"(got {[lp.parallel.name for lp in own]})")
    for j, lp in zip(range(tv.compute_at_pos, len(tv.domain.loop)), own):
        if tv.domain.loop[j] not in scanned:
            raise LoweringError(f"T{tv.name}: its own loop {j} does not iterate the scanned dim")
        if j > tv.compute_at_pos and lp.parallel.is_thread_or_block:
            raise LoweringError(f"T{tv.name}: its chunk loop {j} is bound to "
                                f"{lp.parallel.name}; a thread's chunk is serial")
    idx = next((k for k, f in enumerate(parents) if f.loop is own[0]), None)
    if idx is None:
        raise LoweringError(f"T{tv.name}: its threadIdx.x loop is not around its scan")
    thread_loop = parents[idx]
    scope = parents[idx - 1].body if idx > 0 else kernel.body
    cluster, chain = _across_blocks(kernel, tv, parents[:idx], scanned, n)
    carry_buf = K.Buffer(f"pf_scan{n}", tv.dtype, "local", K.Const(1), None)
    carry = K.TensorIndex(carry_buf, K.Const(0))
    op.carry = carry
    # The fixup: the loops from threadIdx.x down to the scan, holding only the fixup op.
    fixup = dataclasses.replace(op, ins=[tv], scan_fixup=True)
    for f in reversed(parents[idx:]):
        fixup = dataclasses.replace(f, body=[fixup])
    fixup.label = K.SCAN_FIXUP
    pos = scope.index(thread_loop)
    scope[pos:pos + 1] = [
        K.Allocate(carry_buf),
        K.InitValue(carry_buf, S.as_scalar(float(expr.identity) if tv.dtype.is_floating
                                           else expr.identity, tv.dtype), tv),
        thread_loop,
        K.BlockScan(carry, expr.op, tv.dtype, cluster, chain),
        fixup,
    ]


def _across_blocks(kernel, tv, outer: list, scanned: set, n: int):
    """How the scan crosses blocks when its scanned dim is bound to a block dim: (the cluster's
    (block dim, CTAs), None) when the launch's clusters span the dim, else (None, the chain's
    (values, flags) workspaces: each block's prefix from the blocks before it along
    blockIdx.y through global memory, scan.cuh's decoupled look-back). (None, None) when the scan stays in its block."""
    ctx = kernel.ctx
    dims = [f for f in outer if f.loop is not None and f.loop.parallel.is_block_dim
            and any(ctx.exact.mapped(f.loop.id, i) for i in scanned)]
    if not dims:
        return None, None
    if len(dims) > 1:
        raise LoweringError(f"T{tv.name}: its scan spans several block dims")
    dim = dims[0].loop.parallel.name[-1].lower()
    hint = kernel.fusion.launch_hints.get("cluster")
    size = hint["xyz".index(dim)] if hint else 1
    if size > 1:
        if size != _block_extent(kernel, dim):
            raise LoweringError(f"T{tv.name}: its scan over blockIdx.{dim} needs a cluster "
                                f"spanning the whole dim (cluster {hint})")
        return (dim, size), None
    if dim != "y":
        # The device library's chain indexes its slots along blockIdx.y (the scheduler's
        # layout: rows along blockIdx.x).
        raise LoweringError(f"T{tv.name}: a scan chained across blocks runs along blockIdx.y, "
                            f"not blockIdx.{dim}")
    values = K.Buffer(f"pf_scan_chain{n}", tv.dtype, "global")
    flags = K.Buffer(f"pf_scan_flag{n}", DataType.Int64, "global")
    for b, kind in ((values, "scan_chain"), (flags, "scan_flag")):
        kernel.params.append(K.Param(b.name, "ptr", ("workspace", b.name), b))
        kernel.workspaces.append((b, kind))
    return None, (values, flags)

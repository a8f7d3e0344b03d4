"""Pass `allocate`: buffers for intermediate tensors.

Before: loops and TensorOps; only global tensors have buffers.
After:  an Allocate for every register and shared-memory tensor, at the top of the loop it is
        inlined in (registers) or of the kernel (shared memory):

    for i0:                          for i0:
      for i1 in 0..4:                  float T2[4];
        T2 = ...                       for i1 in 0..4: T2[i1] = ...

A buffer holds the tensor's allocation domain (its loop IDs right of the compute-at position)
minus reduction IDs, minus thread and block IDs for registers (each thread owns its registers)
and block IDs for shared memory. Each allocated ID takes the extent of the loop it runs in (its
promoted extent), so a broadcast materialized across a loop gets the loop's size.
Limitations: register buffers need a constant size; global intermediates are not supported
(segment the fusion instead).
"""
from __future__ import annotations

from ..ir.iter_domain import ParallelType
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K
from .context import LoweringError
from .indexing import scalar_to_kexpr


def allocation_ids(ctx, tv: TensorView) -> list:
    """(IterDomain, extent KExpr, Loop or None) for each allocated ID of tv, outer to inner."""
    out = []
    for i in tv.allocation_domain:
        if i.is_reduction:
            continue
        pt = i.parallel_type
        if tv.memory_type == MemoryType.Local and pt.is_thread_or_block:
            continue
        if tv.memory_type == MemoryType.Shared and pt.is_block_dim:
            continue
        if pt == ParallelType.GridStride:
            continue
        lp = None
        if i in tv.domain.loop:
            lp = ctx.loop_of.get((tv, tv.domain.loop.index(i)))
        extent = lp.extent if lp is not None else i.extent
        if i.is_broadcast and lp is None:
            extent = 1
        out.append((i, scalar_to_kexpr(extent, ctx.names), lp))
    return out


def allocate(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    ctx.alloc_ids = {}
    scopes = {id(s.loop): s for s in K.walk(kernel.body) if isinstance(s, K.ForLoop)}
    fusion = kernel.fusion
    for tv in ctx.tensors:
        if tv in ctx.buffers:
            continue
        if tv.memory_type == MemoryType.Global:
            raise LoweringError(f"T{tv.name} is a global intermediate; pyfuser does not allocate "
                                "global workspaces for tensors yet (segment the fusion)")
        if tv not in ctx.nests:
            continue
        ids = allocation_ids(ctx, tv)
        size = K.Const(1)
        for _, ext, _ in ids:
            size = K.mul(size, ext)
        memory = "local" if tv.memory_type == MemoryType.Local else "shared"
        if memory == "local" and not isinstance(size, K.Const):
            raise LoweringError(
                f"T{tv.name} needs a register buffer of runtime size {size!r}: split the axes right "
                f"of its compute-at position ({tv.compute_at_pos}) by constant factors, or put it "
                "in shared memory")
        buf = K.Buffer(f"T{tv.name}", tv.dtype, memory, size, tv=tv)
        ctx.buffers[tv] = buf
        ctx.alloc_ids[tv] = ids
        if memory == "shared":
            kernel.body.insert(0, K.Allocate(buf))
            continue
        nest = ctx.nest(tv)
        depth = len(nest) - (len(tv.domain.loop) - tv.compute_at_pos)
        body = kernel.body if depth == 0 else scopes[id(nest[depth - 1])].body
        body.insert(0, K.Allocate(buf))
    del fusion
    return kernel

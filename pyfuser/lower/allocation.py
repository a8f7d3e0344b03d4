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
A rank-0 register computed inside loops that run once and read after them (context.hoisted) is
allocated at the top of the kernel.
Global intermediates (tensors a schedule places in global memory between loop nests) become
dense workspaces the executor allocates, passed as parameters.
A shared buffer's rows may be followed by spare elements (schedule.pad_shared_rows, for
bank-conflict-free column reads): its size counts them, and ctx.row_pad tells index.py's
buffer_offset where a row starts.
Limitation: register buffers need a constant size.
"""
from __future__ import annotations

from ..ir.iter_domain import ParallelType
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K
from ..kir.verifier import Rule, establishes
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


def _global_intermediate(kernel: K.Kernel, tv: TensorView) -> None:
    """A tensor placed in global memory between loop nests (e.g. column partials of a norm
    backward, written by every block and read after a grid sync): a dense workspace the
    executor allocates, indexed like a fusion output."""
    ctx = kernel.ctx
    buf = K.Buffer(f"T{tv.name}", tv.dtype, "global", tv=tv)
    ctx.buffers[tv] = buf
    kernel.params.append(K.Param(buf.name, "ptr", ("workspace", buf.name), buf))
    kernel.workspaces.append((buf, "intermediate"))
    logical = tv.domain.logical_no_reductions
    strides = []
    acc = K.Const(1)
    for i in reversed(logical):
        if i.is_broadcast:
            strides.append(K.Const(0))
            continue
        strides.append(acc)
        acc = K.mul(acc, scalar_to_kexpr(i.extent, ctx.names))
    ctx.strides[tv] = list(reversed(strides))
    buf.size = acc


def _operand_buffers(v, s, scope) -> None:
    """Each fusion tensor a TensorOp reads or writes has a buffer: a kernel parameter for a
    global tensor, allocated in an enclosing scope otherwise."""
    if not isinstance(s, K.TensorOp):
        return
    for what, x in [("the output", s.out)] + [(f"input {k}", i) for k, i in enumerate(s.ins)]:
        if not isinstance(x, TensorView):
            continue
        buf = v.k.ctx.buffers.get(x)
        if buf is None:
            v.fail(f"{what} T{x.name} has no buffer", s)
        if x.memory_type == MemoryType.Global:
            if id(buf) not in v.param_buffers:
                v.fail(f"{what} T{x.name} is global but not a kernel parameter", s)
        else:
            v.check_buffer(buf, scope, s, f"{what} T{x.name}")


# Fusion operands have their buffers in scope (until index_and_predicate indexes them).
BUFFERS_ALLOCATED = Rule("buffers allocated", stmt=_operand_buffers)


@establishes(BUFFERS_ALLOCATED)
def allocate(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    ctx.alloc_ids = {}
    ctx.row_pad = {}
    scopes = {id(s.loop): s for s in K.walk(kernel.body) if isinstance(s, K.ForLoop)}
    fusion = kernel.fusion
    for tv in ctx.tensors:
        if tv in ctx.buffers:
            continue
        if tv.memory_type == MemoryType.Global:
            _global_intermediate(kernel, tv)
            continue
        if tv not in ctx.nests:
            continue
        ids = allocation_ids(ctx, tv)
        size = K.Const(1)
        for _, ext, _ in ids:
            size = K.mul(size, ext)
        if tv.memory_type == MemoryType.Shared and tv.row_padding is not None:
            row_id, pad = tv.row_padding
            at = next((k for k, (i, _, _) in enumerate(ids) if i is row_id), None)
            if at is None:
                raise LoweringError(f"T{tv.name}'s padded row starts at an ID its shared buffer "
                                    "is not allocated over")
            ctx.row_pad[tv] = (at, pad)
            outer, row = K.Const(1), K.Const(1)
            for k, (_, ext, _) in enumerate(ids):
                if k < at:
                    outer = K.mul(outer, ext)
                else:
                    row = K.mul(row, ext)
            size = K.mul(outer, K.add(row, K.Const(pad)))
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
        if tv in ctx.hoisted:
            depth = 0
        body = kernel.body if depth == 0 else scopes[id(nest[depth - 1])].body
        body.insert(0, K.Allocate(buf))
    del fusion
    return kernel

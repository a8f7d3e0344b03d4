"""Pass `insert_syncs`: block barriers between shared-memory writes and reads.

Before: T5_s[threadIdx.x] = ...;  ... = T5_s[31 - threadIdx.x];
After:  T5_s[threadIdx.x] = ...;  __syncthreads();  ... = T5_s[31 - threadIdx.x];

Within one scope, a statement that reads a shared buffer written earlier in the scope (and not
yet synchronized) gets a barrier before it; a loop whose body writes a shared buffer that an
earlier statement of the body reads gets a barrier at the end of the body (the next iteration
would overwrite data another thread may still read). Block reductions synchronize internally.
TMA copies are not accesses here: they complete on mbarriers, which the circular-buffer passes
(pipelined before this pass, warp-specialized after it) wait on before any read. Nor are cp.async
copies (CpAsyncCopy, not TensorOps): `cp_async_buffer_loops`, before this pass, orders them with
wait_group and adds the block barriers they need (none when each thread reads only what it
copied); a barrier here could not help, since a copy lands at its wait, not where it is issued.
"""
from __future__ import annotations

from ..kir import nodes as K
from .circular_buffer import is_tma_load


def _accesses(s) -> tuple[set, set]:
    reads, writes = set(), set()
    for x in K.walk([s]):
        if isinstance(x, K.TensorOp):
            if is_tma_load(x):
                continue        # completes on an mbarrier: the circular-buffer passes order it
            if isinstance(x.out, K.TensorIndex) and x.out.buffer.memory == "shared":
                writes.add(x.out.buffer)
            for i in x.ins:
                if isinstance(i, K.TensorIndex) and i.buffer.memory == "shared":
                    reads.add(i.buffer)
    return reads, writes


def insert_syncs(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _scope(kernel.body)
    _grid_syncs(kernel)
    return kernel


def _global_accesses(s) -> tuple[set, set]:
    reads, writes = set(), set()
    for x in K.walk([s]):
        if isinstance(x, K.TensorOp):
            if isinstance(x.out, K.TensorIndex) and _is_workspace(x.out.buffer):
                writes.add(x.out.buffer)
            for i in x.ins:
                if isinstance(i, K.TensorIndex) and _is_workspace(i.buffer):
                    reads.add(i.buffer)
    return reads, writes


def _is_workspace(buf) -> bool:
    return buf.memory == "global" and buf.tv is not None and not (
        buf.tv.is_input() or buf.tv.is_output())


def _grid_syncs(kernel: K.Kernel) -> None:
    """A global intermediate written by one top-level loop nest and read by a later one is
    exchanged between blocks: a grid-wide barrier goes in between, and the kernel must run as
    a cooperative launch (all blocks resident)."""
    dirty: set = set()
    out = []
    for s in kernel.body:
        reads, writes = _global_accesses(s)
        if reads & dirty:
            if kernel.grid_sync_buffer is None:
                from ..ir.dtype import DataType
                buf = K.Buffer("pf_grid_sync", DataType.Int32, "global")
                kernel.params.append(K.Param(buf.name, "ptr", ("workspace", buf.name), buf))
                kernel.workspaces.append((buf, "semaphore"))
                kernel.grid_sync_buffer = buf
            out.append(K.GridSync(kernel.grid_sync_buffer))
            kernel.needs_cooperative = True
            dirty.clear()
        out.append(s)
        dirty |= writes
    kernel.body = out


def _scope(body: list) -> list:
    out: list = []
    dirty: set = set()
    for s in body:
        if isinstance(s, K.ForLoop):
            s.body = _scope(s.body)
            reads, writes = _accesses(s)
            if reads & writes and s.parallel in ("Serial", "GridStride", "Unroll"):
                s.body.append(K.BlockSync())
        elif isinstance(s, K.IfThenElse):
            s.then_body = _scope(s.then_body)
            s.else_body = _scope(s.else_body)
        reads, writes = _accesses(s)
        if reads & dirty:
            out.append(K.BlockSync())
            dirty.clear()
        if isinstance(s, (K.BlockSync, K.BlockReduce, K.GridReduce, K.ClusterReduce, K.GridSync)):
            dirty.clear()
        out.append(s)
        dirty |= writes
    return out

"""Pass `insert_syncs`: block barriers between shared-memory writes and reads.

Before: T5_s[threadIdx.x] = ...;  ... = T5_s[31 - threadIdx.x];
After:  T5_s[threadIdx.x] = ...;  __syncthreads();  ... = T5_s[31 - threadIdx.x];

Within one scope, a statement that reads a shared buffer written earlier in the scope (and not
yet synchronized) gets a barrier before it; a loop whose body writes a shared buffer that an
earlier statement of the body reads gets a barrier at the end of the body (the next iteration
would overwrite data another thread may still read). Block reductions synchronize internally.
Asynchronous copies (TMA, cp.async: kir.nodes.ASYNC_COPIES) are not accesses here: they land on
an mbarrier or at a wait_group, which `pipeline_loads`, before this pass, orders them with (a
barrier here could not help, since a copy lands at its wait, not where it is issued). Inside a
warp role (RoleBody) a barrier is the role's named barrier among its own threads: the other
roles never reach it.

Grid barriers: a global intermediate written by one top-level nest and read by a later one gets
a grid sync in between. Nests that write an intermediate move first ahead of earlier
independent nests that read one, so one barrier serves all of them:
    [rows, write W1, sum W1, write W2, sum W2]  ->  [rows, write W1, write W2, sync, sum W1, sum W2]
In a warp-specialized kernel the nests are the compute role's, and so is the grid barrier (the
block's part done by the role's threads on its named barrier).
"""
from __future__ import annotations

from ..kir import nodes as K
from ..kir.rewrite import accesses, stmt_roles
from ..kir.verifier import establishes
from .context import LoweringError
from .pipeline import is_tma_load


def _accesses(s, memory_of=lambda b: b.memory == "shared") -> tuple[set, set]:
    """(buffers read, buffers written) among those `memory_of` picks, by `s` and every
    statement nested in it, through their field roles (kir/rewrite.py `accesses`)."""
    reads, writes = set(), set()
    for x in K.walk([s]):
        if isinstance(x, K.ASYNC_COPIES) or is_tma_load(x):
            continue        # completes on an mbarrier or a cp.async wait: its pass orders it
        r, w = accesses(x)
        reads |= {a.buffer for a in r if memory_of(a.buffer)}
        writes |= {a.buffer for a in w if memory_of(a.buffer)}
    return reads, writes


@establishes()
def insert_syncs(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _scope(kernel.body, None)
    kernel.body = _grid_syncs(kernel, kernel.body, None)
    for split in (s for s in kernel.body if isinstance(s, K.RoleSplit)):
        for rb in split.roles:
            rb.body = _grid_syncs(kernel, rb.body, rb.role)
    return kernel


def _block_sync(role) -> K.BlockSync:
    """A barrier among the threads of the scope: the block, or a warp role's own."""
    if role is None:
        return K.BlockSync()
    if role.barrier is None:
        raise LoweringError(f"the {role.name} role of a warp-specialized kernel needs a block "
                            "barrier, but has no named barrier of its own")
    return K.BlockSync(role.barrier[0], K.Const(role.barrier[1]))


def _global_accesses(s) -> tuple[set, set]:
    return _accesses(s, _is_workspace)


def _is_workspace(buf) -> bool:
    return buf.memory == "global" and buf.tv is not None and not (
        buf.tv.is_input() or buf.tv.is_output())


def _buffers(s) -> tuple[set, set]:
    """(buffers read, buffers written) by the TensorOps, initializations and block
    reductions of a statement, any memory."""
    reads, writes = set(), set()
    for x in K.walk([s]):
        if isinstance(x, K.TensorOp):
            writes.add(id(x.out.buffer)) if isinstance(x.out, K.TensorIndex) else None
            reads |= {id(i.buffer) for i in x.ins if isinstance(i, K.TensorIndex)}
        elif isinstance(x, K.InitValue):
            writes.add(id(x.out.buffer if isinstance(x.out, K.TensorIndex) else x.out))
        elif isinstance(x, K.Allocate):
            writes.add(id(x.buffer))
        elif isinstance(x, K.BlockReduce):
            # Its values (registers of the nest) and the block's shared reduction workspace.
            vals = {id(v.buffer) for v in x.values if isinstance(v, K.TensorIndex)}
            reads |= vals | {"block_reduce_workspace"}
            writes |= vals | {"block_reduce_workspace"}
        elif not isinstance(x, (K.ForLoop, K.IfThenElse, K.Comment)):
            return None, None       # anything else (barriers, scalars): not moved
    return reads, writes


def _workspace_writes_first(body: list) -> list:
    """Top-level nests that write a global intermediate move ahead of earlier nests that read
    one, when neither touches what the other writes: then one grid barrier serves every
    intermediate. (LayerNorm backward: [rows, write W_dw, sum W_dw, write W_db, sum W_db] needed
    two barriers; [rows, write W_dw, write W_db, sum W_dw, sum W_db] needs one.)"""
    out: list = []
    for s in body:
        _, writes = _global_accesses(s)
        k = len(out)
        if writes and isinstance(s, K.ForLoop):
            r_s, w_s = _buffers(s)
            while k > 0 and r_s is not None and isinstance(out[k - 1], K.ForLoop):
                prev = out[k - 1]
                prev_reads, _ = _global_accesses(prev)
                r_p, w_p = _buffers(prev)
                if not prev_reads or r_p is None or (r_s & w_p) or (w_s & (r_p | w_p)):
                    break
                k -= 1
        out.insert(k, s)
    return out


def _grid_syncs(kernel: K.Kernel, body: list, role) -> list:
    """A global intermediate written by one top-level loop nest of `body` and read by a later
    one is exchanged between blocks: a grid-wide barrier goes in between, and the kernel must
    run as a cooperative launch (all blocks resident)."""
    dirty: set = set()
    out = []
    for s in _workspace_writes_first(body):
        reads, writes = _global_accesses(s)
        if reads & dirty:
            if kernel.warp_roles is not None and kernel.warp_roles.compute_roles > 1:
                raise LoweringError("ping-pong compute roles: a grid barrier between the roles' "
                                    "nests is not supported")
            if kernel.grid_sync_buffer is None:
                from ..ir.dtype import DataType
                buf = K.Buffer("pf_grid_sync", DataType.Int32, "global")
                kernel.params.append(K.Param(buf.name, "ptr", ("workspace", buf.name), buf))
                kernel.workspaces.append((buf, "semaphore"))
                kernel.grid_sync_buffer = buf
            # Only a role's threads exchange data through global memory (a producer writes
            # shared memory only): the block's part of the grid barrier is theirs.
            out.append(K.GridSync(kernel.grid_sync_buffer,
                                  None if role is None else role.barrier))
            kernel.needs_cooperative = True
            dirty.clear()
        out.append(s)
        dirty |= writes
    return out


def _scope(body: list, role) -> list:
    out: list = []
    dirty: set = set()
    for s in body:
        for f, r in stmt_roles(s).items():
            if r == K.BODY:
                setattr(s, f, _scope(getattr(s, f), s.role if isinstance(s, K.RoleBody) else role))
        if isinstance(s, K.ForLoop):
            reads, writes = _accesses(s)
            if reads & writes and s.parallel in ("Serial", "GridStride", "Unroll"):
                s.body.append(_block_sync(role))
        reads, writes = _accesses(s)
        if reads & dirty:
            out.append(_block_sync(role))
            dirty.clear()
        if isinstance(s, (K.BlockSync, K.BlockReduce, K.BlockScan, K.BlockTopK, K.GridReduce,
                          K.ClusterReduce, K.GridSync, K.ClusterSync)):
            dirty.clear()
        out.append(s)
        dirty |= writes
    return out

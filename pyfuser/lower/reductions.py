"""Pass `lower_reductions`: accumulators, their initial values and cross-thread reductions.

Before: a reduction is a TensorOp `T3 += T2` inside T3's loops.
After:
    float T3[1];
    T3[0] = 0;                                   <- InitValue, where T3 is allocated
    for i1 in 0..4: for threadIdx.x: T3[0] += T2[...]
    blockReduce<x>(T3[0 .. group))               <- after the outermost reduction loop, when a
                                                    reduction axis is bound to threads
Every thread holds the result afterwards (an all-reduce), so consumers read T3 in any thread.
Reduction axes bound to blocks need a grid reduction: each block writes its partials to a global
workspace, the last block to arrive (an atomic counter per tile) combines them with all its
threads (each thread a fixed strided share in block order, then a block all-reduce in its fixed
tree order: codegen/cuda.py), so the result is deterministic, and every thread of that block
holds it; only that block writes the outputs computed from it (several grid reductions over
the same dims have their results in the first one's last block: `_follow_the_first_last_block`;
an output beside it, such as the column the rows are scaled by, is written by block 0:
lower/index.py).
Values of iteration axes inside the reduction loops are reduced together (grouped). The loops a
reduction reduces are those of its own reduction axes (a loop merged with a sibling tensor's,
where that tensor iterates, still carries the reduction).
Limitation: a reduction's output must be a register tensor (schedulers cache_before outputs).
"""
from __future__ import annotations

from ..ir.exprs import ReductionOp
from ..ir.iter_domain import ParallelType
from ..ir.tensor import MemoryType
from ..kir import nodes as K
from ..kir.verifier import establishes
from .context import LoweringError
from .indexing import bound_extents

_DIM = {"TIDx": "x", "TIDy": "y", "TIDz": "z", "BIDx": "x", "BIDy": "y", "BIDz": "z"}


@establishes()
def lower_reductions(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    ctx.reduction_sites = []
    _visit(kernel.body, [], kernel)
    _follow_the_first_last_block(kernel)
    return kernel


def _follow_the_first_last_block(kernel) -> None:
    """Grid reductions after the first over the same block dims follow its last block.

    Before: grid_reduce(T4) ... grid_reduce(T5)     each block is last for one of them:
                                                    T4 in one block, T5 in another, and an
                                                    output of both (or both outputs, guarded
                                                    by one pf_grid_last) wrong
    After:  grid_reduce(T4) ... grid_reduce(T5, follows_last_block)

    The block that was last for T4 waits until every block has written its T5 partials, then
    combines them (codegen/cuda.py): no deadlock, since every block of its kept coordinate
    had reached T4's reduction, so all are running or done, and none of them waits. Sums of
    several reductions in one kernel (sum(dy) and sum(dy * x_hat) of BatchNorm backward, split
    over blockIdx.y)."""
    first = {}
    for body in K.bodies(kernel.body):
        for s in body:
            if not isinstance(s, K.GridReduce):
                continue
            key = tuple(sorted(s.dims))
            if key not in first:
                first[key] = (s, body)
                continue
            if first[key][1] is not body:
                # Under another loop or branch, the first one's last block may not reach it
                # (or reach it more often): no block would hold both results.
                raise LoweringError(f"T{first[key][0].tv.name} and T{s.tv.name} are reduced over "
                                    f"blockIdx.{','.join(key)} in different scopes; one last "
                                    "block cannot combine both")
            s.follows_last_block = True


def _visit(body: list, parents: list, kernel) -> None:
    k = 0
    while k < len(body):
        s = body[k]
        if isinstance(s, K.ForLoop):
            _visit(s.body, parents + [s], kernel)
        elif isinstance(s, K.Allocate) and s.buffer.tv is not None:
            d = s.buffer.tv.definition
            if isinstance(d, ReductionOp):
                body.insert(k + 1, K.InitValue(s.buffer, d.init, s.buffer.tv))
                k += 1
        elif isinstance(s, K.TensorOp) and isinstance(s.expr, ReductionOp):
            _place_cross_thread(s, parents, kernel)
        k += 1


def _grid_reduce(kernel, op, tv, dims, thread_dims) -> K.GridReduce:
    """A grid reduction with its global workspace (one slot per thread and value of each block)
    and its semaphores (one counter per block of the kept block dims, zeroed once by the
    executor and reset by the last block of each launch)."""
    from ..ir.dtype import DataType
    n = len(kernel.workspaces)
    ws = K.Buffer(f"pf_gws{n}", tv.dtype, "global")
    sem = K.Buffer(f"pf_gsem{n}", DataType.Int32, "global")
    for b, kind in ((ws, "grid_reduce_data"), (sem, "semaphore")):
        kernel.params.append(K.Param(b.name, "ptr", ("workspace", b.name), b))
        kernel.workspaces.append((b, kind))
    node = K.GridReduce([], op.expr.op.value, tv.dtype, dims, ws, sem, None, thread_dims)
    kernel.ctx.grid_reduced.setdefault(tv, set()).update(dims)
    return node


def _block_extent(kernel, dim: str):
    """The constant extent of the loops bound to blockIdx.<dim>, or None. Loops of one
    iteration do not size the dim: a per-row value of a row split over a cluster (the mean
    of a layernorm) runs in a broadcast loop along blockIdx.y, in every block of it."""
    exts = bound_extents(kernel.ctx, {pt for pt in ParallelType
                                      if pt.is_block_dim and _DIM[pt.name] == dim})
    if len(exts) > 1:
        exts.discard(1)
    return exts.pop() if len(exts) == 1 else None


def _place_cross_thread(op: K.TensorOp, parents: list, kernel) -> None:
    ctx = kernel.ctx
    tv = op.out
    if tv.memory_type == MemoryType.Global:
        raise LoweringError(f"T{tv.name} is the output of a reduction in global memory; reduce "
                            "into registers or shared memory (cache_before the output)")
    # tv's own axes say which loops it reduces: a loop it shares with a sibling (merged into an
    # [M, 1] output's loops over the same rows, an iteration there) keeps that owner's ID.
    positions = range(tv.compute_at_pos, len(tv.domain.loop))
    own = [ctx.loop_of[(tv, j)] for j in positions]
    reduced = {id(ctx.loop_of[(tv, j)]) for j in positions if tv.domain.loop[j].is_reduction}
    red_loops = [lp for lp in own if id(lp) in reduced]
    thread_dims = tuple(sorted({_DIM[lp.parallel.name] for lp in red_loops
                                if lp.parallel.is_thread_dim}))
    block_dims = tuple(sorted({_DIM[lp.parallel.name] for lp in red_loops
                               if lp.parallel.is_block_dim}))
    if not thread_dims and not block_dims:
        return
    if tv.memory_type != MemoryType.Local:
        raise LoweringError(f"T{tv.name}: a block or grid reduction reduces registers; T{tv.name} "
                            "is in shared memory")
    if ctx.reduction_sites and any(s[0] is tv for s in ctx.reduction_sites):
        return
    first = red_loops[0]
    # Find the ForLoop of the outermost reduction loop; the block reduction follows it.
    idx = next((n for n, f in enumerate(parents) if f.loop is first), None)
    if idx is None:
        raise LoweringError(f"T{tv.name}: its reduction loop is not around its reduction")
    loop_stmt = parents[idx]
    for r in K.walk(loop_stmt.body):
        if isinstance(r, K.TensorOp) and r.out is not tv and any(v is tv for v in r.ins):
            # The schedule put a reader of the result inside the loop it is reduced over:
            # the block or grid step after the loop would complete it too late.
            raise LoweringError(f"T{r.out.name} reads T{tv.name} inside T{tv.name}'s reduction "
                                "loop, before its cross-thread reduction completes it")
    scope = parents[idx - 1].body if idx > 0 else kernel.body
    pos = scope.index(loop_stmt)
    inner_iter = [lp for lp in own[own.index(first):] if id(lp) not in reduced]
    stmts = []
    if thread_dims:
        stmts.append(("block", thread_dims))
    if block_dims:
        stmts.append(("grid", block_dims))
    cluster = kernel.fusion.launch_hints.get("cluster")
    new = []
    for kind, dims in stmts:
        if kind == "block":
            node = K.BlockReduce([], op.expr.op.value, tv.dtype, dims, None)
        elif cluster and len(dims) == 1 and cluster["xyz".index(dims[0])] > 1:
            # The reduced block dim is spanned by the launch's clusters: reduce through
            # distributed shared memory, no workspace, every CTA gets the result.
            if cluster["xyz".index(dims[0])] != _block_extent(kernel, dims[0]):
                raise LoweringError(f"T{tv.name}: its reduction over blockIdx.{dims[0]} needs the "
                                    f"cluster {cluster} to span the whole dim")
            node = K.ClusterReduce([], op.expr.op.value, tv.dtype, dims[0],
                                   cluster["xyz".index(dims[0])])
        else:
            node = _grid_reduce(kernel, op, tv, dims, thread_dims)
        node.tv = tv
        node.inner_loops = inner_iter
        new.append(node)
    scope[pos + 1:pos + 1] = new
    ctx.reduction_sites.append((tv, new))

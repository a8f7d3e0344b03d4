"""Pass `lower_topk`: a top-k becomes one block top-k of the row its threads hold.

Before: a top-k is a TensorOp `T3 = topk(T2)` (T4, its indices, the op's second output) inside
T3's own loops over the k selected elements, after T2's loops over the row (schedulers/topk.py:
each thread holds a contiguous chunk of T2's row; T3 and T4 hold result j in register
j / B of thread j % B):

    alloc local bf16 T2[8]
    for threadIdx.x: for p: for v:
      T2[p, v] = ...
    alloc local bf16 T3[1]
    alloc local int64 T4[1]
    for j_out in 0..1: for threadIdx.x in 0..8:
      T3[j_out] = topk(T2)

After:

    alloc shared int64 pf_topk_ws0[rows x (2 x warps + k)]       <- at the top of the kernel
    ...
    alloc local bf16 T2[8]
    for threadIdx.x: for p: for v:
      T2[p, v] = ...
    alloc local bf16 T3[1]
    alloc local int64 T4[1]
    block_topk(T2 -> T3, T4)       <- pf::block_topk_x: k rounds of a row-wide max of keys

Limits (a LoweringError, so the fusion falls back, never a wrong kernel): T2, T3 and T4 are
register tensors; T2's own loops are its threadIdx.x loop then serial loops that split its row
dim in order (element n of the row is T2[n - threadIdx.x * chunk]); T3's own loops iterate the
selected dim, a serial loop then a threadIdx.x loop or the threadIdx.x loop alone, and hold
only the top-k; the block top-k is reached by every thread (no predicate around it).
"""
from __future__ import annotations

from ..ir.exprs import TopKOp
from ..ir.dtype import DataType
from ..ir.iter_domain import ParallelType, Split
from ..ir.tensor import MemoryType
from ..kir import nodes as K
from ..kir.verifier import establishes
from .context import LoweringError
from .indexing import scalar_to_kexpr


@establishes()
def lower_topk(kernel: K.Kernel) -> K.Kernel:
    for n, (op, parents) in enumerate(K.ops_in_loops(kernel.body, TopKOp)):
        _lower_topk(kernel, op, parents, n)
    return kernel


def _lower_topk(kernel, op: K.TensorOp, parents: list, n: int) -> None:
    ctx = kernel.ctx
    expr: TopKOp = op.expr
    values, indices = expr.outputs
    chunk = expr.inputs[0]
    for what, tv in (("row", chunk), ("values", values), ("indices", indices)):
        if tv.memory_type != MemoryType.Local or tv not in ctx.buffers:
            raise LoweringError(f"T{values.name}: a top-k's {what} (T{tv.name}) must be a "
                                "register tensor (schedulers/topk.py)")
    own = [ctx.loop_of[(values, j)] for j in range(values.compute_at_pos, len(values.domain.loop))]
    stride = _result_stride(ctx, values, own, expr)
    idx = next((k for k, f in enumerate(parents) if f.loop is own[0]), None)
    if idx is None or [f.loop for f in parents[idx:]] != own:
        raise LoweringError(f"T{values.name}: its top-k is not directly inside its own loops")
    if any(isinstance(s, K.TensorOp) and s is not op for s in K.walk([parents[idx]])):
        raise LoweringError(f"T{values.name}: its own loops hold more than its top-k")
    chunk_size = _chunk_size(ctx, chunk, expr)
    row_id = chunk.domain.logical_no_reductions[expr.dim]
    warps = -(-_block_x(kernel) // 32)
    rows = 1
    for f in parents[:idx]:
        if f.parallel in ("TIDy", "TIDz"):
            rows *= _const(ctx, f.loop, f"T{values.name}: a block top-k's rows")
    ws = K.Buffer(f"pf_topk_ws{n}", DataType.Int, "shared",
                  K.Const(rows * (2 * warps + expr.k)))
    kernel.body.insert(0, K.Allocate(ws))
    scope = parents[idx - 1].body if idx > 0 else kernel.body
    # The block top-k stands for its own loops (the verifier's every-loop-emitted rule).
    kernel.replaced_loops.update(id(f.loop) for f in parents[idx:] if f.loop is not None)
    scope[scope.index(parents[idx])] = K.BlockTopK(
        chunk=ctx.buffers[chunk], values=ctx.buffers[values], indices=ctx.buffers[indices],
        workspace=ws, extent=scalar_to_kexpr(row_id.extent, ctx.names), k=expr.k,
        largest=expr.largest, chunk_size=chunk_size, stride=stride)


def _const(ctx, lp, what: str) -> int:
    ext = scalar_to_kexpr(lp.extent, ctx.names)
    if not isinstance(ext, K.Const):
        raise LoweringError(f"{what} has a runtime extent {ext!r}")
    return ext.value


def _result_stride(ctx, values, own: list, expr) -> int:
    """B: result j goes to register j / B of thread j % B; 0: every thread holds every result
    (k = 1, the selected dim a broadcast)."""
    ctx_loops = [(lp, values.domain.loop[values.compute_at_pos + k]) for k, lp in enumerate(own)]
    selected = set(expr.selected_ids(values))
    if not own or any(i not in selected for _, i in ctx_loops):
        raise LoweringError(f"T{values.name}: its own loops must iterate the selected dim only")
    kinds = [lp.parallel for lp, _ in ctx_loops]
    if all(i.is_broadcast for _, i in ctx_loops) and expr.k == 1:
        return 0
    if kinds == [ParallelType.TIDx]:
        tidx = ctx_loops[0]
    elif len(kinds) == 2 and kinds[1] == ParallelType.TIDx and not kinds[0].is_thread_or_block:
        serial, tidx = ctx_loops
        d = tidx[1].definition
        if not (isinstance(d, Split) and d.inner_split and d.outer is serial[1]
                and d.inner is tidx[1] and d.in_id is values.domain.logical[expr.dim]):
            raise LoweringError(f"T{values.name}: its selected dim is not split into (results "
                                "per thread, threadIdx.x)")
    else:
        raise LoweringError(f"T{values.name}: its own loops are {[k.name for k in kinds]}, not "
                            "(serial, threadIdx.x) or (threadIdx.x)")
    return _const(ctx, tidx[0], f"T{values.name}'s threadIdx.x loop")


def _chunk_size(ctx, chunk, expr) -> int:
    """Elements of the row each thread holds, after checking that chunk's own loops are its
    threadIdx.x loop then serial loops that split the row dim in order."""
    pos = chunk.compute_at_pos
    ids = chunk.domain.loop[pos:]
    loops = [ctx.loop_of[(chunk, j)] for j in range(pos, len(chunk.domain.loop))]
    if not loops or loops[0].parallel != ParallelType.TIDx or any(
            lp.parallel.is_thread_or_block for lp in loops[1:]):
        raise LoweringError(f"T{chunk.name}: a top-k's row is held as a threadIdx.x loop over "
                            f"serial chunks (got {[lp.parallel.name for lp in loops]})")
    row_id = chunk.domain.logical_no_reductions[expr.dim]
    if _split_leaves(row_id, set(chunk.domain.all_ids())) != list(ids):
        raise LoweringError(f"T{chunk.name}: its own loops do not split its row dim in order")
    size = 1
    for lp in loops[1:]:
        size *= _const(ctx, lp, f"T{chunk.name}'s chunk loop")
    return size


def _split_leaves(i, domain_ids: set) -> list:
    """The IDs of a domain (`domain_ids`) split from `i` in order (outer before inner), or [i]
    when the domain does not split it (splits of other domains' replays are skipped)."""
    uses = [e for e in i.uses if isinstance(e, Split) and e.outer in domain_ids]
    if not uses:
        return [i]
    return _split_leaves(uses[0].outer, domain_ids) + _split_leaves(uses[0].inner, domain_ids)


def _block_x(kernel) -> int:
    bx = kernel.fusion.launch_hints.get("block_x")
    if not isinstance(bx, int) or bx % 32:
        raise LoweringError(f"a block top-k needs a static block x of whole warps (got {bx})")
    return bx

"""Pass `index_and_predicate`: memory accesses and the conditions that guard them.

Before: TensorOps name fusion tensors:           T4 = T2 * T3
After:  every operand is an indexed access and every op has its predicate:
        if (i0 < i_0 && i3 * 4 + i5 < i_1) T4[i5] = T2[i5] * T3_g[i0 * T3_s0 + i3 * 4 + i5]

Global tensors are indexed through the exact ID graph from the promoted IDs of the loops around
the op (lower/indexing.py), times the tensor's strides. A register or shared-memory tensor is
indexed by the loops it is allocated over: its writer uses its own loop variables; a reader uses
the variable of its loop that maps to the same ID, so both see the same element. A buffer split
further than its reader's loops (the cache of an int64 input read in two 2-wide vectors inside a
loop of 4) is indexed forward through that split from the reader's loop.
Dims the loops index through one merge of them cost no division: a run of dims contiguous in
memory (H and W of an NCHW input, every dim of a dense tensor in a flat loop) is addressed by the
merged index times the stride of its innermost dim, and guarded by `merged < extent product`
(IndexGraph.merged_runs, _contiguous_runs), not by `merged / W < H`.
Predicates: an ID whose index may exceed its extent (a split that does not divide) gets
`index < extent` on the consumer's root and logical IDs (reads of global producers map to those);
writes to global or shared memory by threads that do not index the tensor get
`threadIdx.x == 0`-style guards (`blockIdx.x == 0` outside the grid-stride loop of a persistent
grid); thread loops shorter than the block get `threadIdx.x < extent`.
So do loops the written tensor has a broadcast axis in while they iterate (a row statistic
[M, 1] computed in the loops of its row): their first thread, block or iteration (`j == 0`)
writes it, once per row. Where one loop mixes a tensor's broadcast dims with its own (an [M, 1]
output in the flat loop over the [M, N] output it broadcasts to), a global write is guarded to
index 0 of the iterations those dims stand for: `flat % N == 0`. Expanded dims (stride 0) are
broadcasts in memory and guarded alike, and so are the dims a tensor of a lower rank lacks (an
[N] or 0-dim output in the flat loop over [M, N]: written by row 0, by the first iteration).
A register buffer is read only by loops bound like the ones that wrote it (the same thread owns
it); a schedule that reads another thread's registers is refused.
"""
from __future__ import annotations

from ..ir.dtype import DataType
from ..ir.exprs import GatherOp, IndexCheckOp, IotaOp, RandOp, ScatterOp, WindowOp
from ..ir.id_graph import IdGraph
from ..ir.iter_domain import ParallelType, history
from ..ir.scalar import Scalar
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K
from ..kir.verifier import Rule, establishes
from .allocation import BUFFERS_ALLOCATED
from .context import LoweringError
from .indexing import IndexGraph, Known, scalar_to_kexpr
from .loops import FUSION_OPERANDS
from .params import executor_allocated, tensor_contiguity
from .ranges import simplify_predicate

_THREAD_SPECIAL = {
    ParallelType.TIDx: "threadIdx.x", ParallelType.TIDy: "threadIdx.y",
    ParallelType.TIDz: "threadIdx.z", ParallelType.BIDx: "blockIdx.x",
    ParallelType.BIDy: "blockIdx.y", ParallelType.BIDz: "blockIdx.z",
}


def _indexed(v, s, scope) -> None:
    """Operands are kernel expressions, no fusion values: each tensor the op reads an indexed
    access (TensorIndex), each scalar a ScalarValue, and the operands the pass adds (a gather's,
    scatter's or index check's stride, extent and error record, a window's condition, an iota's
    or random op's element index) expressions; outputs TensorIndex, predicates kernel
    expressions; accumulators start from ScalarValues; reductions reduce register values."""
    if isinstance(s, K.TensorOp):
        for k, x in enumerate(s.ins):
            if not isinstance(x, K.KExpr):
                v.fail(f"input {k} is {type(x).__name__} ({x!r}), not a kernel expression "
                       "after index_and_predicate", s)
        tensors = sum(isinstance(x, TensorView) for x in s.expr.inputs)
        if sum(isinstance(x, K.TensorIndex) for x in s.ins) < tensors:
            v.fail(f"the op reads {tensors} tensor(s) but has fewer indexed accesses "
                   "after index_and_predicate", s)
        if not isinstance(s.out, K.TensorIndex):
            v.fail(f"the output is {type(s.out).__name__} ({s.out!r}), not a TensorIndex "
                   "after index_and_predicate", s)
        if not isinstance(s.predicate, K.KExpr) or isinstance(s.predicate, (K.TensorIndex,
                                                                            K.ScalarValue)):
            v.fail(f"predicate {s.predicate!r} is not a kernel expression", s)
    elif isinstance(s, K.InitValue) and not isinstance(s.value, K.ScalarValue):
        v.fail(f"init value {s.value!r} is not a ScalarValue after index_and_predicate", s)
    elif isinstance(s, (K.BlockReduce, K.GridReduce, K.ClusterReduce)):
        if not s.values:
            v.fail(f"{type(s).__name__} has no values after index_and_predicate", s)
        for x in s.values:
            if not isinstance(x, K.TensorIndex):
                v.fail(f"reduced value {x!r} is not a TensorIndex", s)


# Every operand is an indexed access with its predicate.
INDEXED = Rule("indexed", stmt=_indexed)


@establishes(INDEXED, retires=(FUSION_OPERANDS, BUFFERS_ALLOCATED))
def index_and_predicate(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    # Constant-extent loops' variables (vector lanes among them) for the lane fold of merges.
    lanes = {lp.var: c.value for lp in ctx.all_loops() if isinstance(lp.var, K.Var)
             and isinstance(c := scalar_to_kexpr(lp.extent, ctx.names), K.Const)}
    ctx.index_graph = IndexGraph(ctx.exact, ctx.names, ctx.extent_multiples, lanes)
    ctx.kernel_parallel = _kernel_parallel_types(ctx)
    ctx.index_checks, ctx.index_error, ctx.index_report = [], None, None
    ctx.zeroed_outputs = set()
    for s in K.walk(kernel.body):
        if isinstance(s, K.TensorOp):
            _index_op(s, ctx)
        elif isinstance(s, K.InitValue):
            s.value = K.ScalarValue(s.value, s.tv.dtype)
        elif isinstance(s, (K.BlockReduce, K.GridReduce, K.ClusterReduce)):
            _index_reduce(s, ctx)
    if ctx.index_error is not None:
        # The record of the first index a gather found out of range, and its copy in host
        # memory the host reads without waiting (runtime/index_check.py).
        for buf, kind in ((ctx.index_error, "index_error"), (ctx.index_report, "index_report")):
            kernel.params.append(K.Param(buf.name, "ptr", ("workspace", buf.name), buf))
            kernel.workspaces.append((buf, kind))
    return kernel


def _kernel_parallel_types(ctx) -> dict:
    out: dict = {}
    for lp in ctx.all_loops():
        if lp.parallel.is_thread_or_block:
            out.setdefault(lp.parallel, []).append(lp.extent)
    return out


def loop_index(lp) -> K.KExpr:
    return lp.var


def start_values(nest) -> dict:
    # A bulk (TMA) axis is moved by one copy: its index is that of the copy's first element.
    return {lp.promoted: Known(K.Const(0) if lp.parallel == ParallelType.Bulk else loop_index(lp),
                               False) for lp in nest}


def global_offset(ctx, tv: TensorView, known: dict) -> K.KExpr:
    ig = ctx.index_graph
    offset: K.KExpr = K.Const(0)
    in_runs: set = set()
    for k, stride, dims in _contiguous_runs(ctx, tv, known):
        offset = K.add(offset, K.mul(k.value, stride))
        in_runs |= dims
    for i, stride in zip(tv.domain.logical_no_reductions, ctx.strides[tv]):
        if i.is_broadcast or (isinstance(stride, K.Const) and stride.value == 0) or i in in_runs:
            continue
        k = ig.index_of(known, i)
        if k is None:
            raise LoweringError(f"cannot index T{tv.name}: no path from the loop indices to "
                                f"{i!r} (the schedule loses that axis)")
        offset = K.add(offset, K.mul(k.value, stride))
    return offset


def _contiguous_runs(ctx, tv: TensorView, known: dict) -> list:
    """[(Known, stride, dims)] for runs of adjacent dims of tv's allocation, contiguous with
    each other, that the loops index through one merge of them: a run's offset is the merged
    index times the stride of its innermost dim (hw * s_w, not hw / W * s_h + hw % W * s_w: no
    division). An output the executor allocates is dense, so any such run qualifies. An input's
    run must lie in the contiguous tail of its allocation that ends at its unit-stride innermost
    dim: there the contiguity check of inputs makes each dim's stride the product of the
    extents inside it, whatever stride torch gave a dim of size 1 (its index is 0, and so is
    its part of the merged index), and the run's stride is that product; elsewhere a size-1
    dim's stride says nothing."""
    ig = ctx.index_graph
    logical = tv.domain.logical_no_reductions
    strides = ctx.strides.get(tv)
    alloc = [(i, c) for i, c in zip(tv.domain.maybe_allocation, tensor_contiguity(tv) or ())
             if not i.is_reduction and not i.is_broadcast and i in logical]
    if strides is None or len(alloc) < 2:
        return []
    dense = executor_allocated(tv)
    last = strides[logical.index(alloc[-1][0])]
    unit_tail = isinstance(last, K.Const) and last.value == 1
    merged = ig.merges_of_adjacent([ig.g.group(i) for i, _ in alloc])
    runs = []
    j = len(alloc) - 1
    while j > 0:
        inner = alloc[j][0]
        stride = strides[logical.index(inner)]
        if not dense and j < len(alloc) - 1:
            # A run inside an input's contiguous tail (the N, H, W rows of a channels-last
            # image, C inside them): the contiguity check makes its innermost dim's stride the
            # product of the extents inside it, which the kernel has (not the stride torch
            # passed, which says nothing for a dim of size 1).
            if not (unit_tail and all(c for _, c in alloc[j:])):
                break
            stride = K.Const(1)
            for i, _ in alloc[j + 1:]:
                stride = K.mul(stride, scalar_to_kexpr(i.extent, ctx.names))
        elif not dense and not unit_tail:
            break
        # The widest run a..j, its dims contiguous with each other, whose merge the loops know.
        a = j
        while a > 0 and alloc[a - 1][1]:
            a -= 1
        run = None
        for start in range(a, j):
            run = next((g for g in merged.get((start, j), ()) if g in known), None)
            if run is not None:
                runs.append((known[run], stride, {i for i, _ in alloc[start:j + 1]}))
                j = start - 1
                break
        if run is None:
            j -= 1
    return runs


def buffer_offset(ctx, tv: TensorView, index_of_id) -> K.KExpr:
    """Row-major offset into a register/shared buffer; `index_of_id(ID, Loop)` -> KExpr. A
    buffer with padded rows (ctx.row_pad) steps its outer dims by a row plus the padding."""
    ids = ctx.alloc_ids[tv]
    at, pad = ctx.row_pad.get(tv, (0, 0))

    def horner(part):
        offset: K.KExpr = K.Const(0)
        for i, ext, lp in part:
            if isinstance(ext, K.Const) and ext.value == 1:
                continue    # one element (a broadcast not materialized across a loop): index 0
            offset = K.add(K.mul(offset, ext), index_of_id(i, lp))
        return offset
    if not pad:
        return horner(ids)
    row = K.Const(1)
    for _, ext, _ in ids[at:]:
        row = K.mul(row, ext)
    return K.add(K.mul(horner(ids[:at]), K.add(row, K.Const(pad))), horner(ids[at:]))


def _writer_index(i, lp):
    if lp is None or lp.parallel == ParallelType.Bulk:
        return K.Const(0)
    return loop_index(lp)


def reader_index(ctx, producer: TensorView, nest, consumer: TensorView, known: dict):
    """index_of_id(ID, Loop) -> KExpr: the index at which `consumer`, inside loops `nest`, reads
    each allocated ID of `producer`'s register or shared buffer."""
    def index_of_id(i, _lp):
        for lp in nest:
            if ctx.exact.mapped(i, lp.promoted):
                return loop_index(lp)
        for j, lp in enumerate(nest):
            cid = _consumer_id_of(ctx, consumer, lp)
            if cid is not None and ctx.permissive.mapped(i, cid):
                return loop_index(lp)
        for lp in nest:
            if ctx.permissive.mapped(i, lp.promoted):
                return loop_index(lp)
        if _lp is not None and _lp.promoted is not i:
            # The writer's loop stands for another ID (a replayed split of the reader's loop:
            # the int64 cache of a [1, N] row read 2-wide in a loop of 4): the writer put the
            # element of that ID's index there, so the reader takes the same ID's index.
            k = ctx.index_graph.index_of(known, _lp.promoted)
            if k is not None:
                return k.value
        k = ctx.index_graph.index_of(known, i)
        if k is not None:
            return k.value
        if i.is_broadcast:
            return K.Const(0)
        raise LoweringError(f"T{consumer.name} reads T{producer.name}'s buffer along {i!r}, "
                            "which maps to none of its loops")
    return index_of_id


def _check_same_threads(ctx, producer: TensorView, nest, consumer: TensorView) -> None:
    """A register buffer holds what its own thread computed: a consumer must read it in a loop
    bound to the same thread (block) dim as each thread-bound axis the producer iterates.
    Read by another binding (a row statistic [M] whose threadIdx.y axis was vectorized, one
    thread writing the rows the others hold), every thread but one would read its own value."""
    for i in producer.domain.loop[producer.compute_at_pos:]:
        pt = i.parallel_type
        if not pt.is_thread_or_block or i.is_broadcast or i.is_reduction:
            continue
        if not any(lp.parallel == pt and (ctx.exact.mapped(i, lp.promoted)
                                          or ctx.permissive.mapped(i, lp.promoted))
                   for lp in nest):
            raise LoweringError(
                f"T{consumer.name} reads T{producer.name}'s registers along {i!r} "
                f"({pt.short}) in none of its {pt.short} loops: the values are another thread's")


def _allocated_ancestors(ctx, tv: TensorView) -> list:
    """The IDs of tv's domain that its buffer holds whole (every loop ID split or merged from
    them is one the buffer is allocated over) and those loop IDs' ancestors below them: the
    dims along which an index past the extent leaves the buffer. A dim the buffer holds a
    piece of (the row of a circular-buffer slot, the rows' outer split stepped by a loop)
    wraps to another slot instead."""
    allocated = [i for i, _, _ in ctx.alloc_ids.get(tv, ())]

    def ancestors(i) -> list:
        out, todo = [], [i]
        while todo:
            x = todo.pop()
            if any(x is y for y in out):
                continue
            out.append(x)
            if x.definition is not None:
                todo.extend(x.definition.inputs)
        return out

    up = {id(x): ancestors(x) for x in tv.domain.loop}
    held = []
    for x in tv.domain.loop:
        for a in up[id(x)]:
            if any(a is h for h in held):
                continue
            below = [y for y in tv.domain.loop if any(a is z for z in up[id(y)])]
            if all(any(y is q for q in allocated) for y in below):
                held.append(a)
    return held


def _consumer_id_of(ctx, consumer: TensorView, lp):
    for j, _ in enumerate(consumer.domain.loop):
        if ctx.loop_of.get((consumer, j)) is lp:
            return consumer.domain.loop[j]
    return None


def access(ctx, tv: TensorView, nest, known: dict, consumer: TensorView, is_write: bool) -> K.TensorIndex:
    buf = ctx.buffers[tv]
    if tv.memory_type == MemoryType.Global:
        return K.TensorIndex(buf, global_offset(ctx, tv, known))
    if is_write:
        return K.TensorIndex(buf, buffer_offset(ctx, tv, _writer_index))
    if tv.memory_type == MemoryType.Local:
        _check_same_threads(ctx, tv, nest, consumer)
    return K.TensorIndex(buf, buffer_offset(ctx, tv, reader_index(ctx, tv, nest, consumer, known)))


def _operand(ctx, v, nest, known, consumer):
    if isinstance(v, TensorView):
        return access(ctx, v, nest, known, consumer, is_write=False)
    if isinstance(v, Scalar):
        return K.ScalarValue(v, v.dtype)
    raise LoweringError(f"unsupported operand {v!r}")


def _index_op(op: K.TensorOp, ctx) -> None:
    tv: TensorView = op.out
    nest = op.nest
    targets = list(tv.domain.maybe_root) + list(tv.domain.logical)
    for v in op.ins:
        if isinstance(v, TensorView):
            targets += v.domain.logical
            if v.memory_type != MemoryType.Global:
                # A buffer allocated over IDs split further than the reader's loops (the cache
                # of an int64 input read 2-wide in a loop of 4): their indices come forward
                # through those splits from the reader's loop.
                for i, _, lp in ctx.alloc_ids.get(v, ()):
                    targets += [i] if lp is None else [i, lp.promoted]
    known = ctx.index_graph.traverse(start_values(nest), targets)
    op.known = known
    conds = []
    seen = set()
    # Register-to-register math needs no guard: an out-of-range iteration computes a value no
    # guarded write or accumulation ever uses. Memory accesses and accumulations are guarded.
    # A scan step feeds the thread's running value: guarded like an accumulation.
    scan_step = op.carry is not None and not op.scan_fixup
    # An index check reports what it finds in global memory: an iteration past the tensor's
    # end would report the garbage its registers hold.
    touches_memory = (op.accumulate or scan_step or isinstance(op.expr, IndexCheckOp)
                      or tv.memory_type != MemoryType.Local or any(
        isinstance(v, TensorView) and v.memory_type == MemoryType.Global for v in op.ins))
    # A read of shared memory into registers is guarded only along the dims the shared buffer
    # holds: an index past them leaves the buffer (a register tile of 4 x 335 x 4 = 5360 over
    # a row slot of 5356 read the last slot's vector past its end: fuzz 20261124:2224). Past
    # other dims (a row beyond the last in a grid-stride loop) it reads a slot of the buffer,
    # whose value no guarded write uses, and a guard there costs registers.
    shared_dims = None
    if not touches_memory:
        shared = [v for v in op.ins
                  if isinstance(v, TensorView) and v.memory_type == MemoryType.Shared]
        if shared:
            touches_memory = True
            shared_dims = [a for v in shared for a in _allocated_ancestors(ctx, v)]
    ig = ctx.index_graph
    dims = [i for i in _indexed_ids(tv) if touches_memory
            and not i.is_broadcast
            and (shared_dims is None or any(ctx.exact.mapped(i, a) for a in shared_dims))]
    # Dims the loops index through a merge are guarded as one (hw < H * W, not hw / W < H).
    merged, merged_dims = ig.merged_runs({ig.g.group(i) for i in dims}, known)
    for g, k in merged.items():
        if k.may_overflow:
            conds.append(k.in_bounds(ig.extent(g)))
    for i in dims:
        if i in seen:
            continue
        seen.add(i)
        if ig.g.group(i) in merged_dims:
            continue
        k = ig.index_of(known, i)
        if k is None:
            raise LoweringError(f"cannot index T{tv.name}'s axis {i!r} from its loops")
        if k.may_overflow:
            conds.append(k.in_bounds(scalar_to_kexpr(i.extent, ctx.names)))
    # An intermediate ID whose index can pass its extent aliases another element when it is the
    # inner part of its split (in = outer * f + inner): e.g. rows split over blocks and then by
    # threads unevenly, where a block's last rows would run into the next block's. (An outer
    # part that overflows only makes `in` overflow, which is checked at `in`.)
    for i in tv.domain.all_ids() if touches_memory else []:
        if i in seen or i.is_broadcast or i.definition is None:
            continue
        if shared_dims is not None and not any(ctx.exact.mapped(i, a) for a in shared_dims):
            continue
        seen.add(i)
        k = ctx.index_graph.index_of(known, i)
        if k is not None and k.may_overflow and _is_inner_of_split(i):
            conds.append(k.in_bounds(scalar_to_kexpr(i.extent, ctx.names)))
    if touches_memory and shared_dims is None:
        redundant = _redundant_loops(ctx, tv, nest) if tv.memory_type != MemoryType.Local else []
        conds += _thread_predicates(ctx, tv, nest, redundant)
        if tv.memory_type == MemoryType.Global:
            conds += _broadcast_write_guards(ctx, tv, nest, redundant)
    elif shared_dims is not None:
        # A thread past its loop's extent (a block sized in whole warps beyond a loop of 141)
        # would index the shared buffer past its end: the register read takes the guards of
        # its thread loops shorter than the block.
        conds += _short_thread_loop_guards(ctx, nest)
    op.predicate = simplify_predicate(K.all_of(_dedupe(conds)), _loop_ranges(ctx, nest))
    if isinstance(op.expr, ScatterOp):
        _scatter_write(ctx, op, ig, known, nest)
        return
    op.out = access(ctx, tv, nest, known, tv, is_write=True)
    if isinstance(op.expr, WindowOp):
        op.ins = _window_read(ctx, op.expr, ig, known)
        return
    if isinstance(op.expr, GatherOp):
        op.ins = _gather_read(ctx, op.expr, ig, known, nest)
        return
    op.ins = [_operand(ctx, v, nest, known, tv) for v in op.ins]
    if isinstance(op.expr, IndexCheckOp):
        # [index, extent, record, host copy, check]: codegen and the interpreter report an
        # index outside [0, extent) (its value is copied either way: what reads it, a compare
        # with an iota, reads no memory with it).
        e = op.expr
        op.ins[1] = scalar_to_kexpr(e.extent, ctx.names)
        op.ins += _index_check(ctx, e.what, e.dim, e.extent)
    if isinstance(op.expr, IotaOp):
        # The iota's values: start + index * step (codegen, the interpreter).
        op.ins.append(_logical_index(ig, known, tv, tv.domain.logical[0]))
    if isinstance(op.expr, RandOp):
        # The element's row-major index in out: its place in the op's random stream.
        linear: K.KExpr = K.Const(0)
        for i in tv.domain.logical:
            linear = _row_major_step(linear, scalar_to_kexpr(i.extent, ctx.names),
                                     _logical_index(ig, known, tv, i))
        op.ins.append(linear)


def _window_read(ctx, e: WindowOp, ig: IndexGraph, known) -> list:
    """[the read of e's source, the condition under which it is read, the fill]: each dim of
    the source at its window's index of out's index along it (out's own IDs: the source's have
    no partners), the guards of every window as the condition (codegen and the interpreter
    take the fill where it fails)."""
    src, out = e.src, e.outputs[0]
    _check_source_in_global(src, out, "window")
    offset: K.KExpr = K.Const(0)
    conds = []
    for i, w, stride in zip(out.domain.logical, e.windows, ctx.strides[src]):
        j = _logical_index(ig, known, out, i)
        if w is not None:
            for a, b, lo, hi in w.guards:
                v = K.add(scalar_to_kexpr(a, ctx.names), K.mul(j, K.Const(b)))
                conds.append(K.lt(K.add(scalar_to_kexpr(lo, ctx.names), K.Const(-1)), v))
                conds.append(K.lt(v, scalar_to_kexpr(hi, ctx.names)))
            j = K.add(scalar_to_kexpr(w.offset, ctx.names), K.mul(j, K.Const(w.step)))
        if not (isinstance(stride, K.Const) and stride.value == 0):
            offset = K.add(offset, K.mul(j, stride))
    return [K.TensorIndex(ctx.buffers[src], offset), K.all_of(conds),
            K.ScalarValue(e.fill, out.dtype)]


def _row_major_step(outer: K.KExpr, extent: K.KExpr, j: K.KExpr) -> K.KExpr:
    """outer * extent + j, with (a / n) * n + a % n folded to a, and (a / n) * n + (a % n +
    lane) to a + lane (a vector lane folded out of the row's division: lower/indexing.py): in a
    flat loop the dims' indices are divisions and remainders of the flat index, which recombine
    to it (a random op's row-major index then costs no division per element)."""
    lane = None
    if isinstance(j, K.Bin) and j.op == "+" and isinstance(j.a, K.Bin) and j.a.op == "%":
        j, lane = j.a, j.b
    if (isinstance(outer, K.Bin) and outer.op == "/" and isinstance(j, K.Bin) and j.op == "%"
            and repr(outer.a) == repr(j.a) and repr(outer.b) == repr(j.b) == repr(extent)):
        return outer.a if lane is None else K.add(outer.a, lane)
    if lane is not None:
        j = K.add(j, lane)
    return K.add(K.mul(outer, extent), j)


def _check_source_in_global(src: TensorView, out: TensorView, what: str) -> None:
    """A window or a gather reads its source in global memory at its own offsets."""
    if src.memory_type != MemoryType.Global:
        raise LoweringError(f"T{out.name} is a {what} of T{src.name}, which this kernel "
                            f"computes: a {what} reads global memory (the segmenter ends a "
                            "segment at it)")


def _gather_read(ctx, e: GatherOp, ig: IndexGraph, known, nest) -> list:
    """[the read of e's source without its gathered dim, the index operand, the gathered dim's
    stride and extent, the index error record and its host copy, the check's number]: codegen
    and the interpreter add index * stride to the read where 0 <= index < extent, and record
    the index in the error workspaces (lower/launch.py declares them; runtime/index_check.py)
    where not.
    Every other dim of the source is read at out's index along the dim it maps to (0 where the
    source broadcasts)."""
    src, out = e.src, e.outputs[0]
    _check_source_in_global(src, out, e.what)
    offset: K.KExpr = K.Const(0)
    strides = ctx.strides[src]
    for d, k in enumerate(e.src_dims):
        if k is None or (isinstance(strides[d], K.Const) and strides[d].value == 0):
            continue
        offset = K.add(offset, K.mul(_logical_index(ig, known, out, out.domain.logical[k]),
                                     strides[d]))
    dim_id = src.domain.logical_no_reductions[e.dim]
    # An expanded dim (stride 0) holds its expanded size of positions, all one element.
    size = dim_id.user_extent
    return [K.TensorIndex(ctx.buffers[src], offset), _operand(ctx, e.index, nest, known, out),
            strides[e.dim], scalar_to_kexpr(size, ctx.names)] + _index_check(ctx, e.what, e.dim,
                                                                             size)


def _indexed_ids(tv: TensorView) -> list:
    """The IDs of tv that the loops around its op index: its root and logical ones, of a
    scatter's output its root alone (its iteration: the logical IDs, the target's, are written
    at the index's values along the scattered dim and at the iteration's index along the
    others, lower/index._scatter_write)."""
    if isinstance(tv.definition, ScatterOp):
        return list(tv.domain.root)
    return list(tv.domain.maybe_root) + list(tv.domain.logical)


def _scatter_write(ctx, op: K.TensorOp, ig: IndexGraph, known, nest) -> None:
    """A scatter's add, a gather's read turned around: `op.out` is out (a fusion output) at
    its iteration's index along every dim but the scattered one; `op.ins` are [the value
    added, the index, the scattered dim's stride and extent, the index error record, its host
    copy, the check's number]. Codegen and the interpreter add index * stride to the address
    where 0 <= index < extent and report the index where not. The output is zeroed by the
    executor before the launch (ctx.zeroed_outputs: the launch's `zeroed_outputs`)."""
    e: ScatterOp = op.expr
    out = e.outputs[0]
    if out not in ctx.fusion.outputs or out.memory_type != MemoryType.Global:
        raise LoweringError(f"T{out.name}, a scatter's result, must be an output of the kernel "
                            "(its atomic adds go to global memory)")
    if e.op != "add" or e.x is not None:
        raise LoweringError(f"T{out.name}: only a scatter that adds into zeros is a kernel")
    strides = ctx.strides[out]
    offset: K.KExpr = K.Const(0)
    for k, r in enumerate(out.domain.root):
        if k == e.dim or (isinstance(strides[k], K.Const) and strides[k].value == 0):
            continue
        offset = K.add(offset, K.mul(_logical_index(ig, known, out, r), strides[k]))
    size = out.domain.logical[e.dim].user_extent
    ctx.zeroed_outputs.add(ctx.fusion.outputs.index(out))
    op.out = K.TensorIndex(ctx.buffers[out], offset)
    op.ins = [_operand(ctx, e.src, nest, known, out), _operand(ctx, e.index, nest, known, out),
              strides[e.dim], scalar_to_kexpr(size, ctx.names)] + _index_check(ctx, e.what,
                                                                               e.dim, size)


def _index_check(ctx, what: str, dim: int, size) -> list:
    """[the index error record, its host copy, the check's number] for a new check of an index
    against `size` (an extent Scalar) along `dim` of op `what`: the workspaces every check of
    the kernel shares (lower/launch.py declares them; runtime/index_check.py reads them)."""
    if ctx.index_error is None:
        ctx.index_error = K.Buffer("pf_index_error", DataType.Int64, "global")
        ctx.index_report = K.Buffer("pf_index_report", DataType.Int64, "global")
    check = len(ctx.index_checks)
    ctx.index_checks.append((what, dim, size))
    return [K.TensorIndex(ctx.index_error, K.Const(0)), K.TensorIndex(ctx.index_report, K.Const(0)),
            K.Const(check)]


def _logical_index(ig: IndexGraph, known, tv: TensorView, i) -> K.KExpr:
    """The index of tv's logical ID i in the loops around tv's op (0 for a broadcast): what an
    iota's values and a window's reads are made from."""
    if i.is_broadcast:
        return K.Const(0)
    k = ig.index_of(known, i)
    if k is None:
        raise LoweringError(f"cannot index T{tv.name}'s axis {i!r} from its loops")
    return k.value


def _is_inner_of_split(i) -> bool:
    from ..ir.iter_domain import Split
    return isinstance(i.definition, Split) and i is i.definition.inner


def _short_thread_loop_guards(ctx, nest) -> list:
    """`threadIdx.d < extent` for each loop of `nest` bound to a thread dim whose extent may be
    below the block's along d (the block is the largest of the kernel's constant extents there,
    or the schedule's pinned size; unknown: guarded)."""
    conds = []
    for lp in nest:
        pt = lp.parallel
        if not pt.is_thread_dim:
            continue
        ext = scalar_to_kexpr(lp.extent, ctx.names)
        extents = [scalar_to_kexpr(e, ctx.names) for e in ctx.kernel_parallel.get(pt, ())]
        block = _pinned_block(ctx, pt)
        if block is None and extents and all(isinstance(e, K.Const) for e in extents):
            block = max(e.value for e in extents)
        if block is not None and isinstance(ext, K.Const) and ext.value >= block:
            continue
        conds.append(K.lt(K.Special(_THREAD_SPECIAL[pt]), ext))
    return conds


def _pinned_block(ctx, pt: ParallelType):
    """The block size along thread dim `pt` that the schedule fixed (a launch hint: the scan's
    whole warps), or None."""
    return ctx.fusion.launch_hints.get(f"block_{pt.value[-1]}") if pt.is_thread_dim else None


def _loop_ranges(ctx, nest) -> dict:
    """Ranges of the loop indices around an op, where its loops have constant extents.

    A thread index is bounded by its loop's extent only when every loop bound to that thread
    dim has the same constant extent (then blockDim equals it); so is a block index when, in
    addition, no launch hint fixes its grid dim (then gridDim equals it)."""
    ranges = {}
    for lp in nest:
        ext = scalar_to_kexpr(lp.extent, ctx.names)
        if not isinstance(ext, K.Const):
            continue
        if lp.parallel.is_thread_dim or _grid_dim_from_loops(ctx, lp):
            exts = {repr(scalar_to_kexpr(e, ctx.names)) for e in ctx.kernel_parallel[lp.parallel]}
            if len(exts) != 1:
                continue
            pinned = _pinned_block(ctx, lp.parallel)
            if pinned is not None and pinned != ext.value:
                continue        # a block sized by the schedule: blockDim is the hint
            ranges[_THREAD_SPECIAL[lp.parallel]] = (0, ext.value - 1)
        elif isinstance(lp.var, K.Var):
            ranges[lp.var] = (0, ext.value - 1)
    return ranges


def _grid_dim_from_loops(ctx, lp) -> bool:
    """A block dim whose grid extent launch_config takes from its loops (no launch hint fixes
    it), e.g. the blocks of a cluster along blockIdx.y that split a row."""
    return (lp.parallel.is_block_dim
            and f"grid_{lp.parallel.value[-1]}" not in ctx.fusion.launch_hints)


def _dedupe(conds):
    out, keys = [], set()
    for c in conds:
        key = repr(c)
        if key not in keys:
            keys.add(key)
            out.append(c)
    return out


def _thread_predicates(ctx, tv: TensorView, nest, redundant: list) -> list:
    conds = []
    used = {lp.parallel for lp in nest}
    if ParallelType.GridStride in used:
        used.add(ParallelType.BIDx)     # a grid-stride loop indexes by blockIdx.x
    for lp in redundant:
        if isinstance(lp.var, K.Var):
            # A serial (or unrolled) loop tv does not index: its first iteration writes.
            conds.append(K.eq(lp.var, K.Const(0)))
    redundant_pts = {lp.parallel for lp in redundant}
    for pt, extents in ctx.kernel_parallel.items():
        special = _THREAD_SPECIAL.get(pt)
        if special is None:
            continue
        if pt in used and pt not in redundant_pts:
            lp = next((lp for lp in nest if lp.parallel == pt), None)
            if lp is None:
                continue    # indexed through a grid-stride loop: every block has its share
            if tv.memory_type == MemoryType.Local and lp.promoted.is_broadcast:
                # A loop promoted to a broadcast indexes nothing (a [1]-shaped input's cache
                # whose broadcast axis took threadIdx.x): every thread computes the value in
                # its own registers, since every thread reads it.
                continue
            extent = scalar_to_kexpr(lp.extent, ctx.names)
            if (pt.is_block_dim and tv.memory_type != MemoryType.Local
                    and isinstance(extent, K.Const) and extent.value == 1
                    and _after_grid_reduction(ctx, tv, pt.value[-1])):
                # One block's loop over the dim a grid reduction spans (the [1, 1] epilogue of
                # a full sum split over blockIdx.y, log(sum) + max): the block that finished
                # the grid reduction holds the result, whichever index it has along the dim.
                conds.append(K.Var("pf_grid_last", "bool"))
                continue
            mine = repr(extent)
            # A block the schedule sized itself (the scan's whole warps) may exceed every loop.
            pinned = _pinned_block(ctx, pt)
            if any(repr(scalar_to_kexpr(e, ctx.names)) != mine for e in extents) or (
                    pinned is not None and mine != repr(K.Const(pinned))):
                conds.append(K.lt(K.Special(special), scalar_to_kexpr(lp.extent, ctx.names)))
        elif tv.memory_type != MemoryType.Local:
            if pt.is_block_dim and _after_grid_reduction(ctx, tv, pt.value[-1]):
                # Only the block that finished the grid reduction holds the result.
                conds.append(K.Var("pf_grid_last", "bool"))
            else:
                # Every such thread holds the same value; one writes it.
                conds.append(K.eq(K.Special(special), K.Const(0)))
    if (tv.memory_type != MemoryType.Local and ParallelType.GridStride not in used
            and ParallelType.BIDx not in ctx.kernel_parallel
            and any(lp.id.parallel_type == ParallelType.GridStride for lp in ctx.all_loops())):
        # A persistent grid takes the rows in grid-stride turns; a tensor written outside
        # that loop (a weight's own output w * 2 [N] beside the rows) is written by every
        # block: the first writes it.
        conds.append(K.eq(K.Special(_THREAD_SPECIAL[ParallelType.BIDx]), K.Const(0)))
    return conds


def _after_grid_reduction(ctx, tv: TensorView, dim: str) -> bool:
    """Whether tv is computed from a reduction across the blocks of blockIdx.<dim> (only the
    last block to finish it holds the result; pf_grid_last is set by the grid reduction).
    A value beside it in the same loops (an [M, 1] output of an input, computed inside the
    reduction loops) is held by every block from the start."""
    seen, todo = set(), [tv]
    while todo:
        t = todo.pop()
        if dim in ctx.grid_reduced.get(t, ()):
            return True
        for p in ctx.fusion.producers(t):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return False


def _redundant_loops(ctx, tv: TensorView, nest) -> list:
    """Loops around tv's expression that iterate (more than once) while tv's own axis in them
    is a broadcast (in global memory, an expanded one too: stride 0): tv's index does not
    change along them, so each of their iterations (threads, blocks) writes the same element. E.g. rstd [M, 1] of a norm,
    computed in the loops of the row it normalizes ([M, N]) because the per-row value is
    inlined into both: one thread along the row, one persistent-batch step, writes it."""
    out = []
    for j, i in enumerate(tv.domain.loop):
        lp = ctx.loop_of.get((tv, j))
        if lp is None or lp not in nest or not i.is_broadcast:
            continue
        if i.expanded_extent is not None and tv.memory_type != MemoryType.Global:
            continue    # a buffer materializes an expanded dim; global memory holds one element
        if lp.parallel in (ParallelType.GridStride, ParallelType.Bulk):
            continue
        # A loop promoted to a broadcast runs once, unless the broadcast is expanded: split by
        # the row's vector width, an expanded dim's loop runs its lanes over one element.
        ext = scalar_to_kexpr(lp.extent, ctx.names)
        if isinstance(ext, K.Const) and ext.value == 1:
            continue
        out.append(lp)
    return out


def _broadcast_write_guards(ctx, tv: TensorView, nest, redundant: list) -> list:
    """`index == 0` guards on the iterations that tv's broadcast dims stand for in its loops,
    where a loop mixes them with dims tv has: an [M, 1] output beside the [M, N] output it
    broadcasts, both in the flat loop over M * N, would have each element written by the N
    iterations of its row; only the one at column 0 writes (flat % N == 0). Likewise a [1, N]
    output is written by the first row, and an output expanded from [M, 1] (stride 0 along N)
    once per row. Loops that iterate only such dims (the redundant loops, whose own guards
    take their first thread, block or iteration) count as 0 here."""
    groups = _broadcast_iterations(ctx, tv, nest)
    if not groups:
        return []
    start = start_values(nest)
    for lp in redundant:
        start[lp.promoted] = Known(K.Const(0), False)
    known = ctx.index_graph.traverse(start, groups)
    conds, unresolved = [], set()
    for i in groups:
        k = ctx.index_graph.index_of(known, i)
        if k is None:
            unresolved.add(ctx.exact.group(i))
        elif not (isinstance(k.value, K.Const) and k.value.value == 0):
            conds.append(K.eq(k.value, K.Const(0)))
    if unresolved:
        # A dim whose index the loops around the write do not determine: its inner part is
        # iterated elsewhere (a transpose tile's rows, by threadIdx.y, beside an [N] output
        # written in the tile's column loop). The parts of it that these loops do iterate (the
        # tile index in the block's merged index) repeat the write: each must be 0.
        for lp in nest:
            for x in history(lp.promoted):
                roots = _iterated_roots(x)
                if not roots or any(ctx.exact.group(r) not in unresolved for r in roots):
                    continue
                k = ctx.index_graph.index_of(known, x)
                if k is not None and not (isinstance(k.value, K.Const) and k.value.value == 0):
                    conds.append(K.eq(k.value, K.Const(0)))
    return conds


def _broadcast_iterations(ctx, tv: TensorView, nest) -> list:
    """One ID per exact group of the iterations tv's broadcast dims stand for, leaving out those
    of dims tv has: the iterations they are broadcast to in the fusion (their non-broadcast
    partners through producer/consumer pairs), and the dims the loops around tv's write
    iterate (a broadcast dim may line up with none of them: y[:, None] beside
    x[:, None] * y[None, :], whose y dim is the output's dim 1 while its dim 1 is new, must
    still be written at row 0 only). A tensor without broadcast dims is guarded only where
    the loops iterate dims it lacks (an [N] or 0-dim output of a lower rank in the flat loop
    over [M, N])."""
    logical = tv.domain.logical_no_reductions
    # The dims tv iterates, under any of its names (a reshape's root dims are its producer's).
    own = {ctx.exact.group(i) for i in tv.domain.all_ids() if not i.is_broadcast}
    if not any(i.is_broadcast for i in logical) and all(
            ctx.exact.group(c) in own for lp in nest for c in _iterated_roots(lp.promoted)
            if not c.is_reduction):
        return []
    if ctx.broadcast_partners is None:
        ctx.broadcast_partners = IdGraph(ctx.fusion, permissive=True, tensors=ctx.tensors,
                                         transforms=False)
    out, seen = [], set()
    for b in logical:
        if not b.is_broadcast:
            continue
        for c in ctx.broadcast_partners.members(b):
            g = ctx.exact.group(c)
            if c.is_broadcast or c.is_reduction or g in own or g in seen:
                continue
            seen.add(g)
            out.append(c)
    for lp in nest:
        for c in _iterated_roots(lp.promoted):
            g = ctx.exact.group(c)
            if c.is_reduction or g in own or g in seen:
                continue
            seen.add(g)
            out.append(c)
    return out


def _iterated_roots(i) -> list:
    """The IDs without history (not broadcasts) that ID i is split and merged from."""
    return [x for x in history(i) if x.definition is None and not x.is_broadcast]


def _index_reduce(node, ctx) -> None:
    tv = node.tv
    buf = ctx.buffers[tv]
    # Thread-bound iteration loops inside the reduction are not part of the group: each thread
    # reduces its own elements.
    inner = [lp for lp in node.inner_loops if not lp.parallel.is_thread_or_block]
    count = 1
    for lp in inner:
        ext = lp.extent.value
        if ext is None:
            raise LoweringError(f"T{tv.name}: grouped reduction over {lp!r} needs a constant extent")
        count *= ext
    inner_loops = {id(lp) for lp in inner}

    def index_of_id(i, lp):
        if lp is None or id(lp) in inner_loops:
            return K.Const(0)
        return loop_index(lp)

    node.values = [K.TensorIndex(buf, buffer_offset(ctx, tv, index_of_id), count)]

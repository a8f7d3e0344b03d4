"""Pass `circular_buffer_loops`: TMA loads into circular buffers guarded by mbarriers.

Before: a TMA-loaded shared tensor is written by a TensorOp in the loop left of its compute-at
position (the buffered loop L), read later in the same iteration:

    for j in L:                                   # e.g. grid-stride over row groups
      for r in 0..R: for b in Bulk[0, N):  T14[r * N] = T0[(j * R + r) * s0]     (one thread)
      ... = T14[ty * N + ...]                     # consumers

After (pipelined kind, S stages, P = prefetch; n = trip count of L; slot(k) = k % S):

    __shared__ u64 mbar_T14[S];
    if (thread 0) { for s < S: mbarrier_init(mbar_T14[s], 1); fence_mbarrier_init(); }
    __syncthreads();
    for s < P:  if (s < n) issue(s)               # prologue (unrolled)
    for k in [0, n - P):                          # main loop
      issue(k + P); wait(mbar_T14[k % S], (k / S) & 1); body(k); __syncthreads();
    for k in [max(n - P, 0), n):                  # epilogue: drains, issues nothing
      wait(mbar_T14[k % S], (k / S) & 1); body(k);
    __syncthreads(); if (thread 0) for s < S: mbarrier_inval(mbar_T14[s]);

    issue(k): j = start + k * step;
              if (thread 0) { for r: if (row valid) { expect_tx(mbar[k % S], bytes); bulk copy
                              into slot k % S }; mbarrier_arrive(mbar[k % S]) }

The block barrier at the end of each main-loop iteration orders every thread's reads of slot
k % S before the copy that iteration k + 1 issues into slot (k + 1 + P) % S, which is slot
k % S when P = S - 1 (WAR across the generic and async proxies needs only that barrier).
The issuing thread raises the expected bytes per copy and then arrives once, so a stage whose
last rows are out of range (no copy) still completes, with the bytes of the copies it made.
A TMA tensor that is not circular-buffered is loaded with S = 1, P = 0: issue, wait, use.

Tensor-map loads (LoadKind.TmaTensor) issue one box per stage instead: the slot is whole rows
of an input, copied by one `cp.async.bulk.tensor.3d` whose expected bytes are the whole box
(rows past the tensor are zero-filled), so a stage needs no per-row predicate.

Limitations: the buffered loop is serial or
grid-stride, with the TMA tensors of one loop sharing stages and prefetch; the warp-specialized
kind is left to the `warp_specialize` pass and cp.async loads to `cp_async_buffer_loops` (both
reuse the helpers below); the load sub-tree must hold only the TMA copies (a bulk axis and
serial axes).
"""
from __future__ import annotations

import dataclasses

from ..ir.exprs import LoadKind, LoadStoreOp
from ..ir.tensor import WarpSpecialized
from ..kir import nodes as K
from ..kir.verifier import establishes
from ..kir.rewrite import Rewriter, Substitution, replace_stmt
from .context import LoweringError
from .indexing import scalar_to_kexpr

_BIDX = K.Special("blockIdx.x")
_GDIMX = K.Special("gridDim.x")
_THREAD0 = K.and_(K.and_(K.eq(K.Special("threadIdx.x"), 0), K.eq(K.Special("threadIdx.y"), 0)),
                  K.eq(K.Special("threadIdx.z"), 0))
EPILOGUE = K.CB_EPILOGUE
MAIN_LOOP = K.CB_MAIN_LOOP


@establishes()
def circular_buffer_loops(kernel: K.Kernel) -> K.Kernel:
    loads = tma_loads(kernel.body, [])
    by_loop: dict = {}
    for op, path in loads:
        tv = op.expr.outputs[0]
        opts = tv.circular_buffer_options
        if opts is not None and isinstance(opts.kind, WarpSpecialized):
            continue        # the warp_specialize pass splits it into producer and compute roles
        loop, _, top = load_site(tv, op, path)
        by_loop.setdefault(id(loop), (loop, []))[1].append((tv, op, top))
    for loop, items in by_loop.values():
        _pipeline_loop(kernel, loop, items)
    return kernel


def buffered_loop(tv, op, path):
    """The ForLoop left of tv's compute-at position around its load, and its index in `path`."""
    pos = tv.compute_at_pos
    if pos == 0:
        raise LoweringError(f"T{tv.name}: a circular-buffered or TMA load needs a loop to live "
                            "in (compute-at 0)")
    want = op.nest[pos - 1]
    idx = next((k for k, s in enumerate(path) if isinstance(s, K.ForLoop) and s.loop is want),
               None)
    if idx is None:
        raise LoweringError(f"T{tv.name}: its buffered loop {want!r} is not around its load")
    return path[idx], idx


def check_buffered_loop(tv, loop) -> None:
    if loop.parallel not in ("Serial", "GridStride"):
        raise LoweringError(f"T{tv.name}: the loop left of its compute-at position is "
                            f"{loop.parallel}; circular buffering needs a serial or "
                            "grid-stride loop")


def load_site(tv, op, path) -> tuple:
    """(buffered loop, its index in `path`, the statement of its body that holds the load) for
    a circular-buffered load `op` of tv, the loop checked to be serial or grid-stride."""
    loop, idx = buffered_loop(tv, op, path)
    check_buffered_loop(tv, loop)
    return loop, idx, path[idx + 1] if idx + 1 < len(path) else op


def is_tma_load(s) -> bool:
    """A TensorOp that copies with TMA (it completes on an mbarrier, not in program order)."""
    return (isinstance(s, K.TensorOp) and isinstance(s.expr, LoadStoreOp)
            and s.expr.load_kind.is_tma)


def loads_where(body, is_load, path=()):
    """(load, the statements around it) for every statement of `body` that `is_load` picks."""
    out = []
    for s in body:
        if is_load(s):
            out.append((s, list(path)))
        elif isinstance(s, K.ForLoop):
            out += loads_where(s.body, is_load, [*path, s])
        elif isinstance(s, K.IfThenElse):
            out += (loads_where(s.then_body, is_load, [*path, s])
                    + loads_where(s.else_body, is_load, [*path, s]))
    return out


def tma_loads(body, path):
    """(TMA load, the statements around it) for every TMA load in `body`."""
    return loads_where(body, is_tma_load, path)


@dataclasses.dataclass
class BufferedTensor:
    tv: object
    buf: K.Buffer
    bars: K.MBarriers | None   # None: the stages complete on cp.async groups
    slot_elems: int            # elements from one stage's slot to the next
    issue: list           # statements that issue the copies of one stage (iteration var of L)


def stages_of(loop: K.ForLoop, items) -> tuple[int, int]:
    """(stages, prefetch) shared by the TMA tensors buffered over `loop` (1, 0: not buffered)."""
    stages = {(tv.circular_buffer_options.stages, tv.circular_buffer_options.prefetch)
              if tv.circular_buffer_options else (1, 0) for tv, _, _ in items}
    if len(stages) != 1:
        raise LoweringError(f"the TMA tensors buffered over loop {loop.var!r} ask for different "
                            f"stages/prefetch {sorted(stages)}")
    return stages.pop()


def take_loads(kernel: K.Kernel, loop: K.ForLoop, items, n_stages: int,
               bars_name: str = "pf_mbar_{}") -> list:
    """Remove each TMA load sub-tree from `loop`, turn it into bulk-copy issue statements on a
    new mbarrier array of `n_stages`, and grow its shared buffer to `n_stages` slots."""
    buffered = []
    for tv, op, top in items:
        buf, slot = take_slot(kernel, loop, tv, top, n_stages)
        bars = K.MBarriers(bars_name.format(buf.name), n_stages)
        issue = issue_stmts(kernel, top, tv, bars)
        buffered.append(BufferedTensor(tv, buf, bars, slot, issue))
    return buffered


def take_slot(kernel: K.Kernel, loop: K.ForLoop, tv, top, n_stages: int) -> tuple:
    """Remove tv's load sub-tree `top` from `loop` and grow tv's shared buffer to `n_stages`
    slots: (the buffer, elements from one slot to the next; tensor-map slots are padded to
    128 bytes)."""
    if top not in loop.body:
        raise LoweringError(f"T{tv.name}: its load is not directly in the buffered loop")
    loop.body.remove(top)
    buf = kernel.ctx.buffers[tv]
    if not isinstance(buf.size, K.Const):
        raise LoweringError(f"T{tv.name}: a circular buffer needs a constant slot size")
    slot = buf.size.value
    if tv.definition.load_kind == LoadKind.TmaTensor:
        # Tensor-map destinations are 128-byte aligned: stages start on that boundary.
        align = K.TENSOR_MAP_SMEM_ALIGN
        slot = -(-slot * tv.dtype.size // align) * align // tv.dtype.size
    buf.size = K.Const(slot * n_stages)
    return buf, slot


def trip_count(loop: K.ForLoop):
    """(trips, index_at) of a serial or grid-stride loop: index_at(k) is its index at
    iteration k, start + k * step."""
    if loop.parallel == "GridStride":
        trips = K.Select(K.lt(_BIDX, loop.stop), K.ceil_div(K.sub(loop.stop, _BIDX), _GDIMX),
                         K.Const(0))
        start, step = _BIDX, _GDIMX
    else:
        trips, start, step = (K.ceil_div(K.sub(loop.stop, loop.start), loop.step), loop.start,
                              loop.step)
    return trips, lambda k: K.add(start, K.mul(k, step))


def mark_replaced(kernel: K.Kernel, loop: K.ForLoop, buffered) -> None:
    kernel.replaced_loops.add(id(loop.loop))
    for b in buffered:
        for s in K.walk(b.issue):
            if isinstance(s, K.ForLoop) and s.loop is not None:
                kernel.replaced_loops.add(id(s.loop))


def _pipeline_loop(kernel: K.Kernel, loop: K.ForLoop, items) -> None:
    ctx = kernel.ctx
    n_stages, prefetch = stages_of(loop, items)
    buffered = take_loads(kernel, loop, items, n_stages)
    trips, index_at = trip_count(loop)
    n = K.Var(f"pf_cb_trips_{loop.var.name}")

    def issue_at(k) -> list:
        stage = K.mod(k, n_stages)
        out = []
        for b in buffered:
            for s in b.issue:
                out.append(retarget(s, {loop.var: index_at(k)}, b, stage))
            out.append(K.IfThenElse(_THREAD0, [K.MBarrierArrive(K.MBarrierRef(b.bars, stage))]))
        return out

    def body_at(k, stmts) -> list:
        stage = K.mod(k, n_stages)
        parity = K.mod(K.div(k, n_stages), 2)
        out = [K.ScalarDef(loop.var, index_at(k))]
        out += [K.MBarrierWait(K.MBarrierRef(b.bars, stage), parity) for b in buffered]
        return out + [offset_slots(s, buffered, stage) for s in stmts]

    names = "/".join(f"T{b.tv.name}" for b in buffered)
    prologue = [K.Comment(f"circular buffer of {names}: {n_stages} stage(s), prefetch {prefetch}")]
    for b in buffered:
        prologue.append(K.MBarrierAlloc(b.bars))
    init = [K.MBarrierInit(K.MBarrierRef(b.bars, K.Const(s)), K.Const(1))
            for b in buffered for s in range(n_stages)]
    prologue += [K.IfThenElse(_THREAD0, init + [K.FenceMBarrierInit()]), K.BlockSync(),
                 K.ScalarDef(n, trips)]
    for s in range(prefetch):
        prologue.append(K.IfThenElse(K.lt(K.Const(s), n), issue_at(K.Const(s))))
    k_main = ctx.new_loop_var()
    main_body = issue_at(K.add(k_main, prefetch)) + body_at(k_main, loop.body) + [K.BlockSync()]
    main = K.ForLoop(k_main, K.Const(0), K.sub(n, prefetch), K.Const(1), main_body,
                     label=MAIN_LOOP)
    out = prologue + [main]
    if prefetch:
        k_epi = ctx.new_loop_var()
        first = K.Bin("max", K.sub(n, prefetch), K.Const(0))
        epi_body = body_at(k_epi, loop.body)
        out.append(K.ForLoop(k_epi, first, n, K.Const(1), epi_body,
                             label=EPILOGUE))
    out.append(K.BlockSync())
    out.append(K.IfThenElse(_THREAD0, [K.MBarrierInval(K.MBarrierRef(b.bars, K.Const(s)))
                                       for b in buffered for s in range(n_stages)]))
    mark_replaced(kernel, loop, buffered)
    if not replace_stmt(kernel.body, loop, out):
        raise LoweringError(f"loop {loop.var!r} vanished from the kernel")
    kernel.circular_buffers += [(b.buf.name, n_stages, prefetch, "pipelined") for b in buffered]


def issue_stmts(kernel, top, tv, bars) -> list:
    """The load sub-tree as copy statements on `bars[0]` (retargeted per iteration later)."""
    if tv.definition.load_kind == LoadKind.TmaTensor:
        return _tensor_map_issue(kernel, top, tv, bars)
    return _bulk_issue(kernel, top, tv, bars)


def _tensor_map_issue(kernel, top, tv, bars) -> list:
    """The load sub-tree as TensorMapLoads of the whole slot: every loop of the sub-tree must be
    a Bulk axis (boxes move them all), and the slot must hold whole rows of the source, as a
    RowBoxMap describes them; one box per stage, or several when a stage has over 256 rows.
    The copy's bounds predicates are dropped: rows past the tensor are zero-filled by the
    hardware and counted in the box's bytes; only the thread election stays."""
    op, loops = top, []
    while isinstance(op, K.ForLoop):
        if op.parallel != "Bulk" or len(op.body) != 1:
            raise LoweringError(f"T{tv.name}: a tensor-map load needs all its axes Bulk (one box "
                                f"per stage), not {op.parallel} loop {op.var!r}")
        loops.append(op)
        op = op.body[0]
    if not is_tma_load(op) or op.expr.outputs[0] is not tv:
        raise LoweringError(f"T{tv.name}: its load loop holds {type(op).__name__}, not only the "
                            "tensor-map copy")
    src_tv = op.expr.inputs[0]
    src = op.ins[0]
    if src_tv not in kernel.fusion.inputs:
        raise LoweringError(f"T{tv.name}: a tensor-map load reads a fusion input, not "
                            f"T{src_tv.name}")
    logical = [i for i in src_tv.domain.logical_no_reductions]
    row_extent = scalar_to_kexpr(logical[-1].extent, kernel.ctx.names)
    if not isinstance(row_extent, K.Const):
        raise LoweringError(f"T{tv.name}: a tensor-map load needs a constant row length "
                            "(specialize the kernel on it)")
    n = row_extent.value
    elems = 1
    for lp in loops:
        if not isinstance(lp.stop, K.Const):
            raise LoweringError(f"T{tv.name}: Bulk axis {lp.var!r} needs a constant extent")
        elems *= lp.stop.value
        kernel.replaced_loops.add(id(lp.loop))
    slot = elems
    if slot % n:
        raise LoweringError(f"T{tv.name}: its slot of {slot} elements (the Bulk axes) is not "
                            f"whole rows of {n}")
    inner = K.RowBoxMap.inner_for(n, tv.dtype.size)
    if inner is None:
        raise LoweringError(f"T{tv.name}: a row of {n} x {tv.dtype.size} bytes has no tensor-map "
                            "box split (pieces of at most 256 elements and a multiple of 16 bytes)")
    k = kernel.fusion.input_position(src_tv)
    rows = slot // n
    # A box has at most 256 rows: a stage of more is several boxes of an equal row count.
    box_rows = max(d for d in range(1, min(rows, 256) + 1) if rows % d == 0)
    row_map = K.RowBoxMap(k, n, inner, box_rows)
    name = f"{src.buffer.name}_tmap"
    if name not in kernel.tensor_maps:
        kernel.params.append(K.Param(name, "tmap", ("tmap", row_map)))
        kernel.tensor_maps[name] = row_map
    elif kernel.tensor_maps[name] != row_map:
        raise LoweringError(f"{src.buffer.name} is loaded through two different tensor maps")
    ig = kernel.ctx.index_graph
    row: K.KExpr = K.Const(0)
    for i in logical[:-1]:          # the row: outer indices linearized, row-major
        if i.is_broadcast:
            continue
        at = ig.index_of(op.known, i)
        if at is None:
            raise LoweringError(f"T{tv.name}: no index for {i!r} of its tensor-map source")
        row = K.add(K.mul(row, scalar_to_kexpr(i.extent, kernel.ctx.names)), at.value)
    box_bytes = K.Const(box_rows * n * tv.dtype.size)
    return [K.TensorMapLoad(dataclasses.replace(op.out, index=K.add(op.out.index, b * box_rows * n)),
                            K.Var(name), row_map, src.buffer,
                            [K.Const(0), K.Const(0), K.add(row, b * box_rows)], box_bytes,
                            K.MBarrierRef(bars, K.Const(0)), _THREAD0)
            for b in range(rows // box_rows)]


def _bulk_issue(kernel, top, tv, bars) -> list:
    """The load sub-tree as BulkLoads: bulk loops dropped (one copy moves the axis), the TMA
    TensorOps become copies of the bulk axis' bytes."""
    def convert(s, bulk_stop=None):
        if isinstance(s, K.TensorOp):
            if not (isinstance(s.expr, LoadStoreOp) and s.expr.outputs[0] is tv):
                raise LoweringError(f"T{tv.name}: its load loop also computes "
                                    f"{s.expr.outputs[0]!r}; the TMA load needs loops of its own")
            if bulk_stop is None:
                raise LoweringError(f"T{tv.name}: a 1D bulk copy needs a Bulk axis")
            if not isinstance(bulk_stop, K.Const):
                raise LoweringError(f"T{tv.name}: the bulk axis needs a constant extent, not "
                                    f"{bulk_stop!r} (specialize the kernel on it)")
            nbytes = bulk_stop.value * tv.dtype.size
            if nbytes % 16:
                raise LoweringError(f"T{tv.name}: a bulk copy of {nbytes} bytes is not a multiple "
                                    "of 16 bytes")
            kernel.bulk_sources.add(s.ins[0].buffer.name)
            return [K.BulkLoad(s.out, s.ins[0], K.Const(nbytes), K.MBarrierRef(bars, K.Const(0)),
                               s.predicate)]
        if isinstance(s, K.ForLoop):
            if s.parallel == "Bulk":
                kernel.replaced_loops.add(id(s.loop))
                if bulk_stop is not None:
                    raise LoweringError(f"T{tv.name}: a 1D bulk copy has one Bulk axis")
                return [x for c in s.body for x in convert(c, s.stop)]
            return [dataclasses.replace(s, body=[x for c in s.body for x in convert(c, bulk_stop)])]
        if isinstance(s, (K.Allocate, K.Comment)):
            return [s]
        raise LoweringError(f"T{tv.name}: unexpected {type(s).__name__} in its load loop")
    return convert(top)


def retarget(s, mapping, b: BufferedTensor, stage):
    """A copy of an issue statement for one iteration: loop index substituted, copy into the
    iteration's slot, completing on the slot's barrier (bulk copies)."""
    return _IssueAt(mapping, b, stage).stmt(s)


class _IssueAt(Substitution):
    def __init__(self, mapping, b: BufferedTensor, stage):
        super().__init__(mapping)
        self.b, self.stage = b, stage

    def into_slot(self, s, **changes):
        s = self.default_stmt(s)
        dst = dataclasses.replace(s.dst, index=K.add(s.dst.index,
                                                     K.mul(self.stage, self.b.slot_elems)))
        return dataclasses.replace(s, dst=dst, **changes)

    def visit_BulkLoad(self, s):
        return self.into_slot(s, bar=K.MBarrierRef(self.b.bars, self.stage))

    visit_TensorMapLoad = visit_BulkLoad

    def visit_CpAsyncCopy(self, s):
        return self.into_slot(s)

    def visit_ForLoop(self, s):
        # Issued once per iteration (prologue and main loop): no longer one lowering loop.
        return dataclasses.replace(self.default_stmt(s), loop=None)


def offset_slots(s, buffered, stage):
    """Reads of a buffered tensor address the iteration's slot."""
    return _SlotOffsets({id(b.buf): b.slot_elems for b in buffered}, stage).stmt(s)


class _SlotOffsets(Rewriter):
    def __init__(self, slots: dict, stage):
        self.slots, self.stage = slots, stage

    def tensor_index(self, t):
        t = self.default_expr(t)
        slot = self.slots.get(id(t.buffer))
        if slot is None:
            return t
        return dataclasses.replace(t, index=K.add(t.index, K.mul(self.stage, slot)))

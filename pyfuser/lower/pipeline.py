"""Pass `pipeline_loads`: asynchronous loads into circular buffers, one mechanism for every kind.

A load is asynchronous when its copy completes out of program order: a TMA copy (1D bulk rows,
LoadKind.Tma, or tensor-map boxes, LoadKind.TmaTensor) completes on an mbarrier, a cp.async copy
(LoadKind.CpAsync) at a wait_group. The schedule describes the pipeline on the loaded shared
tensor (schedule/circular_buffer.py): the buffered loop is the loop left of its compute-at
position; `stages` slots, `prefetch` iterations issued ahead, and a kind:

- PipelinedBuffer (TMA) and CpAsyncPipelined (cp.async): the threads that compute issue the
  copies themselves, `prefetch` iterations ahead;
- WarpSpecialized: a producer role (one elected thread of its own warp group) issues the copies
  of every iteration; `compute_roles` compute roles take the iterations in turn.

Before (T14 a shared slot loaded in the buffered loop L, read later in the same iteration):

    for j in L:                                   # e.g. grid-stride over row groups
      for r in 0..R: for b in Bulk[0, N):  T14[r * N] = T0[(j * R + r) * s0]     (one thread)
      ... = T14[ty * N + ...]                     # consumers

The iterations of L are counted k = 0 .. n - 1 (n its trip count; j = start + k * step), the
stage of iteration k is slot k % S with phase parity (k / S) & 1, and every read of T14 in L's
body is offset to the iteration's slot. The copies of one iteration ("issue(k)") are the load
sub-tree with its loops of copies kept (cp.async), dropped into one copy per row (1D bulk) or
into boxes of whole rows (tensor map), L's index substituted.

After, one role (S stages, P = prefetch):

    setup;  n = trips(L)
    for s < P:  { if (s < n) issue(s); commit }   # prologue (unrolled)
    for k in [0, n - P):                          # main loop
      issue(k + P); commit; acquire(k); body(k); release
    for k in [max(n - P, 0), n):                  # epilogue: issues nothing
      commit; acquire(k); body(k)
    teardown

with, by how a stage completes (`_MBarrierStages`, `_CpAsyncGroups`):

    TMA:      setup = mbarriers mbar[S] initialized by thread 0, __syncthreads;
              issue(k) ends with thread 0's arrive on mbar[k % S] (after its expect_tx per copy);
              commit = nothing; acquire(k) = j = ...; wait(mbar[k % S], (k / S) & 1);
              release = __syncthreads (every thread is done with slot k % S before iteration
              k + 1 issues into it: P = S - 1); teardown = __syncthreads, invalidate.
    cp.async: commit = cp.async.commit_group (an empty group too: the count stays uniform);
              acquire(k) = wait_group(P), then j = ...; release = nothing when each thread reads
              only what it copied itself (proved from the loop mapping: `cross_thread_reads`),
              else a block barrier after the wait (RAW) and at the end of the iteration (WAR).

Warp-specialized (R compute roles; the chain is L and the serial or grid-stride loops around it
up to the kernel's top level, L0 outermost, k_i counting loop i's iterations; the stage counter
c = linear(k_0, ..., k_d) runs across the whole chain, so a persistent tile loop around a k loop
never drains the pipeline between tiles):

    mbarriers full[S] (1 arrival + the bytes of every buffered tensor's copies), empty[S] (one
    role's threads; its warp groups when only wgmma reads the slots)
    split of the block along threadIdx.y:
    producer (threadIdx.y >= R * By):
      setmaxnreg.dec(Rp)
      if (elected thread) for k_0: ... for k_d:   # the chain's loops, copies only
        if (c >= S) wait(empty[c % S], (c / S + 1) & 1); issue(c) into slot c % S (each
        copy raising full[c % S]'s bytes); arrive(full[c % S])
    compute role r (threadIdx.y in [r * By, (r + 1) * By), seen as threadIdx.y - r * By):
      setmaxnreg.inc(Rc)
      <statements around L0>
      for k_0 in [r, n_0) step R:                 # the role's share of the outer iterations
        j_0 = start_0 + k_0 * step_0; <L0's body, its inner chain loops counted the same way>
          [R > 1: wait for the turn (bar.sync) unless k_0 == 0]
          wait(full[c % S], (c / S) & 1); body(c); arrive(empty[c % S])
          [R > 1: hand the turn to role r + 1 (bar.arrive) if k_0 + 1 < n_0]
    teardown: __syncthreads; invalidate

With R > 1 (ping-pong) the roles' ordered sections alternate through named barriers: role r's
section of outer iteration k_0 runs after role r - 1's section of k_0 - 1; what follows a section
(a tile's epilogue, a row's stores) overlaps the next role's section. The section is, in L0's
body, the statements from the first that waits for a slot (with L nested, the inner loop) to
the last before the first that writes global memory; the slot's release moves right after the
last statement that reads it.
Each compute role's block barriers are its own named barrier (`WarpRole.barrier`: insert_syncs
and the block reductions use it).

Register split: `__launch_bounds__(all threads, 1)` gives each thread R0 = 65536 / threads
registers at entry (rounded down to 8); the producer decreases to Rp (default 40, 24 when it
spans several warp groups), compute increases to Rc (default: what is left, at most 240).
Rp <= R0 <= Rc and Rp * producer threads + Rc * compute threads <= R0 * threads are checked
here: setmaxnreg.inc waits forever for registers the pool does not have (seen: 640 threads).

Placed copies: a TensorMapLoad a lowering pass built directly in its buffered loop with no
barrier yet (lower/matmul.py's operand boxes, several per slot) is buffered like the copies
made from a TensorOp's load, by its destination tensor's circular buffer. Where only wgmma
reads the slots, each compute warp group releases a slot with one arrival, and a body that ends
with wgmma.wait_group(P) releases slot c after iteration c + P's wait (`release_lag`), the last
P slots of a nested loop after a wait_group(0) following it. With R > 1 compute roles, each
role gets its own copy of the shared buffers it writes (`role_written_shared`), and in a nested
chain a role's ordered section ends at the slots' last release (a matmul tile's k loop: its
epilogue overlaps the next role's k loop).

Multicast copies (a TensorMapLoad of multicast C: lower/matmul.py's B share in a cluster of C
CTAs): each CTA's producer fills the slot in all C CTAs, so empty[S] counts the releases of
the whole cluster's compute warp groups (each releases its slot in every CTA of the cluster,
mbarrier arrivals through mapa), and the setup's and teardown's block barriers are cluster
barriers (every CTA's barriers initialized before a peer signals them; no CTA gone while a
peer may still arrive on its barriers).

An unbuffered TMA load is the pipelined kind with S = 1, P = 0 (issue, wait, use); an
unbuffered cp.async load is lowered where it stands: copies, commit, wait_group(0), with block
barriers before the copies and after the wait when threads read each other's copies.

Limitations: the loads buffered over one loop share stages, prefetch and kind (TMA and cp.async
not mixed); the load sub-tree holds only the copies (and their loops); the one-role kinds pipeline
L alone (a loop around L starts and drains the pipeline at each of its iterations), and the
warp-specialized chain must be rectangular (an inner loop's trips do not depend on outer
indices) or a nest of two whose inner loop names its `count_before` (its iterations in the
outer loop's earlier iterations: the stage counter is count_before + k; one compute role), and
start at the kernel's top level; the split is along threadIdx.y, with blockDim.z 1,
the compute rows times threadIdx.x and the producer rows each whole warp groups; multicast
copies of one cluster size, the cluster along x; no cluster or grid reduction, no
block-shared accumulator in a compute role; with R > 1 compute roles, no
reduction or barrier across threadIdx.y, shared tensors written in a role of constant size
(each role its copy), and no grid barrier.
"""
from __future__ import annotations

import dataclasses

from ..ir.exprs import LoadKind, LoadStoreOp
from ..ir.iter_domain import ParallelType as PT
from ..ir.tensor import CpAsyncPipelined, WarpSpecialized
from ..kir import nodes as K
from ..kir.registers import check_register_counts, default_register_split
from ..kir.rewrite import (Rewriter, Substitution, accesses, fresh_stmts, replace_stmt, subexprs,
                           substitute_stmts, vars_in, vars_read)
from ..kir.verifier import Rule, establishes
from .context import LoweringError
from .index import reader_index
from .indexing import bound_extents, scalar_to_kexpr

WARP_GROUP = 128
CP_ASYNC_BYTES = (4, 8, 16)
MAIN_LOOP = K.CB_MAIN_LOOP
EPILOGUE = K.CB_EPILOGUE
_TIDX, _TIDY, _TIDZ = (K.Special(f"threadIdx.{d}") for d in "xyz")
_BIDX, _GDIMX = K.Special("blockIdx.x"), K.Special("gridDim.x")
_THREAD0 = K.and_(K.and_(K.eq(_TIDX, 0), K.eq(_TIDY, 0)), K.eq(_TIDZ, 0))
# The elected producer thread issues the copies the schedule gave to "thread 0" of the load.
_AS_THREAD0 = {_TIDX: K.Const(0), _TIDY: K.Const(0), _TIDZ: K.Const(0)}
_THREAD_DIMS = {PT.TIDx: "threadIdx.x", PT.TIDy: "threadIdx.y", PT.TIDz: "threadIdx.z"}


def is_tma_load(s) -> bool:
    """A TensorOp that copies with TMA (it completes on an mbarrier, not in program order)."""
    return (isinstance(s, K.TensorOp) and isinstance(s.expr, LoadStoreOp)
            and s.expr.load_kind.is_tma)


def is_cp_async_load(s) -> bool:
    return (isinstance(s, K.TensorOp) and isinstance(s.expr, LoadStoreOp)
            and s.expr.load_kind == LoadKind.CpAsync)


def _no_cp_async_op(v, s, scope) -> None:
    if is_cp_async_load(s) or is_tma_load(s):
        v.fail("an asynchronous load is still a TensorOp after pipeline_loads", s)


# Asynchronous loads are copy statements (bulk, tensor-map, cp.async) with their barriers or
# groups, no longer TensorOps.
ASYNC_LOADS_LOWERED = Rule("asynchronous loads lowered", stmt=_no_cp_async_op)


@establishes(ASYNC_LOADS_LOWERED)
def pipeline_loads(kernel: K.Kernel) -> K.Kernel:
    groups: dict = {}
    for op, path in loads_where(kernel.body, lambda s: is_tma_load(s) or is_cp_async_load(s)):
        tv = op.expr.outputs[0]
        if is_cp_async_load(op) and tv.circular_buffer_options is None:
            continue        # lowered where it stands, below
        loop, idx, top = load_site(tv, op, path)
        groups.setdefault(id(loop), (loop, path[:idx + 1], []))[2].append((tv, op, top))
    for op, path in loads_where(kernel.body, is_placed_copy):
        loop, idx, tv = placed_site(op, path)
        groups.setdefault(id(loop), (loop, path[:idx + 1], []))[2].append((tv, op, op))
    kinds = {key: _kind_of(loop, items) for key, (loop, _, items) in groups.items()}
    # TMA pipelines first, then cp.async loads (in place and pipelined), then warp roles: the
    # order the statements' new loop variables are numbered in.
    for key, (loop, _, items) in groups.items():
        if kinds[key] == "tma":
            _pipeline_loop(kernel, loop, items, _MBarrierStages(kernel, loop, items))
    for op, path in loads_where(kernel.body, is_cp_async_load):
        if op.expr.outputs[0].circular_buffer_options is None:
            _cp_async_in_place(kernel, op.expr.outputs[0], op, path)
    for key, (loop, _, items) in groups.items():
        if kinds[key] == "cp.async":
            _pipeline_loop(kernel, loop, items, _CpAsyncGroups(kernel, loop, items))
    specialized = [(loop, chain, items) for key, (loop, chain, items) in groups.items()
                   if kinds[key] == "warp_specialized"]
    if len(specialized) > 1:
        raise LoweringError("warp-specialized tensors buffered over two different loops")
    for loop, chain, items in specialized:
        _warp_specialize(kernel, chain, items)
    return kernel


def is_placed_copy(s) -> bool:
    """A tensor-map copy a lowering pass built in its buffered loop, its barrier not yet given
    (lower/matmul.py's operand tiles): pipeline_loads buffers it as the copies it makes from a
    TensorOp's load."""
    return isinstance(s, K.TensorMapLoad) and s.bar is None


def placed_site(op: K.TensorMapLoad, path) -> tuple:
    """(buffered loop, its index in `path`, the tensor) of a placed copy: the loop right around
    it, which must be serial or grid-stride; the tensor is its destination's, with the circular
    buffer the schedule gave it."""
    tv = op.dst.buffer.tv
    if tv is None or tv.circular_buffer_options is None:
        raise LoweringError(f"the tensor-map copy into {op.dst.buffer.name} has no barrier and "
                            "no circular buffer to give it one")
    idx = len(path) - 1
    if idx < 0 or not isinstance(path[idx], K.ForLoop) \
            or path[idx].parallel not in ("Serial", "GridStride"):
        raise LoweringError(f"T{tv.name}: its tensor-map copy is not directly in a serial or "
                            "grid-stride loop")
    return path[idx], idx, tv


def _kind_of(loop: K.ForLoop, items) -> str:
    kinds = set()
    for tv, op, _ in items:
        opts = tv.circular_buffer_options
        if opts is not None and isinstance(opts.kind, WarpSpecialized):
            if not (is_tma_load(op) or is_placed_copy(op)):
                raise LoweringError(f"T{tv.name}: warp specialization fills its stages with TMA "
                                    "copies, not cp.async")
            kinds.add("warp_specialized")
        elif is_cp_async_load(op):
            if not isinstance(opts.kind, CpAsyncPipelined):
                raise LoweringError(f"T{tv.name}: a cp.async load is circular-buffered with the "
                                    f"CpAsyncPipelined kind, not {type(opts.kind).__name__}")
            kinds.add("cp.async")
        else:
            kinds.add("tma")
    if len(kinds) != 1:
        raise LoweringError(f"the loads buffered over loop {loop.var!r} mix kinds "
                            f"{sorted(kinds)}; one loop pipelines one kind")
    return kinds.pop()


# Where loads are ---------------------------------------------------------------------------------
def loads_where(body, is_load, path=()):
    """(load, the statements around it) for every statement of `body` that `is_load` picks."""
    out = []
    for s in body:
        if is_load(s):
            out.append((s, list(path)))
            continue
        for f, role in K.STMT_KINDS[type(s)].items():
            if role == K.BODY:
                out += loads_where(getattr(s, f), is_load, [*path, s])
    return out


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


def load_site(tv, op, path) -> tuple:
    """(buffered loop, its index in `path`, the statement of its body that holds the load) for
    a circular-buffered load `op` of tv, the loop checked to be serial or grid-stride."""
    loop, idx = buffered_loop(tv, op, path)
    if loop.parallel not in ("Serial", "GridStride"):
        raise LoweringError(f"T{tv.name}: the loop left of its compute-at position is "
                            f"{loop.parallel}; circular buffering needs a serial or "
                            "grid-stride loop")
    return loop, idx, path[idx + 1] if idx + 1 < len(path) else op


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


# The buffered tensors --------------------------------------------------------------------------
@dataclasses.dataclass
class BufferedTensor:
    tv: object
    buf: K.Buffer
    bars: K.MBarriers | None   # None: the stages complete on cp.async groups
    slot_elems: int            # elements from one stage's slot to the next
    issue: list           # statements that issue the copies of one stage (iteration var of L)


def stages_of(loop: K.ForLoop, items) -> tuple[int, int]:
    """(stages, prefetch) shared by the tensors buffered over `loop` (1, 0: not buffered)."""
    stages = {(tv.circular_buffer_options.stages, tv.circular_buffer_options.prefetch)
              if tv.circular_buffer_options else (1, 0) for tv, _, _ in items}
    if len(stages) != 1:
        raise LoweringError(f"the tensors buffered over loop {loop.var!r} ask for different "
                            f"stages/prefetch {sorted(stages)}")
    return stages.pop()


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
        # Tensor-map destinations are 128-byte aligned (1024 for swizzled boxes: the buffer's
        # own alignment): stages start on that boundary.
        align = max(K.TENSOR_MAP_SMEM_ALIGN, buf.align)
        slot = -(-slot * tv.dtype.size // align) * align // tv.dtype.size
    buf.size = K.Const(slot * n_stages)
    return buf, slot


def take_tma_loads(kernel: K.Kernel, loop: K.ForLoop, items, n_stages: int,
                   bars_name: str) -> list:
    """Remove each TMA load sub-tree from `loop`, turn it into copy statements on a new
    mbarrier array of `n_stages`, and grow its shared buffer to `n_stages` slots."""
    buffered = []
    placed: dict = {}
    for tv, op, top in items:
        if is_placed_copy(top) and id(tv) in placed:
            # Another copy into the same slot (a stage of several boxes): issued with the first.
            loop.body.remove(top)
            placed[id(tv)].issue.append(top)
            continue
        buf, slot = take_slot(kernel, loop, tv, top, n_stages)
        bars = K.MBarriers(bars_name.format(buf.name), n_stages)
        if is_placed_copy(top):
            issue = [top]
        elif tv.definition.load_kind == LoadKind.TmaTensor:
            issue = _tensor_map_issue(kernel, top, tv, bars)
        else:
            issue = _BulkCopies(kernel, tv, bars).rewrite([top])
        buffered.append(BufferedTensor(tv, buf, bars, slot, issue))
        if is_placed_copy(top):
            placed[id(tv)] = buffered[-1]
    return buffered


def mark_replaced(kernel: K.Kernel, loops, buffered) -> None:
    """The buffered loops and the load loops the copies replaced are no longer emitted."""
    kernel.replaced_loops.update(id(lp.loop) for lp in loops)
    for b in buffered:
        for s in K.walk(b.issue):
            if isinstance(s, K.ForLoop) and s.loop is not None:
                kernel.replaced_loops.add(id(s.loop))


class _BulkCopies(Rewriter):
    """A TMA load sub-tree as BulkLoads: the Bulk loop dropped (one copy moves the axis), the
    TMA TensorOps become copies of the Bulk axis' bytes."""

    def __init__(self, kernel, tv, bars):
        self.kernel, self.tv, self.bars = kernel, tv, bars
        self.bulk_stop = None

    def default_stmt(self, s):
        raise LoweringError(f"T{self.tv.name}: unexpected {type(s).__name__} in its load loop")

    def visit_Allocate(self, s):
        return s

    visit_Comment = visit_Allocate

    def visit_ForLoop(self, s):
        if s.parallel != "Bulk":
            return dataclasses.replace(s, body=self.rewrite(s.body))
        self.kernel.replaced_loops.add(id(s.loop))
        if self.bulk_stop is not None:
            raise LoweringError(f"T{self.tv.name}: a 1D bulk copy has one Bulk axis")
        self.bulk_stop = s.stop
        try:
            return self.rewrite(s.body)
        finally:
            self.bulk_stop = None

    def visit_TensorOp(self, s):
        tv = self.tv
        if not (isinstance(s.expr, LoadStoreOp) and s.expr.outputs[0] is tv):
            raise LoweringError(f"T{tv.name}: its load loop also computes "
                                f"{s.expr.outputs[0]!r}; the TMA load needs loops of its own")
        if self.bulk_stop is None:
            raise LoweringError(f"T{tv.name}: a 1D bulk copy needs a Bulk axis")
        if not isinstance(self.bulk_stop, K.Const):
            raise LoweringError(f"T{tv.name}: the bulk axis needs a constant extent, not "
                                f"{self.bulk_stop!r} (specialize the kernel on it)")
        nbytes = self.bulk_stop.value * tv.dtype.size
        if nbytes % 16:
            raise LoweringError(f"T{tv.name}: a bulk copy of {nbytes} bytes is not a multiple "
                                "of 16 bytes")
        self.kernel.bulk_sources.add(s.ins[0].buffer.name)
        return K.BulkLoad(s.out, s.ins[0], K.Const(nbytes), K.MBarrierRef(self.bars, K.Const(0)),
                          s.predicate)


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


class _CpAsyncCopies(Rewriter):
    """A cp.async load sub-tree with its TensorOps as CpAsyncCopy (loops kept)."""

    def __init__(self, tv):
        self.tv = tv

    def default_stmt(self, s):
        raise LoweringError(f"T{self.tv.name}: unexpected {type(s).__name__} in its cp.async "
                            "load loop")

    def visit_Allocate(self, s):
        return s

    visit_Comment = visit_Allocate

    def visit_ForLoop(self, s):
        return dataclasses.replace(s, body=self.rewrite(s.body))

    def visit_IfThenElse(self, s):
        return dataclasses.replace(s, then_body=self.rewrite(s.then_body),
                                   else_body=self.rewrite(s.else_body))

    def visit_TensorOp(self, s):
        tv = self.tv
        if not (is_cp_async_load(s) and s.expr.outputs[0] is tv):
            raise LoweringError(f"T{tv.name}: its load loop also computes "
                                f"{s.expr.outputs[0]!r}; the cp.async load needs loops of its own")
        nbytes = s.vector * s.out.buffer.dtype.size
        if nbytes not in CP_ASYNC_BYTES:
            raise LoweringError(f"T{tv.name}: a cp.async copy moves 4, 8 or 16 bytes, not "
                                f"{s.vector} x {s.out.buffer.dtype.size} (vectorize the "
                                "load's innermost axis)")
        return K.CpAsyncCopy(s.out, s.ins[0], nbytes, s.predicate)


# One iteration's statements --------------------------------------------------------------------
class _IssueAt(Substitution):
    """An issue statement for one iteration: loop indices substituted, the copy into the
    iteration's slot, completing on the slot's mbarrier."""

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


def issue_at(buffered, mapping, stage) -> list:
    """The copies of every buffered tensor for one iteration (`mapping`: loop indices)."""
    return [_IssueAt(mapping, b, stage).stmt(s) for b in buffered for s in b.issue]


class _SlotOffsets(Rewriter):
    """Every access to a buffered tensor addresses the iteration's slot."""

    def __init__(self, buffered, stage):
        self.slots = {id(b.buf): b.slot_elems for b in buffered}
        self.stage = stage

    def tensor_index(self, t):
        t = self.default_expr(t)
        slot = self.slots.get(id(t.buffer))
        if slot is None:
            return t
        return dataclasses.replace(t, index=K.add(t.index, K.mul(self.stage, slot)))


def offset_slots(stmts, buffered, stage) -> list:
    return _SlotOffsets(buffered, stage).rewrite(stmts)


# One role: the computing threads issue their own copies ----------------------------------------
class _MBarrierStages:
    """TMA copies: a stage completes on its mbarrier (thread 0 arrives after raising the
    expected bytes per copy); a block barrier ends each iteration before the next refills a
    slot."""

    trips_name = "pf_cb_trips_{}"
    kind = "pipelined"

    def __init__(self, kernel, loop, items):
        self.stages, self.prefetch = stages_of(loop, items)
        self.buffered = take_tma_loads(kernel, loop, items, self.stages, "pf_mbar_{}")

    def setup(self) -> list:
        b = self.buffered
        names = "/".join(f"T{x.tv.name}" for x in b)
        out = [K.Comment(f"circular buffer of {names}: {self.stages} stage(s), prefetch "
                         f"{self.prefetch}")]
        out += [K.MBarrierAlloc(x.bars) for x in b]
        init = [K.MBarrierInit(K.MBarrierRef(x.bars, K.Const(s)), K.Const(1))
                for x in b for s in range(self.stages)]
        return out + [K.IfThenElse(_THREAD0, init + [K.FenceMBarrierInit()]), K.BlockSync()]

    def issue(self, mapping, stage) -> list:
        out = []
        for b in self.buffered:
            out += issue_at([b], mapping, stage)
            out.append(K.IfThenElse(_THREAD0, [K.MBarrierArrive(K.MBarrierRef(b.bars, stage))]))
        return out

    def commit(self) -> list:
        return []

    def acquire(self, k, index_def) -> list:
        stage, parity = K.mod(k, self.stages), K.mod(K.div(k, self.stages), 2)
        return [index_def] + [K.MBarrierWait(K.MBarrierRef(b.bars, stage), parity)
                              for b in self.buffered]

    def release(self) -> list:
        return [K.BlockSync()]

    def teardown(self) -> list:
        return [K.BlockSync(),
                K.IfThenElse(_THREAD0, [K.MBarrierInval(K.MBarrierRef(b.bars, K.Const(s)))
                                        for b in self.buffered for s in range(self.stages)])]


class _CpAsyncGroups:
    """cp.async copies: each stage is one cp.async group of every thread; block barriers only
    when threads read each other's copies."""

    trips_name = "pf_cp_trips_{}"
    kind = "cp.async"

    def __init__(self, kernel, loop, items):
        self.stages, self.prefetch = stages_of(loop, items)
        self.buffered, self.why = [], []
        for tv, op, top in items:
            buf = kernel.ctx.buffers[tv]
            reason = cross_thread_reads(kernel, tv, readers(loop.body, buf))
            if readers(kernel.body, buf) != readers(loop.body, buf):
                raise LoweringError(f"T{tv.name} is read outside its buffered loop {loop.var!r}")
            if reason:
                self.why.append(reason)
            buf, slot = take_slot(kernel, loop, tv, top, self.stages)
            self.buffered.append(BufferedTensor(tv, buf, None, slot,
                                                _CpAsyncCopies(tv).rewrite([top])))

    def setup(self) -> list:
        names = "/".join(f"T{b.tv.name}" for b in self.buffered)
        return [K.Comment(f"cp.async circular buffer of {names}: {self.stages} stage(s), "
                          f"prefetch {self.prefetch}; one cp.async group per stage")]

    def after_trips(self) -> list:
        if not self.why:
            return []
        return [K.Comment("read across threads (" + "; ".join(self.why) + "): block barriers "
                          "after each wait and at the end of each main-loop iteration")]

    def issue(self, mapping, stage) -> list:
        return issue_at(self.buffered, mapping, stage)

    def commit(self) -> list:
        return [K.CpAsyncCommit()]

    def acquire(self, k, index_def) -> list:
        return [K.CpAsyncWait(self.prefetch)] + ([K.BlockSync()] if self.why else []) + [index_def]

    def release(self) -> list:
        return [K.BlockSync()] if self.why else []

    def teardown(self) -> list:
        return []


def _pipeline_loop(kernel: K.Kernel, loop: K.ForLoop, items, stages) -> None:
    ctx = kernel.ctx
    n_stages, prefetch = stages.stages, stages.prefetch
    trips, index_at = trip_count(loop)
    n = K.Var(stages.trips_name.format(loop.var.name))

    def issue(k) -> list:
        return stages.issue({loop.var: index_at(k)}, K.mod(k, n_stages))

    def body_at(k) -> list:
        acquire = stages.acquire(k, K.ScalarDef(loop.var, index_at(k)))
        return acquire + offset_slots(loop.body, stages.buffered, K.mod(k, n_stages))

    out = stages.setup() + [K.ScalarDef(n, trips)]
    out += getattr(stages, "after_trips", list)()
    for s in range(prefetch):
        out += [K.IfThenElse(K.lt(K.Const(s), n), issue(K.Const(s)))] + stages.commit()
    k_main = ctx.new_loop_var()
    main_body = issue(K.add(k_main, prefetch)) + stages.commit() + body_at(k_main)
    main_body += stages.release()
    out.append(K.ForLoop(k_main, K.Const(0), K.sub(n, prefetch), K.Const(1), main_body,
                         label=MAIN_LOOP))
    if prefetch:
        k_epi = ctx.new_loop_var()
        first = K.Bin("max", K.sub(n, prefetch), K.Const(0))
        out.append(K.ForLoop(k_epi, first, n, K.Const(1), stages.commit() + body_at(k_epi),
                             label=EPILOGUE))
    out += stages.teardown()
    mark_replaced(kernel, [loop], stages.buffered)
    if not replace_stmt(kernel.body, loop, out):
        raise LoweringError(f"loop {loop.var!r} vanished from the kernel")
    kernel.circular_buffers += [(b.buf.name, n_stages, prefetch, stages.kind)
                                for b in stages.buffered]


# cp.async: who reads what ------------------------------------------------------------------------
def readers(body, buf) -> list:
    """TensorOps of `body` that read buffer `buf`."""
    return [s for s in K.walk(body) if isinstance(s, K.TensorOp)
            and any(isinstance(i, K.TensorIndex) and i.buffer is buf for i in s.ins)]


def cross_thread_reads(kernel: K.Kernel, tv, ops) -> str | None:
    """Why a reader in `ops` may read an element of tv that another thread copied, or None when
    the loop mapping proves that no thread does: every thread dim of the block with an extent
    above 1 is bound to exactly one allocated ID of tv, which the copy indexes by that
    threadIdx (its own loop) and every reader indexes by the same threadIdx."""
    ctx = kernel.ctx
    by_dim: dict = {}
    for i, _, lp in ctx.alloc_ids[tv]:
        if lp is not None and lp.parallel in _THREAD_DIMS:
            by_dim.setdefault(lp.parallel, []).append((i, lp))
    for pt, special in _THREAD_DIMS.items():
        if bound_extents(ctx, {pt}) <= {1}:
            continue        # one thread along this dim
        held = by_dim.get(pt, [])
        if len(held) != 1:
            return (f"{len(held)} allocated IDs of T{tv.name} are bound to {special} "
                    "(threads along it share elements)")
        i, lp = held[0]
        if not (isinstance(lp.var, K.Special) and lp.var.name == special):
            return f"the copy of T{tv.name} does not index {i!r} by {special}"
        for op in ops:
            consumer = op.expr.outputs[0]
            index_of = reader_index(ctx, tv, op.nest, consumer, op.known)
            got = index_of(i, lp)
            if not (isinstance(got, K.Special) and got.name == special):
                return (f"T{consumer.name} reads T{tv.name} along {i!r} at {got!r}, not at "
                        f"{special}")
    return None


def _cp_async_in_place(kernel: K.Kernel, tv, op, path) -> None:
    """An unbuffered cp.async load: its copies, commit, wait for all, where it stood."""
    pos = tv.compute_at_pos
    idx = -1
    if pos:
        _, idx = buffered_loop(tv, op, path)
    top = path[idx + 1] if idx + 1 < len(path) else op
    scope = path[idx].body if idx >= 0 else kernel.body
    if top not in scope:
        raise LoweringError(f"T{tv.name}: its cp.async load is not directly in its loop")
    buf = kernel.ctx.buffers[tv]
    why = cross_thread_reads(kernel, tv, readers(kernel.body, buf))
    out = _CpAsyncCopies(tv).rewrite([top]) + [K.CpAsyncCommit(), K.CpAsyncWait(0)]
    if why:
        # WAR: every thread's reads of the previous contents before any copy overwrites them;
        # RAW: every thread's copies landed before anyone reads them.
        out = [K.Comment(f"T{tv.name} is read across threads ({why}): block barriers"),
               K.BlockSync()] + out + [K.BlockSync()]
    k = scope.index(top)
    scope[k:k + 1] = out
    kernel.circular_buffers.append((buf.name, 1, 0, "cp.async"))


# Warp roles ------------------------------------------------------------------------------------
def _thread_extent(kernel, pt: PT) -> int:
    """The block extent along `pt`: the schedule's (fusion.launch_hints, a kernel whose loop
    nest a lowering pass built: lower/matmul.py), else the largest bound to it (1 when nothing
    is); it must be a constant."""
    hint = kernel.fusion.launch_hints.get(f"block_{pt.short[-1]}")
    if hint is not None:
        return hint
    exts = bound_extents(kernel.ctx, {pt})
    if None in exts:
        raise LoweringError(f"warp specialization needs a constant {pt.short} extent "
                            "(specialize the kernel on it)")
    return max(exts, default=1)


def _warp_roles(kernel: K.Kernel, kind: WarpSpecialized) -> K.WarpRoles:
    if kind.on != PT.TIDy:
        raise LoweringError(f"warp specialization is lowered on threadIdx.y only, not "
                            f"{kind.on.short}")
    bdimx, bdimy = _thread_extent(kernel, PT.TIDx), _thread_extent(kernel, PT.TIDy)
    if _thread_extent(kernel, PT.TIDz) != 1:
        raise LoweringError("warp specialization on threadIdx.y needs blockDim.z == 1")
    n_roles = kind.compute_roles
    per_role = bdimx * bdimy
    compute = per_role * n_roles
    if per_role % WARP_GROUP:
        raise LoweringError(f"the compute threads ({bdimx} x {bdimy}) are not whole warp groups "
                            "of 128")
    if WARP_GROUP % bdimx == 0:
        producer_rows = WARP_GROUP // bdimx
    elif bdimx % WARP_GROUP == 0:
        producer_rows = 1
    else:
        raise LoweringError(f"threadIdx.x extent {bdimx} neither divides 128 nor is a multiple "
                            "of it: the producer rows would not be whole warp groups")
    producer = bdimx * producer_rows
    total = compute + producer
    if total > 1024:
        raise LoweringError(f"{compute} compute and {producer} producer threads exceed 1024 per "
                            "block")
    entry, p_regs, c_regs = default_register_split(compute, producer, kind.producer_registers)
    c_regs = kind.compute_registers or c_regs
    # The block's pool: what it holds at entry; setmaxnreg only moves registers within it.
    pool = entry * total
    why = check_register_counts(p_regs, c_regs, compute // WARP_GROUP,
                                producer_groups=producer // WARP_GROUP, pool=pool)
    if why is None and not p_regs <= entry <= c_regs:
        why = (f"the entry register count {entry} ({total} threads) must lie between the "
               f"producer's {p_regs} and the compute warp groups' {c_regs}")
    if why:
        raise LoweringError(f"warp specialization: {why}")
    return K.WarpRoles("y", bdimx, bdimy, producer_rows, c_regs, p_regs,
                       compute_roles=n_roles)


@dataclasses.dataclass
class _Chain:
    """The loops a warp-specialized pipeline runs over, outermost first (the buffered loop
    last), with their trip counts and index maps; `counter(ks)` is the stage counter of
    iteration indices ks (row-major over the trips: it runs on across the outer loops). A nest
    of two whose inner trips depend on the outer iteration (`ragged`) counts from the inner
    loop's count_before instead: its iterations in the outer loop's earlier iterations."""

    loops: list
    trips: list
    index_at: list
    ragged: bool = False

    def counter(self, ks) -> K.KExpr:
        if self.ragged:
            return K.add(self.loops[-1].count_before, ks[-1])
        c = ks[0]
        for k, t in zip(ks[1:], self.trips[1:]):
            c = K.add(K.mul(c, t), k)
        return c


def _chain(chain_path, items) -> _Chain:
    tv = items[0][0]
    loops = []
    for s in chain_path:
        if not isinstance(s, K.ForLoop) or s.parallel not in ("Serial", "GridStride"):
            raise LoweringError(f"T{tv.name}: a warp-specialized pipeline runs over serial or "
                                f"grid-stride loops from the kernel's top level, not through "
                                f"{type(s).__name__} {getattr(s, 'parallel', '')}")
        loops.append(s)
    trips, index_at = zip(*(trip_count(lp) for lp in loops))
    # What an outer loop's iteration defines: its index and the scalars of its body.
    outer = {lp.var.name for lp in loops[:-1]} | {
        s.var.name for lp in loops[:-1] for s in lp.body if isinstance(s, K.ScalarDef)}
    ragged = False
    for lp, t in zip(loops[1:], trips[1:]):
        if any(isinstance(x, K.Var) and x.name in outer for x in subexprs(t)):
            if lp.count_before is None or len(loops) != 2:
                raise LoweringError(f"T{tv.name}: the trips of loop {lp.var!r} depend on an outer "
                                    "loop of the pipeline (the stage counter needs a rectangular "
                                    "nest, or a nest of two whose inner loop gives its "
                                    "count_before)")
            ragged = True
    return _Chain(loops, list(trips), list(index_at), ragged)


def _warp_specialize(kernel: K.Kernel, chain_path, items) -> None:
    ctx = kernel.ctx
    kinds = {tv.circular_buffer_options.kind for tv, _, _ in items}
    if len(kinds) != 1:
        raise LoweringError(f"warp-specialized tensors over one loop ask for different register "
                            f"splits {sorted(map(repr, kinds))}")
    roles = _warp_roles(kernel, kinds.pop())
    kernel.warp_roles = roles
    chain = _chain(chain_path, items)
    loop = chain.loops[-1]
    n_stages = items[0][0].circular_buffer_options.stages
    buffered = take_tma_loads(kernel, loop, items, n_stages, "pf_full_{}")
    cluster = multicast_cluster(buffered)
    # One full barrier per stage for all the tensors buffered over the loop: the producer raises
    # its expected bytes once per copy and arrives once; the compute roles wait once.
    full = K.MBarriers(f"pf_full_{loop.var.name}", n_stages)
    for b in buffered:
        b.bars = full
    empty = K.MBarriers(f"pf_empty_{loop.var.name}", n_stages)
    # The trip counts defined once at the top (a ragged nest's inner count is the outer
    # iteration's: it stays an expression of that iteration's scalars).
    hoisted = chain.loops[:-1] if chain.ragged else chain.loops
    trips_vars = [K.Var(f"pf_ws_trips_{lp.var.name}") for lp in hoisted]
    trips_defs = [K.ScalarDef(v, t) for v, t in zip(trips_vars, chain.trips)]
    chain.trips = list(trips_vars) + chain.trips[len(hoisted):]
    R = roles.compute_roles
    if chain.ragged and R > 1:
        raise LoweringError("ping-pong compute roles over a ragged nest (the roles' turns count "
                            "whole outer iterations of equal trips)")

    # Producer: one elected thread runs the chain's loops with the copies only. Each loop of
    # the chain defines its index, and the scalars of its body the copies read, at its top: a
    # tile's origin is computed once per tile, not once per k block (the producer is one
    # thread; its index arithmetic per stage bounds the rate of stages).
    ks = [ctx.new_loop_var() for _ in chain.loops]
    c = chain.counter(ks)
    stage, use = K.mod(c, n_stages), K.div(c, n_stages)
    produce = [K.IfThenElse(K.lt(K.Const(n_stages - 1), c),
                            [K.MBarrierWait(K.MBarrierRef(empty, stage), K.mod(K.add(use, 1), 2))])]
    produce += issue_at(buffered, _AS_THREAD0, stage)
    produce.append(K.MBarrierArrive(K.MBarrierRef(full, stage)))
    produce = _loop_defs(chain, ks, produce)
    elected = K.and_(K.eq(_TIDY, roles.compute_extent * R), K.eq(_TIDX, 0))
    producer = K.RoleBody(K.WarpRole("producer", roles.producer_registers),
                          K.lt(K.Const(roles.compute_extent * R - 1), _TIDY),
                          [K.SetMaxNReg(roles.producer_registers, increase=False),
                           K.IfThenElse(elected, produce)])

    mark_replaced(kernel, chain.loops, buffered)
    shared = [s for s in kernel.body if isinstance(s, K.Allocate) and s.buffer.memory == "shared"]
    rest = [s for s in kernel.body if s not in shared]
    computes = []
    # Shared buffers a compute role writes (a matmul's epilogue staging): one copy per role,
    # since the roles run at the same time.
    copies = {}
    if R > 1:
        for buf in role_written_shared(rest, buffered):
            if not isinstance(buf.size, K.Const):
                raise LoweringError(f"ping-pong compute roles: shared buffer {buf.name} written "
                                    "in a role needs a constant size (one copy per role)")
            align = max(128, buf.align) // buf.dtype.size
            copies[id(buf)] = -(-buf.size.value // align) * align
            buf.size = K.Const(copies[id(buf)] * R)
        # An mbarrier array the compute body allocates (a matmul's staged epilogue input):
        # each role's allocation holds every role's, and role r uses the r-th part.
        for alloc in [x for x in K.walk(rest) if isinstance(x, K.MBarrierAlloc)]:
            if id(alloc.bars) not in copies:
                copies[id(alloc.bars)] = alloc.bars.count
                alloc.bars.count *= R
    for r in range(R):
        body = _compute_role(kernel, rest, chain, buffered, empty, roles, r, cluster)
        if copies:
            body = _RoleCopies(copies, r).rewrite(body)
        role = K.WarpRole(f"compute {r}" if R > 1 else "compute", roles.compute_registers,
                          (roles.barrier_id + r, roles.compute_threads))
        _role_barriers(body, role, r)
        cond = None if r == R - 1 else K.lt(_TIDY, K.Const((r + 1) * roles.compute_extent))
        computes.append(K.RoleBody(role, cond, [K.SetMaxNReg(roles.compute_registers,
                                                             increase=True)] + body))

    names = "/".join(f"T{b.tv.name}" for b in buffered)
    bars = [full, empty]
    init = [K.MBarrierInit(K.MBarrierRef(full, K.Const(s)), K.Const(1)) for s in range(n_stages)]
    releasers = (roles.compute_threads // WARP_GROUP
                 if slots_read_by_wgmma_only(loop.body, buffered) else roles.compute_threads)
    # With multicast copies, a slot is refilled in every CTA of the cluster by each one's
    # producer: its empty barrier counts the releases of the whole cluster's compute roles.
    init += [K.MBarrierInit(K.MBarrierRef(empty, K.Const(s)), K.Const(releasers * cluster))
             for s in range(n_stages)]
    split = (f"{R} compute roles of {roles.compute_threads} threads taking turns"
             if R > 1 else f"compute {roles.compute_threads} threads")
    # Peers signal each other's barriers (multicast copies, releases): every CTA's inits are
    # published before the roles start, and no CTA leaves (its barriers invalidated, its shared
    # memory gone) while a peer may still arrive on them.
    def sync():
        return K.ClusterSync() if cluster > 1 else K.BlockSync()
    kernel.body = shared + [
        K.Comment(f"warp-specialized circular buffer of {names}: {n_stages} stages; producer "
                  f"threadIdx.y >= {roles.compute_extent * R} ({roles.producer_threads} threads, "
                  f"{roles.producer_registers} registers), {split}, "
                  f"{roles.compute_registers} registers"
                  + (f"; copies multicast over clusters of {cluster} CTAs" if cluster > 1
                     else "")),
        *[K.MBarrierAlloc(b) for b in bars],
        K.IfThenElse(_THREAD0, init + [K.FenceMBarrierInit()]),
        sync(),
        *trips_defs,
        K.RoleSplit([producer, *computes]),
        sync(),
        K.IfThenElse(_THREAD0, [K.MBarrierInval(K.MBarrierRef(b, K.Const(s)))
                                for b in bars for s in range(n_stages)]),
    ]
    kernel.circular_buffers += [(b.buf.name, n_stages, n_stages, "warp_specialized")
                                for b in buffered]


def multicast_cluster(buffered) -> int:
    """The CTAs the buffered copies are multicast to (1: none is): one count for all of them,
    since every CTA of the cluster then releases every slot of every other."""
    casts = {s.multicast for b in buffered for s in K.walk(b.issue)
             if isinstance(s, K.TensorMapLoad)}
    casts.discard(1)
    if len(casts) > 1:
        raise LoweringError(f"buffered copies multicast to different cluster sizes "
                            f"{sorted(casts)}")
    return casts.pop() if casts else 1


def _loop_defs(chain: _Chain, ks, body: list) -> list:
    """The producer's loop nest over the chain (iteration indices ks) around `body`: each level
    starts with its loop's index (as the compute roles define it) and the scalar definitions of
    that loop's body that `body` reads, directly or through another such definition, in their
    order (innermost level first, so that a definition reading an outer one sees it)."""
    needed = vars_read(body)
    for lvl in range(len(chain.loops) - 1, -1, -1):
        lp = chain.loops[lvl]
        defs = []
        if lvl < len(chain.loops) - 1:
            # The inner loop's trips and count_before (a ragged nest's) read this level's scalars.
            needed |= {v for e in (chain.trips[lvl + 1], chain.loops[lvl + 1].count_before)
                       if e is not None for v in vars_in(e)}
            for s in reversed([s for s in lp.body if isinstance(s, K.ScalarDef)]):
                if s.var.name in needed:
                    defs.insert(0, s)
                    needed |= vars_read([s])
        defs = substitute_stmts(defs, _AS_THREAD0)
        body = [K.ScalarDef(lp.var, chain.index_at[lvl](ks[lvl]))] + defs + body
        body = [K.ForLoop(ks[lvl], K.Const(0), chain.trips[lvl], K.Const(1), body,
                          label=K.WS_PRODUCER_LOOP)]
    return body


def _compute_role(kernel, rest, chain: _Chain, buffered, empty, roles, r: int,
                  cluster: int) -> list:
    """Compute role r's statements: the kernel's (less its shared allocations), the chain's
    loops counting their iterations (the outermost from r by the number of roles), the buffered
    loop's body waiting for its stage's slot and releasing it (in every CTA of the `cluster`
    when the copies are multicast: each CTA's producer refills the slot in all of them); with
    several roles, its ordered section between the turn barriers and threadIdx.y seen from the
    role's first row."""
    ctx = kernel.ctx
    R = roles.compute_roles
    n_stages = empty.count
    ks = [ctx.new_loop_var() for _ in chain.loops]
    c = chain.counter(ks)
    stage = K.mod(c, n_stages)
    inner = chain.loops[-1]
    waits = [K.MBarrierWait(K.MBarrierRef(buffered[0].bars, stage), K.mod(K.div(c, n_stages), 2))]

    def arrive(at) -> list:
        ref = K.MBarrierRef(empty, at)
        if cluster == 1:
            bar = [K.MBarrierArrive(ref)]
        else:
            bar = [K.MBarrierArrive(ref, K.Const(rank)) for rank in range(cluster)]
        if not slots_read_by_wgmma_only(inner.body, buffered):
            return bar
        # The warp group's wait_group completes its wgmmas' reads for all its threads: one
        # arrival per warp group (empty's count, _warp_specialize).
        tid = _TIDX if roles.row_threads % WARP_GROUP == 0 else \
            K.add(_TIDX, K.mul(_TIDY, roles.row_threads))
        return [K.IfThenElse(K.eq(K.mod(tid, WARP_GROUP), 0), bar)]

    release = arrive(stage)
    body = offset_slots(inner.body, buffered, stage)
    lag = release_lag(body, buffered)
    drain: list = []
    if lag and (R == 1 or len(chain.loops) > 1):
        # The slot of iteration c is read by wgmma groups still in flight after iteration c's
        # wait_group(lag): it is released lag iterations later, and the last lag slots of the
        # inner loop after a wait_group(0) that follows it.
        release = [K.IfThenElse(K.lt(K.Const(lag - 1), ks[-1]),
                                arrive(K.mod(K.sub(c, lag), n_stages)))]
        drain = [K.WgmmaWait(0)] + [
            K.IfThenElse(K.lt(K.Const(d - 1), chain.trips[-1]), arrive(
                K.mod(chain.counter(ks[:-1] + [K.sub(chain.trips[-1], d)]), n_stages)))
            for d in range(lag, 0, -1)]
    elif lag:
        body = body + [K.WgmmaWait(0)]
    if R > 1 and len(chain.loops) == 1:
        # The slot is released right after the last statement that reads it: the producer
        # refills it while the role computes from registers.
        slots = {id(b.buf) for b in buffered}
        placed = _insert_at(body, lambda x: touches(x, slots), release, after=True)
        if placed is not None:
            body, release = placed, []
    new_inner = [K.ScalarDef(inner.var, chain.index_at[-1](ks[-1]))] + waits + body + release
    new = K.ForLoop(ks[-1], K.Const(0) if len(chain.loops) > 1 else K.Const(r),
                    chain.trips[-1], K.Const(1 if len(chain.loops) > 1 else R), new_inner,
                    label=K.WS_COMPUTE_LOOP)
    for lvl in range(len(chain.loops) - 2, -1, -1):
        lp = chain.loops[lvl]
        child = chain.loops[lvl + 1]
        lbody = list(lp.body)
        at = next(k for k, s in enumerate(lbody) if s is child)
        lbody[at:at + 1] = [new] + (drain if lvl == len(chain.loops) - 2 else [])
        first, step = (K.Const(r), K.Const(R)) if lvl == 0 else (K.Const(0), K.Const(1))
        new = K.ForLoop(ks[lvl], first, chain.trips[lvl], step,
                        [K.ScalarDef(lp.var, chain.index_at[lvl](ks[lvl]))] + lbody,
                        label=K.WS_COMPUTE_LOOP)
    if R > 1:
        new = _ordered_sections(new, roles, r, buffered, chain)
    out = list(rest)
    if not replace_stmt(out, chain.loops[0], [new] + (drain if len(chain.loops) == 1 else [])):
        raise LoweringError(f"loop {chain.loops[0].var!r} vanished from the kernel")
    if R == 1:
        return out
    # Each role changes its own statements (its barriers); role r's rows start at r * By, so
    # its statements see threadIdx.y from there.
    out = fresh_stmts(out)
    if r:
        out = Substitution({_TIDY: K.sub(_TIDY, K.Const(r * roles.compute_extent))}).rewrite(out)
    return out


def role_written_shared(stmts, buffered) -> list:
    """The shared buffers (other than the slots) that statements of a compute role write: each
    compute role gets its own copy of them (`_RoleCopies`)."""
    slots = {id(b.buf) for b in buffered}
    seen: dict = {}
    for x in K.walk(stmts):
        for t in accesses(x)[1]:
            if t.buffer.memory == "shared" and id(t.buffer) not in slots:
                seen.setdefault(id(t.buffer), t.buffer)
    return list(seen.values())


class _RoleCopies(Rewriter):
    """Compute role r's accesses to a role-written shared buffer address its own copy: the
    buffer grows to one copy per role, role r's starting r copies in; likewise the mbarriers
    of an array the compute body allocates (`sizes` by id of Buffer or MBarriers)."""

    def __init__(self, sizes: dict, r: int):
        self.sizes, self.r = sizes, r

    def _shifted(self, ref, key):
        """`ref` (a TensorIndex or MBarrierRef) moved r parts in, if its array has parts."""
        size = self.sizes.get(key)
        if size is None or not self.r:
            return ref
        return dataclasses.replace(ref, index=K.add(ref.index, self.r * size))

    def tensor_index(self, t):
        t = self.default_expr(t)
        return self._shifted(t, id(t.buffer))

    def mbarrier_ref(self, b):
        b = self.default_expr(b)
        return self._shifted(b, id(b.bars))


def touches(stmt, slots) -> bool:
    """Whether statement `stmt` itself (not its nested bodies) accesses a buffer of `slots`
    (ids of the slot buffers)."""
    reads, writes = accesses(stmt)
    return any(id(t.buffer) in slots for t in reads + writes)


def _slot_readers(body, buffered) -> list:
    slots = {id(b.buf) for b in buffered}
    return [x for x in K.walk(body) if touches(x, slots)]


def slots_read_by_wgmma_only(body, buffered) -> bool:
    """Whether the buffered loop's body reads its slots through wgmma alone (an asynchronous
    reader whose reads complete for the whole warp group at its wait_group): each compute warp
    group then releases a slot with one arrival, not one per thread."""
    found = _slot_readers(body, buffered)
    return bool(found) and all(isinstance(x, K.Wgmma) for x in found)


def release_lag(body, buffered) -> int:
    """How many iterations a slot's release waits: when the buffered loop's body ends with a
    wgmma.wait_group(P) and its slots are read by wgmma (asynchronous readers: iteration c's
    reads are complete only once the wait of iteration c + P has returned), P; else 0."""
    if not body or not isinstance(body[-1], K.WgmmaWait) or body[-1].pending == 0:
        return 0
    if not any(isinstance(x, K.Wgmma) for x in K.walk(body)):
        return 0
    other = next((x for x in _slot_readers(body, buffered) if not isinstance(x, K.Wgmma)), None)
    if other is not None:
        raise LoweringError("a buffered loop whose wgmma groups stay in flight "
                            f"(wait_group {body[-1].pending}) also reads its slots "
                            f"outside wgmma ({type(other).__name__})")
    return body[-1].pending


def _insert_at(body: list, holds, stmts: list, after: bool = False) -> list | None:
    """`body` with `stmts` inserted before the first (after the last) statement for which
    holds(statement) is true of it or of a statement nested in it, looking inside the thread
    loops that hold it (scopes every thread runs, not loops); None when no statement holds."""
    hits = [j for j, s in enumerate(body) if any(holds(x) for x in K.walk([s]))]
    if not hits:
        return None
    j = hits[-1] if after else hits[0]
    s = body[j]
    if isinstance(s, K.ForLoop) and s.parallel in ("TIDx", "TIDy", "TIDz") and not holds(s):
        return body[:j] + [dataclasses.replace(s, body=_insert_at(s.body, holds, stmts, after))] \
            + body[j + 1:]
    return body[:j + after] + stmts + body[j + after:]


def _writes_global(s) -> bool:
    return (isinstance(s, K.TensorOp) and isinstance(s.out, K.TensorIndex)
            and s.out.buffer.memory == "global")


def _ordered_sections(outer: K.ForLoop, roles: K.WarpRoles, r: int, buffered,
                      chain: _Chain) -> K.ForLoop:
    """Role r's section of outer iteration k waits for role r - 1's section of k - 1 (bar.sync on
    its turn barrier, skipped at k = 0) and hands the turn on after it (bar.arrive on the next
    role's, skipped when k is the last iteration): the roles' sections run one at a time, in
    iteration order. The section runs from the statement of the outer loop's body that first
    waits for a slot (a whole inner loop, when the buffered loop is nested) up to the first
    statement after it that writes global memory (the epilogue: stores, which overlap the next
    role's section), or to the end of the body."""
    R = roles.compute_roles
    count = K.Const(2 * roles.compute_threads)
    turn = roles.barrier_id + R          # role r waits on turn + r
    k = outer.var
    full = {id(b.bars) for b in buffered}
    body = list(outer.body)
    first = next((j for j, s in enumerate(body) if any(
        isinstance(x, K.MBarrierWait) and id(x.bar.bars) in full for x in K.walk([s]))), None)
    if first is None:
        raise LoweringError("ping-pong compute roles: the outer loop never waits for a slot")
    wait = K.IfThenElse(K.lt(K.Const(0), k), [K.BlockSync(turn + r, count)])
    hand = K.IfThenElse(K.lt(K.add(k, 1), chain.trips[0]),
                        [K.NamedBarrierArrive(turn + (r + 1) % R, count)])
    if len(chain.loops) > 1:
        # A nested pipeline (a persistent tile loop around a k loop): the section is the k loop
        # and the slot releases after it; what follows (a tile's epilogue, from registers)
        # overlaps the next role's k loop.
        slots = {id(b.buf) for b in buffered}
        last = max(j for j, s in enumerate(body) if any(
            isinstance(x, (K.MBarrierWait, K.MBarrierArrive)) or touches(x, slots)
            for x in K.walk([s])))
        rest = body[first + 1:last + 1] + [hand] + body[last + 1:]
    else:
        rest = _insert_at(body[first + 1:], _writes_global, [hand])
        rest = body[first + 1:] + [hand] if rest is None else rest
    return dataclasses.replace(outer, body=body[:first] + [wait, body[first]] + rest)


def _role_barriers(stmts, role: K.WarpRole, r: int) -> None:
    """Compute role r's synchronization among its own threads: its named barrier for block
    barriers, block reductions (in the role's own workspace) and grid barriers; what would
    need the whole block is refused."""
    bid, count = role.barrier
    for x in K.walk(stmts):
        if isinstance(x, K.BlockSync) and x.barrier_id is None:
            x.barrier_id, x.count = bid, K.Const(count)
        elif isinstance(x, K.BlockReduce):
            if r and "y" in x.dims:
                raise LoweringError("ping-pong compute roles: a block reduction across "
                                    "threadIdx.y would mix the roles' rows")
            x.barrier, x.role = (bid, count), r
        elif isinstance(x, K.SplitKReduce) and x.barrier is None:
            x.barrier = (bid, count)
        elif isinstance(x, K.GridSync):
            # Only the compute threads exchange data through global memory (the producer
            # writes shared memory only): the block's part of the grid barrier is theirs.
            x.barrier = (bid, count)
        elif isinstance(x, (K.GridReduce, K.ClusterReduce, K.BlockScan, K.BlockTopK)):
            raise LoweringError(f"warp specialization: a {type(x).__name__} in a compute role "
                                "is not supported")
        elif isinstance(x, K.InitValue) and getattr(x.out, "memory", None) == "shared":
            raise LoweringError("warp specialization: a block-shared accumulator would be "
                                "initialized with __syncthreads, which the producer never reaches")

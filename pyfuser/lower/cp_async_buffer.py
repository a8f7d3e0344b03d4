"""Pass `cp_async_buffer_loops`: cp.async loads, pipelined over their buffered loop by cp.async
groups.

Before (after `vectorize_and_unroll`): a shared tensor T14 loaded with cp.async in the loop left
of its compute-at position (the buffered loop L), read later in the same iteration:

    for j in L:                                   # e.g. grid-stride over row groups
      for ty: for p in 0..P: for tx:              # the split of the reader: each thread copies
        if (row and column in range)              # the vectors it reads back
          T14[((ty * P + p) * bdx + tx) * V]<V> = T0[row(j, ty) * s0 + (p * bdx + tx) * V]<V>
      for ty: ... T15[p * V]<V> = T14[((ty * P + p) * bdx + tx) * V]<V> ...       # readers

After (CpAsyncPipelined kind, S stages, F = prefetch; n = trip count of L; slot(k) = k % S):

    n = trips(L)
    for s < F:  { if (s < n) issue(s); commit; }  # prologue (unrolled): F groups, empty when s >= n
    for k in [0, n - F):                          # main loop
      issue(k + F); commit; wait_group(F); body(k)
    for k in [max(n - F, 0), n):                  # epilogue: copies nothing
      commit; wait_group(F); body(k)              # an empty group keeps the count uniform

    issue(k): every thread, for its loop indices of the load with j = start + k * step:
              if (predicate) cp.async(&T14[index + (k % S) * slot], &T0[...], V * elem bytes)
    body(k):  j = start + k * step; L's body with reads of T14 offset by (k % S) * slot

Group counting: before body(k) a thread has committed k + F + 1 groups, group g holding the
copies of iteration g (those of iterations >= n are empty), so wait_group(F), which leaves only
the F newest incomplete, completes iteration k's copies. Elements a predicate turns off are not
copied (the slot keeps whatever it held; readers of them are predicated off or their values
unused, as with registers).

Barriers: cp.async writes become visible to the issuing thread at the wait; other threads see
them only after a block barrier. The pass proves from the loop mapping that no barrier is
needed: every thread dimension of the block (extent > 1) indexes one allocated ID of T14, and
every reader indexes that ID by the same threadIdx, so a thread reads only elements it copied
itself (RAW needs the wait alone; WAR: the copy into slot (k + F) % S is issued after, in program
order, this thread's reads of that slot in iteration k + F - S < k, whose loaded values that
iteration's body has already consumed, so those reads are complete). When the proof fails (e.g. one
thread copies a row that all threads read), a block barrier follows each wait (RAW) and ends each
main-loop iteration (WAR: every thread done with slot k % S before iteration k + 1 refills it
when F = S - 1). An unbuffered cp.async load (no circular_buffer) is lowered in place: copies,
commit, wait_group(0), with barriers before the copies and after the wait when the proof fails.
`insert_syncs` (after this pass) sees no TensorOp for these loads and adds nothing for them.

Limitations: the buffered loop is serial or grid-stride, the cp.async tensors of one loop share
stages and prefetch; the load sub-tree holds only the cp.async copies (loops and copies); a copy
moves its vector of 4, 8 or 16 bytes; a loop that also buffers TMA loads is refused (the TMA pass,
before this one, replaces it, and the cp.async load no longer finds its buffered loop).
"""
from __future__ import annotations

import dataclasses

from ..ir.exprs import LoadKind, LoadStoreOp
from ..ir.iter_domain import ParallelType as PT
from ..ir.tensor import CpAsyncPipelined
from ..kir import nodes as K
from ..kir.verifier import Rule, establishes
from .circular_buffer import (EPILOGUE, MAIN_LOOP, BufferedTensor, buffered_loop, load_site,
                              loads_where, mark_replaced, offset_slots, replace_stmt, retarget,
                              stages_of, take_slot, trip_count)
from .context import LoweringError
from .index import reader_index
from .indexing import bound_extents

CP_ASYNC_BYTES = (4, 8, 16)
_THREAD_DIMS = {PT.TIDx: "threadIdx.x", PT.TIDy: "threadIdx.y", PT.TIDz: "threadIdx.z"}


def _no_cp_async_op(v, s, scope) -> None:
    if is_cp_async_load(s):
        v.fail("a cp.async load is still a TensorOp after cp_async_buffer_loops", s)


# cp.async loads are CpAsyncCopy statements with their commits and waits, no longer TensorOps.
CP_ASYNC_LOWERED = Rule("cp.async lowered", stmt=_no_cp_async_op)


@establishes(CP_ASYNC_LOWERED)
def cp_async_buffer_loops(kernel: K.Kernel) -> K.Kernel:
    by_loop: dict = {}
    for op, path in cp_async_loads(kernel.body, []):
        tv = op.expr.outputs[0]
        opts = tv.circular_buffer_options
        if opts is None:
            _in_place(kernel, tv, op, path)
            continue
        if not isinstance(opts.kind, CpAsyncPipelined):
            raise LoweringError(f"T{tv.name}: a cp.async load is circular-buffered with the "
                                f"CpAsyncPipelined kind, not {type(opts.kind).__name__}")
        loop, _, top = load_site(tv, op, path)
        by_loop.setdefault(id(loop), (loop, []))[1].append((tv, op, top))
    for loop, items in by_loop.values():
        _pipeline_loop(kernel, loop, items)
    return kernel


def is_cp_async_load(s) -> bool:
    return (isinstance(s, K.TensorOp) and isinstance(s.expr, LoadStoreOp)
            and s.expr.load_kind == LoadKind.CpAsync)


def cp_async_loads(body, path):
    """(cp.async load, the statements around it) for every cp.async load in `body`."""
    return loads_where(body, is_cp_async_load, path)


def copy_stmts(tv, top) -> list:
    """The load sub-tree with its cp.async TensorOps as CpAsyncCopy (loops kept)."""
    def convert(s):
        if isinstance(s, K.TensorOp):
            if not (is_cp_async_load(s) and s.expr.outputs[0] is tv):
                raise LoweringError(f"T{tv.name}: its load loop also computes "
                                    f"{s.expr.outputs[0]!r}; the cp.async load needs loops of "
                                    "its own")
            nbytes = s.vector * s.out.buffer.dtype.size
            if nbytes not in CP_ASYNC_BYTES:
                raise LoweringError(f"T{tv.name}: a cp.async copy moves 4, 8 or 16 bytes, not "
                                    f"{s.vector} x {s.out.buffer.dtype.size} (vectorize the "
                                    "load's innermost axis)")
            return K.CpAsyncCopy(s.out, s.ins[0], nbytes, s.predicate)
        if isinstance(s, K.ForLoop):
            return dataclasses.replace(s, body=[convert(c) for c in s.body])
        if isinstance(s, K.IfThenElse):
            return dataclasses.replace(s, then_body=[convert(c) for c in s.then_body],
                                       else_body=[convert(c) for c in s.else_body])
        if isinstance(s, (K.Allocate, K.Comment)):
            return s
        raise LoweringError(f"T{tv.name}: unexpected {type(s).__name__} in its cp.async load "
                            "loop")
    return [convert(top)]


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


def _in_place(kernel: K.Kernel, tv, op, path) -> None:
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
    out = copy_stmts(tv, top) + [K.CpAsyncCommit(), K.CpAsyncWait(0)]
    if why:
        # WAR: every thread's reads of the previous contents before any copy overwrites them;
        # RAW: every thread's copies landed before anyone reads them.
        out = [K.Comment(f"T{tv.name} is read across threads ({why}): block barriers"),
               K.BlockSync()] + out + [K.BlockSync()]
    k = scope.index(top)
    scope[k:k + 1] = out
    kernel.circular_buffers.append((buf.name, 1, 0, "cp.async"))


def _pipeline_loop(kernel: K.Kernel, loop: K.ForLoop, items) -> None:
    ctx = kernel.ctx
    n_stages, prefetch = stages_of(loop, items)
    buffered, why = [], []
    for tv, op, top in items:
        buf = ctx.buffers[tv]
        reason = cross_thread_reads(kernel, tv, readers(loop.body, buf))
        if readers(kernel.body, buf) != readers(loop.body, buf):
            raise LoweringError(f"T{tv.name} is read outside its buffered loop {loop.var!r}")
        if reason:
            why.append(reason)
        buf, slot = take_slot(kernel, loop, tv, top, n_stages)
        buffered.append(BufferedTensor(tv, buf, None, slot, copy_stmts(tv, top)))
    trips, index_at = trip_count(loop)
    n = K.Var(f"pf_cp_trips_{loop.var.name}")

    def issue_at(k) -> list:
        stage = K.mod(k, n_stages)
        return [retarget(s, {loop.var: index_at(k)}, b, stage) for b in buffered for s in b.issue]

    def wait_and_body(k, stmts) -> list:
        stage = K.mod(k, n_stages)
        out = [K.CpAsyncWait(prefetch)] + ([K.BlockSync()] if why else [])
        out.append(K.ScalarDef(loop.var, index_at(k)))
        return out + [offset_slots(s, buffered, stage) for s in stmts]

    names = "/".join(f"T{b.tv.name}" for b in buffered)
    out = [K.Comment(f"cp.async circular buffer of {names}: {n_stages} stage(s), prefetch "
                     f"{prefetch}; one cp.async group per stage"),
           K.ScalarDef(n, trips)]
    if why:
        out.append(K.Comment("read across threads (" + "; ".join(why) + "): block barriers "
                             "after each wait and at the end of each main-loop iteration"))
    for s in range(prefetch):
        out += [K.IfThenElse(K.lt(K.Const(s), n), issue_at(K.Const(s))), K.CpAsyncCommit()]
    k_main = ctx.new_loop_var()
    main_body = issue_at(K.add(k_main, prefetch)) + [K.CpAsyncCommit()]
    main_body += wait_and_body(k_main, loop.body) + ([K.BlockSync()] if why else [])
    out.append(K.ForLoop(k_main, K.Const(0), K.sub(n, prefetch), K.Const(1), main_body,
                         label=MAIN_LOOP))
    if prefetch:
        k_epi = ctx.new_loop_var()
        first = K.Bin("max", K.sub(n, prefetch), K.Const(0))
        epi_body = [K.CpAsyncCommit()] + wait_and_body(k_epi, loop.body)
        out.append(K.ForLoop(k_epi, first, n, K.Const(1), epi_body, label=EPILOGUE))
    mark_replaced(kernel, loop, buffered)
    if not replace_stmt(kernel.body, loop, out):
        raise LoweringError(f"loop {loop.var!r} vanished from the kernel")
    kernel.circular_buffers += [(b.buf.name, n_stages, prefetch, "cp.async") for b in buffered]

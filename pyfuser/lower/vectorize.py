"""Pass `vectorize_and_unroll`: vector memory accesses and unrolled loops.

Before: for v in 0..4 (Vectorize): T1[v] = T0[base + v]
After:  T1[0..4) = T0[base .. base + 4)     one 8- or 16-byte access (TensorIndex.vector = 4)

A copy between memories (LoadStoreOp of one dtype), a window's or a gather's read in a Vectorize
loop becomes one vector access at the loop's first element; one-iteration loops between the two
(a trailing broadcast dim) fold away. An op whose indices and predicate do not depend on the lane
(the read of an index or a per-row value broadcast along the vector: lower/indexing.py folds the
lane out of its row's division) is the same for every lane and runs once, where it stood:

Before: for v in 0..8 (Vectorize): T4[0] = T0[(a * 8) / n]; T5[v] = T1[(a * 8 + v) % n + T4[0] * s]
After:  T4[0] = T0[(a * 8) / n]; T5[0..8) = T1[(a * 8) % n + T4[0] * s ..)

Any other op in a Vectorize loop runs in an unrolled loop over registers, and so does a
Vectorize loop of one iteration (a vectorized broadcast axis runs once). Serial loops of
small constant extent, and Unroll loops, are unrolled so that register arrays they index stay in
registers. An unrolled loop whose guarded ops share one guard free of its variable but not of
the thread's index (a thread's accumulation of the lanes of a vector it read whole:
lower/indexing.py bounds them by the vector's index) is guarded once, around the loop, where the
other ops only compute registers the loop's body allocates (no value escapes a skipped
iteration):

Before: for j in 0..8 (unrolled): float T1[1]; T1[0] = f(T5[j]); if (v < n) T7[0] += T1[0]
After:  if (v < n) { for j in 0..8 (unrolled): float T1[1]; T1[0] = f(T5[j]); T7[0] += T1[0] }

(nvcc kept a branch per lane: three instructions per element of a logsumexp row.) A guard the
same for every thread of the block (a persistent kernel's row guard) stays on the ops: nvcc
predicates those, and hoisted they cost the layernorm backward 3% (2358 -> 2287 GB/s, H200).

Where the schedule runs vectors across rows of dense tensors (fusion.ragged_vectors: the
pointwise scheduler's ragged rows), a vector whose guard depends on its lane runs whole where
its last lane passes and lane by lane otherwise, and every vector access must index
`base + lane` (else the loop is unrolled):

Before: for v in 0..8 (Vectorize): if (f * 8 + v < n) T1[v] = T0[f * 8 + v]
After:  if (f * 8 + 7 < n) T1[0..8) = T0[f * 8 ..)
        else for v in 0..8 (unrolled): if (f * 8 + v < n) T1[v] = T0[f * 8 + v]

A vector access is one contiguous run of memory: for every global tensor it touches, the loop's
lanes must move the index of the tensor's stride-1 dim (TensorDomain.contiguous_dim) and of no
other dim. Schedules guarantee it (TensorView.parallelize checks the vectorized axis steps
through that dim); this pass checks it again on the indices, so a schedule that slips through
fails to lower instead of reading the wrong elements (all lanes reading one element of a [1]
input, or lanes a row apart). The kernel records, per global tensor, the vector width whose
divisibility, stride and alignment the executor checks before each launch.
"""
from __future__ import annotations

import dataclasses

from ..ir.exprs import GatherOp, LoadStoreOp, RandOp, WindowOp
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K
from ..kir.verifier import establishes
from ..kir.rewrite import Rewriter, substitute
from .context import LoweringError
from .unswitch import bound_checks, without

UNROLL_LIMIT = 32


@establishes()
def vectorize_and_unroll(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _VectorLoops(kernel).rewrite(kernel.body)
    return kernel


class _VectorLoops(Rewriter):
    def __init__(self, kernel):
        self.kernel = kernel

    def visit_ForLoop(self, s: K.ForLoop):
        s = self.default_stmt(s)
        if s.parallel == "Vectorize":
            return _vectorize(s, self.kernel)
        ext = s.stop.value if isinstance(s.stop, K.Const) else None
        if s.parallel == "Unroll" or (s.parallel == "Serial" and ext is not None
                                      and ext <= UNROLL_LIMIT and not s.rolled):
            s = dataclasses.replace(s, unroll=True)
            # One iteration has one guard anyway, and a vector loop around it folds it away
            # (_ops_run_once_per_lane looks through such loops, not through an if).
            return s if ext == 1 else _guarded_once(s)
        return s


def _guarded_once(loop: K.ForLoop):
    """`loop` inside the one guard its guarded ops share (the module docstring), or `loop` as
    it is: where an op is guarded otherwise, reads a value where its guard fails
    (else_value), depends on the loop variable in its guard, or, unguarded, writes a register
    allocated outside the loop, or where the body holds anything but ops and allocations."""
    local, guard = set(), None
    for st in loop.body:
        if isinstance(st, K.Allocate):
            local.add(id(st.buffer))
            continue
        if not isinstance(st, K.TensorOp) or st.else_value is not None:
            return loop
        if isinstance(st.predicate, K.Const) and st.predicate.value is True:
            if not (isinstance(st.out, K.TensorIndex) and id(st.out.buffer) in local):
                return loop
            continue
        if guard is None:
            if not _lane_free(st.predicate, loop.var) or all(
                    _lane_free(st.predicate, K.Special(f"threadIdx.{a}")) for a in "xyz"):
                return loop
            guard = st.predicate
        elif repr(st.predicate) != repr(guard):
            return loop
    if guard is None:
        return loop
    always = K.Const(True, "bool")
    body = [dataclasses.replace(st, predicate=always) if isinstance(st, K.TensorOp) else st
            for st in loop.body]
    return K.IfThenElse(guard, [dataclasses.replace(loop, body=body)])


def _vectorize(loop: K.ForLoop, kernel) -> list:
    width = loop.stop.value
    first_lane = {loop.var: K.Const(0)}
    collapsed: list = []
    allocs: list = []
    ops = _ops_run_once_per_lane(loop.body, first_lane, collapsed, allocs)
    per_lane = {id(op) for op in ops if not _same_for_every_lane(op, loop.var)} if ops else ()
    serial = dataclasses.replace(loop, unroll=True, parallel="Serial")
    if width == 1 or not per_lane or not all(_is_vector_op(op, loop) and _scheduled_vector(op)
                                             for op in ops if id(op) in per_lane):
        return [serial]
    if not kernel.fusion.ragged_vectors:
        return _vector_ops(ops, per_lane, allocs, collapsed, loop, kernel)
    # Vectors across rows: each access must be one flat run (`base + lane`), and the tensors
    # need not hold whole vectors per row (the executor checks them dense instead).
    tail = _ragged_tail(ops, loop)
    if tail is False or not _flat_accesses(ops, loop):
        return [serial]
    for op in ops:
        if id(op) in per_lane and _global_buffer(op) is not None:
            kernel.ragged_vectors.add(_global_buffer(op))
    if tail is not None:
        # A flat run whose last vector may stop inside it: whole vectors unchecked, the tail
        # vector lane by lane (the loop as it was, labelled as a repeat of the vector ops').
        cond, checks = tail
        unchecked = [dataclasses.replace(op, predicate=without(op.predicate, checks))
                     for op in ops]
        per_lane = {id(new) for new, op in zip(unchecked, ops) if id(op) in per_lane}
        vector = _vector_ops(unchecked, per_lane, allocs, collapsed, loop, kernel)
        # The vector loop and the one-iteration loops in it are folded in the vector version
        # (kernel.replaced_loops): the tail's copies of them stand for no lowering loop.
        tail_loop = _unbound(dataclasses.replace(serial, label=K.UNSWITCH_ELSE),
                             {id(lp.loop) for lp in [loop, *collapsed] if lp.loop is not None})
        return [K.IfThenElse(cond, vector, [tail_loop])]
    return _vector_ops(ops, per_lane, allocs, collapsed, loop, kernel)


def _unbound(s, folded: set):
    """Statement s with its ForLoops over the lowering loops in `folded` (ids) bound to none."""
    if not isinstance(s, K.ForLoop):
        return s
    loop = None if s.loop is not None and id(s.loop) in folded else s.loop
    return dataclasses.replace(s, body=[_unbound(x, folded) for x in s.body], loop=loop)


def _ragged_tail(ops: list, loop: K.ForLoop):
    """None where every op's predicate is the same in every lane (whole vectors). Else the
    (condition, conjunct ids) of a vector whose last lane is in bounds: each lane-dependent
    conjunct `a < b`, a non-decreasing in the lane (lower/unswitch.py), taken at the last lane;
    False where a lane-dependent conjunct is of another form."""
    checks, every, cond = bound_checks(ops, {loop.var: K.Const(loop.stop.value - 1)})
    if not every:
        return False
    return (cond, checks) if checks else None


def _flat_accesses(ops: list, loop: K.ForLoop) -> bool:
    """Whether every global access of `ops` that moves with the lane indexes `base + lane`:
    one run of memory whichever rows its lanes fall in (a flat index of a dense tensor)."""
    return all(_base_plus_lane(a.index, loop.var) for op in ops for a in [op.out, *op.ins]
               if isinstance(a, K.TensorIndex) and a.buffer.memory == "global"
               and not _lane_free(a, loop.var))


def _base_plus_lane(index, lane) -> bool:
    """index is `E + lane`, E free of the lane."""
    terms = _terms(index)
    lanes = [t for t in terms if isinstance(t, K.Var) and t is lane]
    return len(lanes) == 1 and all(_lane_free(t, lane) for t in terms if t is not lane)


def _global_buffer(op: K.TensorOp) -> str | None:
    for a in [op.out, *op.ins]:
        if isinstance(a, K.TensorIndex) and a.buffer.memory == "global":
            return a.buffer.name
    return None


def _vector_ops(ops: list, per_lane: set, allocs: list, collapsed: list, loop: K.ForLoop,
                kernel) -> list:
    width = loop.stop.value
    first_lane = {loop.var: K.Const(0)}
    # The vector loop and the one-iteration loops inside it fold into the accesses.
    kernel.replaced_loops.update(id(lp.loop) for lp in [loop, *collapsed] if lp.loop is not None)
    out = list(allocs)      # the registers of what runs once per vector (a gather's index)
    for op in ops:
        if id(op) not in per_lane:
            # The same access for every lane (a row's index read once per vector): once.
            out.append(dataclasses.replace(
                op, out=substitute(op.out, first_lane),
                ins=[substitute(i, first_lane) for i in op.ins],
                predicate=substitute(op.predicate, first_lane)))
            continue
        _check_lanes_contiguous(op, loop, kernel)
        vector_ins = K.vector_operands(op)
        out.append(dataclasses.replace(
            op, vector=width, out=_vec_access(substitute(op.out, first_lane), width, kernel),
            ins=[_vec_access(substitute(i, first_lane), width, kernel)
                 if isinstance(i, K.TensorIndex) and k < vector_ins
                 else substitute(i, first_lane)
                 for k, i in enumerate(op.ins)],
            predicate=substitute(op.predicate, first_lane)))
    return out


def _scheduled_vector(op: K.TensorOp) -> bool:
    """Whether op's out has the Vectorize axis (the schedule vectorized it), rather than being
    computed inside another tensor's vector loop: a gather's index, which must then be the same
    for every lane (schedule/inlining._same_in_every_lane); where the index math cannot show it
    (lower/indexing.py found no multiple of the width), the loop is unrolled instead."""
    from ..ir.iter_domain import ParallelType
    return any(i.parallel_type == ParallelType.Vectorize for i in op.expr.outputs[0].domain.loop)


def _same_for_every_lane(op: K.TensorOp, lane: K.Var) -> bool:
    """Whether op's indices and predicate are free of the lane variable: its out is written at
    one place with one value for all lanes. A gather is never (its read is the vector)."""
    if isinstance(op.expr, (GatherOp, WindowOp, RandOp)):
        return False
    return all(_lane_free(x, lane) for x in [op.out, op.predicate, *op.ins])


def _lane_free(x, lane) -> bool:
    """Whether expression x is the same in every lane (a Var, or a Special such as
    threadIdx.x; compared as printed: kernel expressions compare by identity)."""
    return repr(substitute(x, {lane: K.Const(0)})) == repr(substitute(x, {lane: K.Const(1)}))


def _ops_run_once_per_lane(body: list, fixed: dict, collapsed: list,
                           allocs: list) -> list | None:
    """The TensorOps of a vector loop's body, or None if it holds anything else; the register
    allocations among them go to `allocs` (of what runs once per vector, one element each).

    Loops of one iteration are looked through (their variables are added to `fixed` at their
    start, the loops to `collapsed`): a tensor whose loop nest ends in a size-1 broadcast dim
    after the vectorized one, such as the cache of a [1, M, N] input, puts that loop inside the
    vector loop.
    """
    ops = []
    for s in body:
        if isinstance(s, K.TensorOp):
            ops.append(s)
        elif isinstance(s, K.Allocate):
            allocs.append(s)
        elif (isinstance(s, K.ForLoop) and s.parallel == "Serial"
              and isinstance(s.start, K.Const) and isinstance(s.stop, K.Const)
              and s.stop.value - s.start.value == 1):
            fixed[s.var] = s.start
            collapsed.append(s)
            inner = _ops_run_once_per_lane(s.body, fixed, collapsed, allocs)
            if inner is None:
                return None
            ops.extend(inner)
        else:
            return None
    return ops


def _check_lanes_contiguous(op: K.TensorOp, loop: K.ForLoop, kernel) -> None:
    """Consecutive iterations of the vector loop must step through the stride-1 dim of every
    global tensor of `op`, element by element (the structural rule of
    TensorDomain.dim_stepped_by, walked from the loop's ID to the tensor's dims through the exact
    ID graph, which is how the tensor is indexed)."""
    lid = loop.iter_domain
    if lid is None:
        return
    exact = kernel.ctx.exact
    if isinstance(op.expr, WindowOp):
        _check_window_lanes(op.expr, lid, loop, exact)
        return
    if isinstance(op.expr, GatherOp):
        _check_gather_lanes(op, lid, loop, exact)
        return
    if isinstance(op.expr, RandOp):
        return          # draws, not memory: _is_vector_op checked their indices
    for tv in [op.expr.outputs[0], *op.expr.inputs]:
        if not isinstance(tv, TensorView) or tv.memory_type != MemoryType.Global:
            continue
        inner = tv.domain.contiguous_dim
        stepped = _dim_stepped_by(lid, tv, exact)
        if inner is None or stepped is not inner:
            raise LoweringError(
                f"a {loop.stop!r}-wide vector access of T{tv.name} steps through "
                f"{stepped if stepped is not None else 'no single dim'}, not its stride-1 dim "
                f"{inner if inner is not None else '(none: every dim is a broadcast)'}; "
                "its lanes would not be one contiguous run of memory")


def _check_window_lanes(e: WindowOp, lid, loop: K.ForLoop, exact) -> None:
    """A window's lanes step through its out's dim d; they read one run of its source when d
    is the source's stride-1 dim, read at step 1 (the scheduler checked the offset and guards
    are whole vectors: base.vector_windows)."""
    out, src = e.outputs[0], e.src
    stepped = _dim_stepped_by(lid, out, exact)
    logical = out.domain.logical_no_reductions
    d = next((k for k, i in enumerate(logical) if i is stepped), None)
    if d is None or src.domain.logical_no_reductions[d] is not src.domain.contiguous_dim \
            or (e.windows[d] is not None and e.windows[d].step != 1):
        raise LoweringError(f"a {loop.stop!r}-wide vector read of window T{out.name} does not "
                            f"step through T{src.name}'s stride-1 dim one element at a time")


def _check_gather_lanes(op: K.TensorOp, lid, loop: K.ForLoop, exact) -> None:
    """A gather's lanes step through its out's dim d; they read one run of its source when d
    is a source dim other than the gathered one and the source's stride-1 dim (the scheduler
    checked, base.vector_gathers; the source's size along d holds whole vectors, checked before
    the launch; _is_vector_op checked the index is the same for every lane)."""
    e = op.expr
    out, src = e.outputs[0], e.src
    stepped = _dim_stepped_by(lid, out, exact)
    logical = out.domain.logical_no_reductions
    d = next((k for k, i in enumerate(logical) if i is stepped), None)
    s = next((k for k, o in enumerate(e.src_dims) if o is not None and o == d), None)
    if d is None or s is None or s == e.dim \
            or src.domain.logical_no_reductions[s] is not src.domain.contiguous_dim:
        raise LoweringError(f"a {loop.stop!r}-wide vector read of gather T{out.name} does not "
                            f"step through T{src.name}'s stride-1 dim")


def _dim_stepped_by(lid, tv: TensorView, exact):
    """The logical ID of `tv` that loop ID `lid` steps through element by element, or None."""
    from ..ir.iter_domain import Merge, Split
    logical = tv.domain.logical_no_reductions
    x = lid
    while True:
        hit = next((i for i in logical if exact.mapped(x, i)), None)
        if hit is not None:
            return hit
        d = x.definition
        if isinstance(d, Split) and (x is d.inner or d.inner.const_extent == 1):
            x = d.in_id
        elif isinstance(d, Merge):
            x = d.outer if d.inner.is_broadcast else d.inner
        else:
            return None


def _is_vector_op(op: K.TensorOp, loop: K.ForLoop) -> bool:
    """A copy, or the draws of a random op at consecutive row-major indices from a multiple of
    4 (index = first + lane, first provably a multiple of 4, the loop's width too): their
    Philox blocks are whole (codegen's pf::philox_*_vec). Random draws at other indices (a row
    of a broadcast tensor: f % n + lane) run lane by lane in the unrolled loop."""
    if isinstance(op.expr, GatherOp):
        # One index for all lanes, or no vector read (the lanes read where they point).
        return _lane_free(op.ins[1], loop.var)
    if isinstance(op.expr, RandOp):
        terms = _terms(op.ins[4])
        lane = [t for t in terms if repr(t) == repr(loop.var)]
        rest = [t for t in terms if repr(t) != repr(loop.var)]
        return (loop.stop.value % 4 == 0 and len(lane) == 1
                and all(_lane_free(t, loop.var) and _multiple_of(t, 4) for t in rest))
    return _is_copy(op)


def _terms(e) -> list:
    """The terms of a sum (e itself if it is none)."""
    if isinstance(e, K.Bin) and e.op == "+":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _multiple_of(e, m: int) -> bool:
    """Whether expression e is a multiple of m whatever its variables hold (sums of such
    terms, products with such a factor)."""
    if isinstance(e, K.Const):
        return e.value % m == 0
    if isinstance(e, K.Bin) and e.op == "+":
        return _multiple_of(e.a, m) and _multiple_of(e.b, m)
    if isinstance(e, K.Bin) and e.op == "*":
        return _multiple_of(e.a, m) or _multiple_of(e.b, m)
    return False


def _is_copy(op: K.TensorOp) -> bool:
    if isinstance(op.expr, (WindowOp, GatherOp)):
        return True             # a read of its source (of out's dtype), or its fill (or 0)
    if not isinstance(op.expr, LoadStoreOp):
        return False
    src = op.expr.inputs[0]
    return src.dtype == op.expr.outputs[0].dtype


def _vec_access(a, width: int, kernel):
    if isinstance(a, K.TensorIndex):
        a = dataclasses.replace(a, vector=width)
        if a.buffer.memory == "global":
            prev = kernel.vector_widths.get(a.buffer.name, width)
            kernel.vector_widths[a.buffer.name] = max(prev, width)
    return a

"""Pass `build_loops`: the loop nest of every expression.

Before: a scheduled fusion (each tensor's loop domain and compute-at position).
After:  kernel.body holds ForLoops with one TensorOp per fusion expression:

    T2 = cast(T0); T3 = sum(T2) (T2 inlined into T3 at 2, T3 at 1 into T4)
      for i0 in blockIdx.x:            <- owned by T4, shared by all
        for i1 in 0..4:                <- T3's own loops
          for i2 in threadIdx.x:
            T2 = cast(T0)
            T3 += T2
        T4 = T3 * ...

Expressions that share loops are emitted inside one ForLoop: at each depth the expressions are
grouped by the loop they run in next, and the groups are ordered by their data dependencies.
Among the groups whose inputs are ready, those that only copy fusion inputs from global memory
into registers go first: the loads of every row input of a persistent row are then in flight
together, instead of one input's load waiting behind the reduction over another (layernorm
backward loaded dy, reduced it through a block all-reduce, and only then loaded x: two memory
latencies per row where one suffices; with 2-byte loads of odd rows, the only ones such rows
allow, the latency is all there is to hide).
Limitation: a schedule that needs one loop twice (a cycle between two groups) is refused.
"""
from __future__ import annotations

from ..ir.exprs import LoadKind, LoadStoreOp
from ..ir.iter_domain import ParallelType
from ..ir.tensor import MemoryType, TensorView
from ..kir import nodes as K
from ..kir.verifier import Rule, establishes
from .context import LoweringError
from .indexing import scalar_to_kexpr

_SPECIAL = {
    ParallelType.TIDx: "threadIdx.x", ParallelType.TIDy: "threadIdx.y",
    ParallelType.TIDz: "threadIdx.z", ParallelType.BIDx: "blockIdx.x",
    ParallelType.BIDy: "blockIdx.y", ParallelType.BIDz: "blockIdx.z",
}


def _ops_in_their_nests(v, s, scope) -> None:
    """The ForLoops around a TensorOp are the loops of its nest, in order (less those a pass
    replaced or folded: kernel.replaced_loops)."""
    if not isinstance(s, K.TensorOp) or not s.nest:
        return
    enclosing = [f.loop for f in scope.loops() if f.loop is not None]
    expected = [lp for lp in s.nest if id(lp) not in v.k.replaced_loops]
    if [id(x) for x in enclosing] != [id(x) for x in expected]:
        v.fail(f"the loops around the op {enclosing} are not its nest {expected}", s)


def _every_loop_emitted(v) -> None:
    for lp in v.k.ctx.all_loops():
        if id(lp) not in v.loops_seen and id(lp) not in v.k.replaced_loops:
            v.fail(f"lowering loop {lp!r} is never emitted")


def _fusion_operands(v, s, scope) -> None:
    from ..ir.scalar import Scalar
    if not isinstance(s, K.TensorOp):
        return
    for what, x in [("the output", s.out)] + [(f"input {k}", i) for k, i in enumerate(s.ins)]:
        if isinstance(x, (K.TensorIndex, K.ScalarValue)):
            v.fail(f"{what} is already indexed ({x!r}) before index_and_predicate", s)
        if not isinstance(x, (TensorView, Scalar)):
            v.fail(f"{what} is {type(x).__name__}, not a fusion Val", s)


# Each lowering loop is emitted once, around the ops of its nests.
LOOP_NESTS = Rule("loop nests", stmt=_ops_in_their_nests, kernel=_every_loop_emitted)
# TensorOps hold fusion Vals until index_and_predicate gives them indexed accesses.
FUSION_OPERANDS = Rule("fusion operands", stmt=_fusion_operands)


@establishes(LOOP_NESTS, FUSION_OPERANDS)
def build_loops(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    items = []
    for k, e in enumerate(ctx.exprs):
        out = e.outputs[0]
        if isinstance(out, TensorView):
            items.append((k, e, ctx.nest(out)))
    emitted: set = set()
    kernel.body = _emit(items, 0, ctx, emitted)
    return kernel


def _emit(items, depth: int, ctx, emitted: set) -> list:
    units: list = []       # ("expr", item) or ("loop", Loop, [items])
    by_loop: dict = {}
    for it in items:
        _, e, nest = it
        if len(nest) == depth:
            units.append(["expr", it])
        else:
            lp = nest[depth]
            if id(lp) not in by_loop:
                by_loop[id(lp)] = ["loop", lp, []]
                units.append(by_loop[id(lp)])
            by_loop[id(lp)][2].append(it)
    order = _order_units(units)
    body: list = []
    for u in order:
        if u[0] == "expr":
            _, e, nest = u[1]
            body.append(_tensor_op(e, nest))
            continue
        lp, sub = u[1], u[2]
        if id(lp) in emitted:
            raise LoweringError(f"the schedule needs {lp!r} twice: expressions computed in it "
                                "depend on others computed outside it in between")
        emitted.add(id(lp))
        body.append(_for_loop(lp, _emit(sub, depth + 1, ctx, emitted), ctx))
    return body


def _unit_exprs(u) -> list:
    return [u[1][1]] if u[0] == "expr" else [it[1] for it in u[2]]


def _order_units(units: list) -> list:
    """Topological order of units by data dependency: of the ready ones, register loads of
    fusion inputs first (_loads_inputs), then fusion order."""
    produced_by: dict = {}
    for k, u in enumerate(units):
        for e in _unit_exprs(u):
            for o in e.outputs:
                produced_by[o] = k
    deps = []
    for k, u in enumerate(units):
        d = set()
        for e in _unit_exprs(u):
            for i in e.inputs:
                j = produced_by.get(i)
                if j is not None and j != k:
                    d.add(j)
        deps.append(d)
    loads = [all(_loads_input(e) for e in _unit_exprs(u)) for u in units]
    first = [min(it[0] for it in ([u[1]] if u[0] == "expr" else u[2])) for u in units]
    done: list = []
    placed: set = set()
    while len(done) < len(units):
        ready = [k for k in range(len(units)) if k not in placed and deps[k] <= placed]
        if not ready:
            names = [repr(units[k][1]) for k in range(len(units)) if k not in placed]
            raise LoweringError(f"cyclic dependency between loops {names}: the schedule inlines "
                                "tensors into loops that need each other's results")
        k = min(ready, key=lambda x: (not loads[x], first[x]))
        placed.add(k)
        done.append(units[k])
    return done


def _loads_input(e) -> bool:
    """A plain copy of a fusion input from global memory into registers. Only fusion inputs:
    a global intermediate (a grid reduction's workspace) is read after a grid barrier that
    the data dependencies alone do not show."""
    if not isinstance(e, LoadStoreOp) or e.load_kind != LoadKind.Set:
        return False
    src, out = e.inputs[0], e.outputs[0]
    return (isinstance(src, TensorView) and src.is_input() and src.memory_type == MemoryType.Global
            and isinstance(out, TensorView) and out.memory_type == MemoryType.Local)


def loop_var(lp, ctx) -> K.KExpr:
    if lp.var is None:
        special = _SPECIAL.get(lp.parallel)
        lp.var = K.Special(special) if special else ctx.new_loop_var()
    return lp.var


def _for_loop(lp, body, ctx) -> K.ForLoop:
    var = loop_var(lp, ctx)
    stop = scalar_to_kexpr(lp.extent, ctx.names)
    return K.ForLoop(var if isinstance(var, K.Var) else K.Var(repr(var)), K.Const(0), stop,
                     K.Const(1), body, parallel=lp.parallel.name, iter_domain=lp.promoted, loop=lp)


def _tensor_op(e, nest) -> K.TensorOp:
    from ..ir.exprs import ReductionOp
    return K.TensorOp(e, e.outputs[0], list(e.inputs), accumulate=isinstance(e, ReductionOp),
                      nest=list(nest))

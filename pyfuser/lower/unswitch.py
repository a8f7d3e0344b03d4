"""Pass `unswitch_loops`: the body of an Unswitch loop runs in one of two versions, without the bounds
checks of the loops inside it where their last iterations pass those checks, else as it was.

A schedule puts an Unswitch axis of extent 1 (nvFuser's unswitch) inside a serial loop whose
steps are all in bounds but the last: a looped row's steps, a reduction's serial steps. Each
element then stops paying its own check (a compare, and a branch around everything it guards:
about four instructions per element of a row walked with 2-byte loads).

Before: for s in 0..S:
          for us in 0..1 (Unswitch):
            for u in 0..8: if ((s * 8 + u) * 1024 + tid < n) T1[u] = T0[...]
After:  for s in 0..S:
          if ((s * 8 + 7) * 1024 + tid < n)            <- each check at the inner loops' last values
            for us in 0..1: for u in 0..8: T1[u] = T0[...]
          else
            for us in 0..1: for u in 0..8: if ((s * 8 + u) * 1024 + tid < n) T1[u] = T0[...]

A check is dropped from the first version only where it is a conjunct `a < b` (or `a <= b`) whose
b is free of the inner loops' variables and whose a is non-decreasing in each of them (sums,
products by non-negative constants, divisions by positive constants, min and max of such): its
value at every inner variable's last value then implies it at all of them. Other conjuncts (a
thread predicate, the lower bound of a pad) stay on the ops in both versions. An Unswitch loop
whose body holds anything but loops, ops, allocations, conditionals and comments (a barrier, a
block reduction), or whose inner loops do not start at 0 with step 1 and an extent free of the
inner variables, or whose ops have no such check, becomes a serial loop as it was.

Limits: only Serial, Unroll, Vectorize and Unswitch loops inside count as inner loops (a loop
bound to a thread keeps its index per thread: the condition is evaluated by each thread).
"""
from __future__ import annotations

import dataclasses

from ..kir import nodes as K
from ..kir.rewrite import Rewriter, fresh_stmts, subexprs, substitute
from ..kir.verifier import establishes

INNER = ("Serial", "Unroll", "Vectorize", "Unswitch")
_ALLOWED = (K.ForLoop, K.TensorOp, K.Allocate, K.IfThenElse, K.Comment)


@establishes()
def unswitch_loops(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _Unswitch().rewrite(kernel.body)
    return kernel


class _Unswitch(Rewriter):
    def visit_ForLoop(self, s: K.ForLoop):
        s = self.default_stmt(s)
        if s.parallel != "Unswitch":
            return s
        return _versions(dataclasses.replace(s, parallel="Serial"))


def _versions(loop: K.ForLoop):
    """`loop` (extent 1, now serial) in its two versions, or as it is (module docstring)."""
    last = {}
    if not _inner_last_values(loop, last):
        return loop
    checks, _, cond = bound_checks(list(_ops(loop.body)), last)
    if not checks:
        return loop
    fast = _Drop(checks).rewrite(fresh_stmts([loop]))
    slow = dataclasses.replace(loop, label=K.UNSWITCH_ELSE)
    return K.IfThenElse(cond, fast, [slow])


def bound_checks(ops: list, last: dict) -> tuple[set, bool, K.KExpr | None]:
    """The bounds checks of `ops` that the variables' last values imply at all of theirs
    (`last`: variable -> its last value): (the ids of those conjuncts, whether every conjunct
    that uses a variable of `last` is one, the condition they hold under: each at the last
    values, once; None without them)."""
    checks, every, at_last = set(), True, {}
    for op in ops:
        for c in _conjuncts(op.predicate):
            if _droppable(c, last):
                checks.add(id(c))
                e = substitute(c, last)
                at_last.setdefault(repr(e), e)
            elif _uses(c, set(last)):
                every = False
    cond = None
    for e in at_last.values():
        cond = e if cond is None else K.Bin("&&", cond, e)
    return checks, every, cond


def without(pred, checks: set):
    """Predicate `pred` less its conjuncts in `checks` (ids)."""
    out = K.Const(True, "bool")
    for c in _conjuncts(pred):
        if id(c) not in checks:
            out = c if isinstance(out, K.Const) else K.Bin("&&", out, c)
    return out


def _inner_last_values(loop: K.ForLoop, last: dict) -> bool:
    """Fill `last` with each inner loop variable's last value; False where the body holds a
    statement the versions cannot repeat or an inner loop of another form."""
    stack = [loop]
    while stack:
        s = stack.pop()
        if not isinstance(s, _ALLOWED):
            return False
        if isinstance(s, K.ForLoop):
            if s.parallel in INNER:
                if not (isinstance(s.start, K.Const) and s.start.value == 0
                        and isinstance(s.step, K.Const) and s.step.value == 1):
                    return False
                last[s.var] = K.sub(s.stop, K.Const(1))
            stack += s.body
        elif isinstance(s, K.IfThenElse):
            stack += s.then_body + s.else_body
    inner = set(last)
    return not any(_uses(stop, inner) for stop in last.values())


def _ops(body: list):
    for s in body:
        if isinstance(s, K.TensorOp):
            yield s
        elif isinstance(s, K.ForLoop):
            yield from _ops(s.body)
        elif isinstance(s, K.IfThenElse):
            yield from _ops(s.then_body)
            yield from _ops(s.else_body)


def _conjuncts(e):
    if isinstance(e, K.Bin) and e.op == "&&":
        yield from _conjuncts(e.a)
        yield from _conjuncts(e.b)
    else:
        yield e


def _uses(e, variables) -> bool:
    return any(isinstance(x, K.Var) and x in variables for x in subexprs(e))


def _non_decreasing(e, variables) -> bool:
    """e is non-decreasing in each variable of `variables` (module docstring)."""
    if not _uses(e, variables) or isinstance(e, K.Var):
        return True
    if not isinstance(e, K.Bin):
        return False
    if e.op in ("+", "min", "max"):
        return _non_decreasing(e.a, variables) and _non_decreasing(e.b, variables)
    if e.op == "*":
        return any(isinstance(k, K.Const) and isinstance(k.value, int) and k.value >= 0
                   and _non_decreasing(f, variables) for k, f in ((e.a, e.b), (e.b, e.a)))
    if e.op in ("/", "ceilDiv"):
        return (isinstance(e.b, K.Const) and isinstance(e.b.value, int) and e.b.value > 0
                and _non_decreasing(e.a, variables))
    return False


def _droppable(c, last: dict) -> bool:
    inner = set(last)
    return (isinstance(c, K.Bin) and c.op in ("<", "<=") and _uses(c.a, inner)
            and not _uses(c.b, inner) and _non_decreasing(c.a, inner))


class _Drop(Rewriter):
    """The ops' predicates without the conjuncts in `checks` (ids)."""

    def __init__(self, checks: set):
        self.checks = checks

    def visit_TensorOp(self, s: K.TensorOp):
        return dataclasses.replace(s, predicate=without(s.predicate, self.checks))

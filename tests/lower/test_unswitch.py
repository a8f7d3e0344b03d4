"""The unswitch pass (lower/unswitch.py) on hand-built kernel IR: which checks leave the unchecked
version, the condition it runs under, and the loops it leaves alone. The looped inner persistent
kernels that use it run on the interpreter in tests/schedule/test_inner_looped.py (rows of 1001
in steps of 128: seven unchecked steps and a checked one)."""
from pyfuser.kir import nodes as K
from pyfuser.lower.unswitch import _non_decreasing, unswitch_loops

TID = K.Special("threadIdx.x")
N = K.Var("i1")


def _op(pred):
    return K.TensorOp(expr=None, out=K.Const(0), ins=[], predicate=pred)


def _nest(pred_of, inner_stop=K.Const(8), extra=()):
    """for s: for us (Unswitch): for u in [0, inner_stop): op(pred_of(s, u))"""
    s, us, u = K.Var("s"), K.Var("us"), K.Var("u")
    inner = K.ForLoop(u, K.Const(0), inner_stop, K.Const(1), [_op(pred_of(s + us, u)), *extra])
    uns = K.ForLoop(us, K.Const(0), K.Const(1), K.Const(1), [inner], parallel="Unswitch")
    return K.ForLoop(s, K.Const(0), K.Var("S"), K.Const(1), [uns])


class _Kernel:
    def __init__(self, body):
        self.body = body


def _run(loop):
    k = _Kernel([loop])
    unswitch_loops(k)
    (outer,) = k.body
    (stmt,) = outer.body
    return stmt


def _in_bounds(s, u):
    return K.Bin("<", (s * 8 + u) * 1024 + TID, N)


def test_bounds_checks_leave_the_unchecked_version():
    stmt = _run(_nest(_in_bounds))
    assert isinstance(stmt, K.IfThenElse)
    assert repr(stmt.cond) == repr(K.Bin("<", (K.Var("s") * 8 + 7) * 1024 + TID, N))
    (fast,), (slow,) = stmt.then_body, stmt.else_body
    assert fast.parallel == slow.parallel == "Serial"
    assert slow.label == K.UNSWITCH_ELSE and fast.label == ""
    (fast_op,) = fast.body[0].body
    (slow_op,) = slow.body[0].body
    assert isinstance(fast_op.predicate, K.Const) and fast_op.predicate.value is True
    assert repr(slow_op.predicate) == repr(_in_bounds(K.Var("s") + K.Var("us"), K.Var("u")))


def test_other_conjuncts_stay_on_both_versions():
    # A thread predicate and a lower bound (a pad's) are not implied by the last iteration.
    def pred(s, u):
        lower = K.Bin(">=", s * 8 + u, K.Var("p"))
        return K.Bin("&&", K.Bin("&&", _in_bounds(s, u), K.Bin("==", TID, K.Const(0))), lower)
    stmt = _run(_nest(pred))
    (fast_op,) = stmt.then_body[0].body[0].body
    kept = repr(fast_op.predicate)
    assert "threadIdx.x == 0" in kept and ">= p" in kept and "1024" not in kept


def test_a_check_that_may_decrease_is_not_dropped():
    # (s * 8 + u) % 3 < n: the last iteration passing says nothing of the others.
    stmt = _run(_nest(lambda s, u: K.Bin("<", K.Bin("%", s * 8 + u, K.Const(3)), N)))
    assert isinstance(stmt, K.ForLoop) and stmt.parallel == "Serial"


def test_a_barrier_inside_keeps_one_version():
    stmt = _run(_nest(_in_bounds, extra=(K.BlockSync(),)))
    assert isinstance(stmt, K.ForLoop) and stmt.parallel == "Serial"


def test_an_inner_extent_of_an_inner_variable_keeps_one_version():
    s, us, u, v = K.Var("s"), K.Var("us"), K.Var("u"), K.Var("v")
    inner = K.ForLoop(v, K.Const(0), u + 1, K.Const(1), [_op(_in_bounds(s + us, v))])
    outer_u = K.ForLoop(u, K.Const(0), K.Const(4), K.Const(1), [inner])
    uns = K.ForLoop(us, K.Const(0), K.Const(1), K.Const(1), [outer_u], parallel="Unswitch")
    stmt = _run(K.ForLoop(s, K.Const(0), K.Var("S"), K.Const(1), [uns]))
    assert isinstance(stmt, K.ForLoop) and stmt.parallel == "Serial"


def test_non_decreasing_forms():
    u = K.Var("u")
    inner = {u}
    assert _non_decreasing((u * 8 + 3) * 1024 + TID, inner)
    assert _non_decreasing(K.Bin("/", u * 8, K.Const(3)), inner)
    assert _non_decreasing(K.Bin("min", u, K.Var("n")), inner)
    assert not _non_decreasing(K.Bin("-", K.Var("n"), u), inner)
    assert not _non_decreasing(K.Bin("*", u, K.Var("stride")), inner)    # sign unknown
    assert not _non_decreasing(K.Bin("*", u, K.Const(-2)), inner)
    assert not _non_decreasing(K.Bin("/", u, K.Var("d")), inner)

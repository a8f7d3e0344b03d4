"""Pass `shared_divisor_quotients`: float quotients by a divisor their loop shares are computed
through the divisor's reciprocal; their range is checked once, for the outermost loop around
them that can run again, which runs again with IEEE division where a quotient left the range.

IEEE division (div.rn) costs about ten instructions per quotient on sm_90: a reciprocal, its
refinement, three multiply-adds, a check of both operands' range (FCHK) and a branch around a
slow path, whose reconvergence the compiler brackets (BSSY/BSYNC). The compiler keeps all of it
per quotient even where the divisor is the same (a row's sum dividing the row's elements in a
softmax, cross-entropy's dlogits): 35 SASS instructions per element of that dlogits loop,
against 18 for its form without the division. Here each quotient is a * y, y the divisor's
correctly rounded reciprocal (the compiler computes it once per divisor value), corrected by one
residual step (math.cuh `div_shared_divisor`): that is a / b exactly while the operands are in
a range, and each quotient clears a flag where they are not. About six instructions and no
branch per quotient.

The check is for a whole loop L: one that can run again and compute what it computed the first
time. Running it again costs nothing in the loop itself: its inputs are read again, not held
for a second run (held in registers, a row's step of loads would spill at the 32 registers of
a looped row's kernel).

Before:  for s in 0..S (rolled):                          # the steps over a row
           T32[*] = T0[...]                              # loads
           for u in 0..8 (unrolled):
             T20[0] = div(T6[0], T8[(j * 8) + u])        # T8: a row's sum, copied along the row
             ...; T31[u] = cast(T22[0])
           T23[...] = T31[0]<8>                          # stores
After:   CheckedQuotients(pf_quotients_ok0):
           fast:  for s in 0..S: ... T20[0] = div(T6[0], T8[...]) [clears pf_quotients_ok0] ...
           exact: for s in 0..S: <as it was>             # only if a quotient left the range

A division is taken when it is float32 (or computed in float32), of one element, and its
innermost loop L0 shares its divisor: a scalar that is not a power of two (the compiler divides
by those with an exact multiply), an element whose index does not use L0's variable, or a tensor
broadcast along L0's axis (at the quotient's position of L0 in its loop domain). Whether the
divisor is shared decides speed only, never values: the fast quotient is a / b for any divisor,
once checked.

L is the outermost loop around such divisions that can run again: it holds only loops,
conditionals, register allocations and TensorOps; none accumulates (reductions, scans), reports
bad indices (gathers, scatters, index checks) or writes shared memory; no buffer it writes that
outlives it (registers allocated outside it, global outputs) is read in it; and it reads at
most HELD_ELEMENTS register elements written before it one after another (all of them stay
alive until its check). Barriers, asynchronous copies and their mbarriers are other statement
kinds, so a loop around them is not taken. Divisions outside every such loop keep div.rn.

Limits: double divisions keep div.rn. The exact copy doubles the code of L (cold: it runs only
where a quotient left the range).
"""
from __future__ import annotations

import dataclasses
import math

from ..ir import scalar as S
from ..ir.dtype import DataType, compute_type
from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, GatherOp,
                        IndexCheckOp, LoadStoreOp, ScatterOp)
from ..ir.tensor import TensorView
from ..kir import nodes as K
from ..kir.rewrite import Rewriter, accesses, fresh_stmts, vars_in
from ..kir.verifier import Rule, establishes

# The most register elements written before a loop, other than one value copied throughout a
# buffer, that the loop may read and so hold until its check for a second run: a vector's
# worth. A loop over a row kept in registers reads all of it: held until the check, its
# elements stop dying one by one as the loop consumes them (an RMSNorm of [4096, 4096] written
# with a division took 80 registers instead of 48), so the check is per vector there.
HELD_ELEMENTS = 8
_SIDE_EFFECTS = (GatherOp, IndexCheckOp, ScatterOp)   # they report bad indices
_COPIES = (LoadStoreOp, BroadcastOp, ExpandOp)
_RERUNNABLE_STMTS = (K.TensorOp, K.Allocate, K.Comment, K.ForLoop, K.IfThenElse)
_THREAD_SCOPES = ("TIDx", "TIDy", "TIDz", "BIDx", "BIDy", "BIDz")


def _flags_in_fast_bodies(v) -> None:
    """A division that clears a flag is in the fast body of the CheckedQuotients of that flag."""
    inside = set()
    for x in K.walk(v.k.body):
        if isinstance(x, K.CheckedQuotients):
            inside |= {id(y) for y in K.walk(x.fast)
                       if isinstance(y, K.TensorOp) and y.quotient_flag == x.flag}
    for x in K.walk(v.k.body):
        if isinstance(x, K.TensorOp) and x.quotient_flag is not None and id(x) not in inside:
            v.fail(f"a division clears flag {x.quotient_flag} outside the fast copy of its "
                   "checked quotients", x)


CHECKED_QUOTIENTS = Rule("checked quotients", kernel=_flags_in_fast_bodies)


@establishes(CHECKED_QUOTIENTS)
def shared_divisor_quotients(kernel: K.Kernel) -> K.Kernel:
    if kernel.shared_divisor_quotients:      # the feature of that name, forced off: div.rn
        kernel.body = _SharedDivisor(kernel).rewrite(kernel.body)
    return kernel


class _SharedDivisor(Rewriter):
    def __init__(self, kernel: K.Kernel):
        self.kernel = kernel
        self.count = 0
        self.uniform = _uniform_buffers(kernel.body)

    def visit_ForLoop(self, s: K.ForLoop):
        if (s.parallel in _THREAD_SCOPES or not _runs_again_alike(s)
                or _held_elements(s, self.uniform) > HELD_ELEMENTS):
            return self.default_stmt(s)
        quotients = {id(op) for op, inner in _ops_with_their_loop([s], None)
                     if inner is not None and _shared_quotient(self.kernel, op, inner)}
        if not quotients:
            return s
        flag = f"pf_quotients_ok{self.count}"
        self.count += 1
        fast = fresh_stmts([s])
        for original, copy in zip(K.walk([s]), K.walk(fast)):
            if id(original) in quotients:
                copy.quotient_flag = flag
        exact = dataclasses.replace(s, label=K.QUOTIENTS_EXACT)
        return K.CheckedQuotients(flag, fast, [exact])


def _ops_with_their_loop(body: list, inner):
    """(TensorOp, the innermost loop of more than one iteration that a thread runs itself
    around it, or None) for `body`."""
    for s in body:
        if isinstance(s, K.TensorOp):
            yield s, inner
        elif isinstance(s, K.ForLoop):
            once = isinstance(s.stop, K.Const) and s.stop.value == 1
            yield from _ops_with_their_loop(
                s.body, inner if s.parallel in _THREAD_SCOPES or once else s)
        elif isinstance(s, K.IfThenElse):
            yield from _ops_with_their_loop(s.then_body, inner)
            yield from _ops_with_their_loop(s.else_body, inner)


def _shared_quotient(kernel: K.Kernel, op: K.TensorOp, loop: K.ForLoop) -> bool:
    """A float32 division of one element whose divisor `loop` shares (module docstring)."""
    e = op.expr
    if not (isinstance(e, BinaryOp) and e.op == BinaryOpType.Div and op.vector == 1
            and not op.accumulate and compute_type(e.operand_dtype) == DataType.Float):
        return False
    if not _varies_along(kernel, e, 0, op.ins[0], loop):
        return False        # one quotient for the whole loop, which the compiler divides once
    divisor = op.ins[1]
    if not isinstance(divisor, K.TensorIndex):
        value = S.const_value(e.inputs[1])
        return not (isinstance(value, (int, float)) and value != 0 and math.isfinite(value)
                    and math.frexp(value)[0] in (0.5, -0.5))
    return not _varies_along(kernel, e, 1, divisor, loop)


def _varies_along(kernel: K.Kernel, e: BinaryOp, k: int, operand, loop: K.ForLoop) -> bool:
    """Whether operand k of `e` (indexed as `operand`) may change along `loop`: it is a tensor
    element whose index uses loop's variable, unless the tensor is a broadcast along the axis
    loop iterates (its loop IterDomain at the quotient's position of that loop: the schedule
    gives a broadcast operand the loop domain of what reads it, its broadcast axes copied along
    the reader's), or one computed from such a broadcast only (a broadcast recomputed per
    element is a register written in the loop from an element that does not change)."""
    if not isinstance(operand, K.TensorIndex):
        return False
    tv = e.inputs[k]
    uses = loop.var.name in vars_in(operand.index)
    if not uses and operand.buffer.memory != "local":
        return False
    return not _broadcast_along(kernel, tv, e.outputs[0], loop)


def _broadcast_along(kernel: K.Kernel, tv, out, loop: K.ForLoop) -> bool:
    ctx = kernel.ctx
    if not isinstance(tv, TensorView) or ctx is None or loop.loop is None:
        return False
    positions = [j for j in range(len(out.domain.loop)) if ctx.loop_of.get((out, j)) is loop.loop]
    if len(positions) != 1 or len(tv.domain.loop) != len(out.domain.loop):
        return False
    return tv.domain.loop[positions[0]].is_broadcast


def _runs_again_alike(loop: K.ForLoop) -> bool:
    """Whether running `loop` again computes what running it once did (module docstring)."""
    inside, written, read = set(), set(), set()
    for s in K.walk([loop]):
        if not isinstance(s, _RERUNNABLE_STMTS):
            return False
        if isinstance(s, K.Allocate):
            if s.buffer.memory != "local":
                return False
            inside.add(id(s.buffer))
            continue
        if not isinstance(s, K.TensorOp):
            continue
        if (s.accumulate or s.carry is not None or s.scan_fixup
                or isinstance(s.expr, _SIDE_EFFECTS)):
            return False
        reads, writes = accesses(s)
        for w in writes:
            if w.buffer.memory == "shared":
                return False
            written.add(id(w.buffer))
        read |= {id(r.buffer) for r in reads}
    return not ((written - inside) & read)


def _uniform_buffers(body: list) -> set:
    """Register buffers that hold one value throughout (ids): every write copies one element
    whose index uses no loop variable (a row's statistic copied along the row: the compiler
    keeps one register for them all)."""
    uniform, other = set(), set()
    for s in K.walk(body):
        if isinstance(s, K.InitValue):
            continue
        if not isinstance(s, K.TensorOp):
            continue
        for w in accesses(s)[1]:
            if w.buffer.memory != "local":
                continue
            src = s.ins[0] if len(s.ins) == 1 else None
            if (isinstance(s.expr, _COPIES) and s.vector == 1 and isinstance(src, K.TensorIndex)
                    and not vars_in(src.index)):
                uniform.add(id(w.buffer))
            else:
                other.add(id(w.buffer))
    return uniform - other


def _held_elements(loop: K.ForLoop, uniform: set) -> int:
    """How many register elements written before `loop` it reads one after another (at
    most): per buffer allocated outside it and not uniform, the combinations of the variables
    of loops inside it that the reads' indices use (a loop of unknown extent counts as too
    many). An element read throughout the loop (a row's statistic) is not counted."""
    extents, inside = {}, set()
    for s in K.walk([loop]):
        if isinstance(s, K.ForLoop):
            stop = s.stop.value if isinstance(s.stop, K.Const) else None
            extents[s.var.name] = stop if isinstance(stop, int) else HELD_ELEMENTS + 1
        elif isinstance(s, K.Allocate):
            inside.add(id(s.buffer))
    held: dict = {}
    for s in K.walk([loop]):
        if not isinstance(s, K.TensorOp):
            continue
        for r in accesses(s)[0]:
            b = r.buffer
            if b.memory != "local" or id(b) in inside or id(b) in uniform:
                continue
            names = vars_in(r.index) & set(extents)
            if not names:
                continue        # one element throughout the loop (a row's statistic)
            n = 1
            for name in names:
                n *= extents[name]
            size = b.size.value if isinstance(b.size, K.Const) else n
            held[id(b)] = min(size, held.get(id(b), 0) + n * r.vector)
    return sum(held.values())

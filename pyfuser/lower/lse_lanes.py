"""Pass `fold_lse_lanes`: a one-pass logsumexp folds each vector's lanes into the thread's
running key at once, not one lane at a time.

A one-pass logsumexp (schedule/logsumexp.py) keeps a running key (m, s) per thread and combines
each element into it: one exp, two selects and a NaN-propagating max per element, about 10 SASS
instructions. A row of bf16 read at memory speed leaves an SM about 8 elements a clock, and
that combine per element kept the kernel below the memory's speed (90% of a copy on the H200).
A vector's lanes are in registers together, so their largest value m can be found first and
exp(lane - m) summed against it: a max, a subtraction, a multiply, an ex2 and an add per lane,
and one combine per vector (math.cuh `lse_fold_lanes`; 99% of a copy on the H200, 2.5x
torch.compile: docs/performance.md, session 24).

Before:  for j in 0..8 (unrolled):                     # a vector's lanes
           alloc local float T1[1]
           alloc local int64 T10[1]
           T1[0] = cast(T14[(j3 * 8) + j])
           T10[0] = lse_key(T1[0])
           T16[0] = logsumexp(T10[0]) (accumulate)      # T16: the thread's running key
After:   alloc local float T1[8]
         for j in 0..8 (unrolled):
           T1[j] = cast(T14[(j3 * 8) + j])
         LseFoldLanes(T16[0], T16[0], [T1[0], ..., T1[7]])

Taken: an unrolled serial loop of 2 to MAX_LANES iterations (from 0, step 1) whose last two
statements are an element's key and its unpredicated combine into an accumulator no other
statement of the loop touches, at an index free of the loop's variable. The key is of either
a float32 register allocated in the loop and used there only at element 0 (it becomes one
element per lane, as above), or float32 elements the loop reads and does not write (an fp32
row's vector: the fold reads them directly, and the loop goes where nothing else is left in
it; the fold then stands for its lowering loop in the verifier's loop nests). Special values
give what the per-element combines give: a NaN lane makes m NaN, a lane of +inf makes s NaN
(its exp(inf - inf)), and a vector all -inf counts its lanes.

Limits: only the innermost lane loop of a serial reduction; block, grid and cluster combines of
keys, and lanes combined under a predicate each (an unswitched loop's checked copy, rows that
hold no vector) keep combining keys.
"""
from __future__ import annotations

import dataclasses

from ..ir.dtype import DataType
from ..ir.exprs import ReductionOp, ReductionOpType, UnaryOp, UnaryOpType
from ..kir import nodes as K
from ..kir.rewrite import Rewriter, accesses, substitute, vars_defined, vars_in, walk
from ..kir.verifier import Rule, establishes

# The most lanes folded at once: a vector of 16-bit values is 8, of 8-bit ones 16.
MAX_LANES = 16


def _const(e, value=None) -> bool:
    return isinstance(e, K.Const) and (value is None or e.value == value)


def _element0(t, buffer=None) -> bool:
    return (isinstance(t, K.TensorIndex) and t.vector == 1 and _const(t.index, 0)
            and (buffer is None or t.buffer is buffer))


def _folds_only_lanes(v) -> None:
    for s in walk(v.k.body):
        if isinstance(s, K.LseFoldLanes):
            if not 2 <= len(s.lanes) <= MAX_LANES:
                v.fail(f"folds {len(s.lanes)} lanes (2 to {MAX_LANES})", s)
            if s.out.buffer is not s.acc.buffer or s.out.buffer.dtype != DataType.Int64:
                v.fail("a lane fold writes another element than the int64 key it reads", s)
            if any(x.buffer.dtype != DataType.Float for x in s.lanes):
                v.fail("a lane fold reads lanes that are not float32", s)


LANES_FOLDED = Rule("lse lanes folded", kernel=_folds_only_lanes)


@establishes(LANES_FOLDED)
def fold_lse_lanes(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _Fold().rewrite(kernel.body)
    return kernel


class _Fold(Rewriter):
    def visit_ForLoop(self, s: K.ForLoop):
        s = self.default_stmt(s)        # inner loops first
        folded = _fold(s)
        return folded if folded is not None else s


class _Lanes(Rewriter):
    """Element 0 of the lane register becomes element `var` of the lanes buffer."""

    def __init__(self, value: K.Buffer, lanes: K.Buffer, var: K.Var):
        self.value, self.lanes, self.lane = value, lanes, var

    def tensor_index(self, t: K.TensorIndex):
        if t.buffer is self.value:
            return K.TensorIndex(self.lanes, self.lane, t.vector)
        return self.default_expr(t)


def _fold(loop: K.ForLoop):
    """[the lanes' allocation, the loop without the keys, the fold], or None where `loop` is
    not a vector's lanes combined one by one."""
    if not (loop.unroll and loop.parallel == "Serial" and _const(loop.start, 0)
            and _const(loop.step, 1) and _const(loop.stop)
            and isinstance(loop.stop.value, int) and 2 <= loop.stop.value <= MAX_LANES):
        return None
    body = loop.body
    if len(body) < 2:
        return None
    key, combine = body[-2], body[-1]
    if not (isinstance(key, K.TensorOp) and isinstance(key.expr, UnaryOp)
            and key.expr.op == UnaryOpType.LseKey and key.vector == 1 and key.carry is None
            and _const(key.predicate, True) and len(key.ins) == 1 and _element0(key.out)
            and isinstance(key.ins[0], K.TensorIndex) and key.ins[0].vector == 1
            and key.ins[0].buffer.dtype == DataType.Float):
        return None
    if not (isinstance(combine, K.TensorOp) and combine.accumulate
            and isinstance(combine.expr, ReductionOp)
            and combine.expr.op == ReductionOpType.LogSumExp and combine.vector == 1
            and _const(combine.predicate, True) and len(combine.ins) == 1
            and _element0(combine.ins[0], key.out.buffer)
            and isinstance(combine.out, K.TensorIndex) and combine.out.vector == 1):
        return None
    value, key_buffer, acc = key.ins[0].buffer, key.out.buffer, combine.out
    allocated = {id(s.buffer) for s in body if isinstance(s, K.Allocate)}
    if (id(key_buffer) not in allocated or acc.buffer in (value, key_buffer)
            or loop.var.name in vars_in(acc.index)):
        return None
    per_lane = id(value) in allocated        # a register the loop computes each lane into
    if per_lane and not (value.memory == "local" and _const(value.size, 1)
                         and _element0(key.ins[0])):
        return None
    rest = [s for s in body[:-2]
            if not (isinstance(s, K.Allocate) and s.buffer is key_buffer
                    or per_lane and isinstance(s, K.Allocate) and s.buffer is value)]
    for s in walk(rest):
        if isinstance(s, K.Allocate):
            continue
        reads, writes = accesses(s)
        if any(t.buffer in (acc.buffer, key_buffer) for t in reads + writes):
            return None     # the running key or the element's key used elsewhere in the loop
        if per_lane and any(t.buffer is value and not _element0(t) for t in reads + writes):
            return None
        if not per_lane and any(t.buffer is value for t in writes):
            return None     # lanes read where the loop writes them
    if not per_lane and vars_in(key.ins[0].index) & vars_defined(rest):
        return None         # lanes indexed by what the loop defines: not readable after it
    count = loop.stop.value
    if per_lane:
        # Each lane's value in an element of its own, read after the loop.
        lanes_buffer = K.Buffer(value.name, value.dtype, "local", K.Const(count), value.tv,
                                value.align)
        new_loop = dataclasses.replace(loop, body=_Lanes(value, lanes_buffer, loop.var)
                                       .rewrite(rest))
        lanes = [K.TensorIndex(lanes_buffer, K.Const(i)) for i in range(count)]
        before = [K.Allocate(lanes_buffer), new_loop]
    else:
        # The lanes are elements the loop reads (a float32 vector loaded before it).
        lanes = [substitute(key.ins[0], {loop.var: K.Const(i)}) for i in range(count)]
        before = [dataclasses.replace(loop, body=rest)] if rest else []
    # Where the loop is gone, the fold stands for its lowering loop (the verifier's loop nests:
    # an unswitched loop's checked copy may keep the loop, its lanes predicated one by one).
    return before + [K.LseFoldLanes(acc, dataclasses.replace(acc), lanes,
                                    loop=None if before else loop.loop)]


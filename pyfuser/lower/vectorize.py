"""Pass `vectorize_and_unroll`: vector memory accesses and unrolled loops.

Before: for v in 0..4 (Vectorize): T1[v] = T0[base + v]
After:  T1[0..4) = T0[base .. base + 4)     one 8- or 16-byte access (TensorIndex.vector = 4)

A copy between memories (LoadStoreOp of one dtype) in a Vectorize loop becomes one vector access
at the loop's first element; one-iteration loops between the two (a trailing broadcast dim) fold
away. Any other op in a Vectorize loop runs in an unrolled loop over registers, and so does a
Vectorize loop of one iteration (a vectorized broadcast axis runs once). Serial loops of
small constant extent, and Unroll loops, are unrolled so that register arrays they index stay in
registers.
Correctness of a vector access rests on the scheduler having vectorized the inner split of a
tensor's innermost contiguous dim; the kernel records, per global tensor, the vector width whose
divisibility and alignment the executor checks before each launch.
"""
from __future__ import annotations

from ..ir.exprs import LoadStoreOp
from ..kir import nodes as K
from .substitute import substitute

UNROLL_LIMIT = 32


def vectorize_and_unroll(kernel: K.Kernel) -> K.Kernel:
    kernel.body = _rewrite(kernel.body, kernel)
    return kernel


def _rewrite(body: list, kernel) -> list:
    out = []
    for s in body:
        if isinstance(s, K.ForLoop):
            s.body = _rewrite(s.body, kernel)
            if s.parallel == "Vectorize":
                out.extend(_vectorize(s, kernel))
                continue
            ext = s.stop.value if isinstance(s.stop, K.Const) else None
            if s.parallel == "Unroll" or (s.parallel == "Serial" and ext is not None and ext <= UNROLL_LIMIT):
                s.unroll = True
        elif isinstance(s, K.IfThenElse):
            s.then_body = _rewrite(s.then_body, kernel)
            s.else_body = _rewrite(s.else_body, kernel)
        out.append(s)
    return out


def _vectorize(loop: K.ForLoop, kernel) -> list:
    width = loop.stop.value
    first_lane = {loop.var: K.Const(0)}
    collapsed: list = []
    ops = _ops_run_once_per_lane(loop.body, first_lane, collapsed)
    if width == 1 or ops is None or not all(_is_copy(op) for op in ops):
        loop.unroll = True
        loop.parallel = "Serial"
        return [loop]
    kernel.replaced_loops.update(id(lp.loop) for lp in collapsed if lp.loop is not None)
    out = []
    for op in ops:
        op.vector = width
        op.out = _vec_access(substitute(op.out, first_lane), width, kernel)
        op.ins = [_vec_access(substitute(i, first_lane), width, kernel) for i in op.ins]
        op.predicate = substitute(op.predicate, first_lane)
        out.append(op)
    return out


def _ops_run_once_per_lane(body: list, fixed: dict, collapsed: list) -> list | None:
    """The TensorOps of a vector loop's body, or None if it holds anything else.

    Loops of one iteration are looked through (their variables are added to `fixed` at their
    start, the loops to `collapsed`): a tensor whose loop nest ends in a size-1 broadcast dim
    after the vectorized one, such as the cache of a [1, M, N] input, puts that loop inside the
    vector loop.
    """
    ops = []
    for s in body:
        if isinstance(s, K.TensorOp):
            ops.append(s)
        elif (isinstance(s, K.ForLoop) and s.parallel == "Serial"
              and isinstance(s.start, K.Const) and isinstance(s.stop, K.Const)
              and s.stop.value - s.start.value == 1):
            fixed[s.var] = s.start
            collapsed.append(s)
            inner = _ops_run_once_per_lane(s.body, fixed, collapsed)
            if inner is None:
                return None
            ops.extend(inner)
        else:
            return None
    return ops


def _is_copy(op: K.TensorOp) -> bool:
    if not isinstance(op.expr, LoadStoreOp):
        return False
    src = op.expr.inputs[0]
    return src.dtype == op.expr.outputs[0].dtype


def _vec_access(a, width: int, kernel):
    if isinstance(a, K.TensorIndex):
        a.vector = width
        if a.buffer.memory == "global":
            prev = kernel.vector_widths.get(a.buffer.name, width)
            kernel.vector_widths[a.buffer.name] = max(prev, width)
    return a

"""logsumexp in one pass: the max of a tensor and the sum of exp(x - max) over the same dims,
found in a fusion and made one reduction of (max, sum) keys, so that the dims are read once.

    Before:  M = max(X, D);  B = broadcast(M, D);  S = sub(X, B);  E = exp(S);  R = sum(E, D)
    After:   K = lse_key(X);  KR = logsumexp(K, D);  M' = lse_max(KR);  R' = lse_sum(KR)
             (every use of M reads M', of R reads R'; B now broadcasts M')

A key is an int64 holding a running (m, s) in float32s: the largest element so far and the sum of
exp(x - m) over them (runtime/lse_key.py, pf::lse_key in math.cuh); two keys combine with one exp.
Without the rewrite the sum needs the max first: over rows too long to keep on chip (a
vocabulary's 128K logits) the plan is two reduction kernels, each reading the rows (issue 16's
logsumexp, cross-entropy's forward). With it, one reduction kernel reads them once.

Taken only where S and E have no other use: a softmax (E also divided by R) or a log-softmax
(S also an output along D) keeps its two reductions, whose row the persistent schedulers keep on
chip where it fits, and whose E it reads there again (the key would add an exp per element). X
must be float32 (the key holds float32s): a float64 fusion keeps its reductions. The answers are
the two reductions': NaN where an element is +inf or the largest is -inf (exp(inf - inf),
exp(-inf - -inf)), -inf and 0 over no elements; the sum is rounded differently (each combine
rescales the partial sum), as a block reduction's order rounds differently from a serial one.
"""
from __future__ import annotations

from .. import options
from ..ir import arith
from ..ir.dtype import DataType
from ..ir.exprs import (LSE_IDENTITY, BinaryOp, BinaryOpType, BroadcastOp, ReductionOp,
                        ReductionOpType, UnaryOp, UnaryOpType)
from ..ir.tensor import TensorView


def fuse_logsumexp(fusion):
    """`fusion`, or a clone of it with every max / sum-of-exp pair (module docstring) made one
    logsumexp reduction. The fusion given is left as it is (the reference evaluator's). Off
    where the option `one_pass_logsumexp` is disabled."""
    if options.current().is_enabled("one_pass_logsumexp") is False or not _pairs(fusion):
        return fusion
    clone, _ = fusion.clone()
    for max_op, sum_op in _pairs(clone):
        _rewrite(clone, max_op, sum_op)
    return clone


def fuse_logsumexp_for_passes(fusion) -> None:
    """Make every max / sum-of-exp pair of `fusion` (a schedule's own copy) one logsumexp
    reduction, in place, also where S or E has other uses (a softmax's E divided by R, a
    log-softmax's S an output): those uses keep their S and E, which now subtract the key's
    max. For a kernel that reads its inputs again in each pass over the row (the looped inner
    persistent variant), where S and E are recomputed in the last pass anyway: two passes over
    the row instead of three. Off where the option `one_pass_logsumexp` is disabled."""
    for max_op, sum_op in _pairs_for_passes(fusion):
        _rewrite(fusion, max_op, sum_op)


def pairs_fused_for_passes(fusion) -> int:
    """How many reductions fuse_logsumexp_for_passes would save `fusion`."""
    return len(_pairs_for_passes(fusion))


def _pairs_for_passes(fusion) -> list:
    if options.current().is_enabled("one_pass_logsumexp") is False:
        return []
    return _pairs(fusion, shared=True)


def reduced_axes(out: TensorView) -> list[int]:
    """The positions of a reduction result's reduced dims in its logical domain."""
    return [k for k, i in enumerate(out.domain.logical) if i.is_reduction]


def _pairs(fusion, shared: bool = False) -> list[tuple[ReductionOp, ReductionOp]]:
    """(the max, the sum) of each pattern in `fusion`, in topological order; with `shared`,
    also those whose S or E has other uses."""
    found = []
    for r in fusion.exprs():
        if not (isinstance(r, ReductionOp) and r.op == ReductionOpType.Sum):
            continue
        e = r.in_val.definition
        if not (isinstance(e, UnaryOp) and e.op == UnaryOpType.Exp and (shared or (
                e.outputs[0].uses == [r] and e.outputs[0] not in fusion.outputs))):
            continue
        sub = e.in_val.definition
        if not (isinstance(sub, BinaryOp) and sub.op == BinaryOpType.Sub and (shared or (
                sub.outputs[0].uses == [e] and sub.outputs[0] not in fusion.outputs))):
            continue
        x, b = sub.inputs
        bcast = b.definition if isinstance(b, TensorView) else None
        if not isinstance(bcast, BroadcastOp):
            continue
        m = bcast.inputs[0].definition
        if not (isinstance(m, ReductionOp) and m.op == ReductionOpType.Max and m.in_val is x
                and isinstance(x, TensorView) and x.dtype == DataType.Float
                and r.outputs[0].dtype == DataType.Float):
            continue
        dims = reduced_axes(m.outputs[0])
        if dims != reduced_axes(r.outputs[0]):
            continue
        if [k for k, new in enumerate(bcast.is_broadcast_dim) if new] != dims:
            continue
        found.append((m, r))
    return found


def _rewrite(fusion, max_op: ReductionOp, sum_op: ReductionOp) -> None:
    x, largest, total = max_op.in_val, max_op.outputs[0], sum_op.outputs[0]
    with fusion:
        keys = arith.unary(UnaryOpType.LseKey, x, DataType.Int)
        reduced = arith.reduction(ReductionOpType.LogSumExp, keys, reduced_axes(largest),
                                  DataType.Int, LSE_IDENTITY)
        new_largest = arith.unary(UnaryOpType.LseMax, reduced, DataType.Float)
        new_total = arith.unary(UnaryOpType.LseSum, reduced, DataType.Float)
    exp_op = sum_op.in_val.definition
    sub_op = exp_op.in_val.definition
    fusion.replace_uses(largest, new_largest)
    fusion.replace_uses(total, new_total)
    bcast = sub_op.inputs[1].definition
    sum_op.detach()
    max_op.detach()
    # S and E stay where they have other uses (fuse_logsumexp_for_passes); B then broadcasts
    # the key's max.
    for op in (exp_op, sub_op, bcast):
        out = op.outputs[0]
        if not out.uses and out not in fusion.outputs:
            op.detach()

"""Variances in one pass over their dims, for plans whose kernels read the dims from memory.

var_mean's two-pass formula sums (x - mean)^2 after the mean: two reductions of x, the second
needing the first's result. Where no kernel keeps the reduced dims on chip (BatchNorm's
statistics of a [32, 256, 56, 56] image: 100352 elements a channel), the segmenter makes them two
reduction kernels, each reading x, before the kernel that normalizes: x is read three times.
Summed in float64, x and x^2 give both statistics in one pass:

    Before:  R1 = sum(X, D);  M = broadcast(R1) / c  (or * c);  Q = (X - M)^2;  R2 = sum(Q, D)
    After:   W = cast(X, double);  S1 = sum(W, D);  S2 = sum(W * W, D);  m = S1 / c  (or * c)
             R1' = cast(S1);  R2' = cast(max(S2 - m * (2 S1 - n m), 0))
             (n: the number of elements summed; every use of R1 reads R1', of R2 reads R2')

sum((x - m)^2) = S2 - 2 m S1 + n m^2 for any m, so a mean divided by another count than n (a
user's own) gives the same sum of squares as the two-pass form. The max with 0 keeps a rounding
below zero from making a variance negative (rsqrt(var + eps) NaN), which the two-pass form never
is.

Numerics: S2 - 2 m S1 + n m^2 cancels by mean^2 / var (kappa). float64 sums of T terms a
partial are off by about T * 2^-53 of S2, so the sum of squares keeps float32's precision
(2^-24, the results' dtype) while T * kappa < 2^29: kappa up to 10^6 (|mean| / std up to 1000)
with the 200-odd terms of a thread's partial in the reduction kernels. The two-pass form in
float32 loses precision with kappa too (its mean is off by T * 2^-24 of |mean|). A float64 X
keeps its two passes (one float64 pass would lose what it has).

Where: split_normalizations applies it with its other rewrites, and the executor keeps the
rewritten fusion only where its plan has fewer segments (one reduction kernel for both
statistics) than the fusion's own; a kernel that keeps the dims on chip (the persistent
schedulers) takes the fusion as written.
"""
from __future__ import annotations

from ..ir import arith
from ..ir import scalar as S
from ..ir.dtype import DataType
from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ReductionOp, ReductionOpType,
                        UnaryOp, UnaryOpType)
from ..ir.tensor import TensorView
from .logsumexp import reduced_axes


def _sum(e) -> bool:
    return isinstance(e, ReductionOp) and e.op == ReductionOpType.Sum


def _mean_of(m, x: TensorView, dims: list[int]):
    """(the sum R1 of x over dims, the scaling op) where `m` is broadcast(R1) / c or
    broadcast(R1) * c, c a scalar; else None."""
    scale = m.definition if isinstance(m, TensorView) else None
    if not (isinstance(scale, BinaryOp) and scale.op in (BinaryOpType.Div, BinaryOpType.Mul)
            and scale.inputs[0] is not m and not isinstance(scale.inputs[1], TensorView)):
        return None
    b = scale.inputs[0]
    bcast = b.definition if isinstance(b, TensorView) else None
    if not isinstance(bcast, BroadcastOp):
        return None
    if [k for k, new in enumerate(bcast.is_broadcast_dim) if new] != dims:
        return None
    r1 = bcast.inputs[0].definition
    if not (_sum(r1) and r1.in_val is x and reduced_axes(r1.outputs[0]) == dims):
        return None
    return r1, scale


def two_pass_variances(fusion) -> list[tuple]:
    """(R1's op, the scaling op, R2's op) of each two-pass sum of squares in `fusion`, in
    topological order: R2 = sum((X - M)^2, D) with M = broadcast(sum(X, D)) / c (or * c), X
    float32 (or a cast of a narrower float), R1 and R2 float32. A sum R1 in several patterns is
    taken once."""
    found, seen = [], set()
    for r2 in fusion.exprs():
        if not _sum(r2) or r2.outputs[0].dtype != DataType.Float:
            continue
        sq = r2.in_val.definition
        if not (isinstance(sq, BinaryOp) and sq.op == BinaryOpType.Mul
                and sq.inputs[0] is sq.inputs[1] and isinstance(sq.inputs[0], TensorView)):
            continue
        sub = sq.inputs[0].definition
        if not (isinstance(sub, BinaryOp) and sub.op == BinaryOpType.Sub
                and all(isinstance(v, TensorView) for v in sub.inputs)):
            continue
        x, m = sub.inputs
        if x.dtype != DataType.Float:
            continue
        dims = reduced_axes(r2.outputs[0])
        mean = _mean_of(m, x, dims)
        if mean is None or mean[0] in seen or mean[0].outputs[0].dtype != DataType.Float:
            continue
        seen.add(mean[0])
        found.append((mean[0], mean[1], r2))
    return found


def one_pass_variance(fusion) -> int:
    """Rewrite each of `fusion`'s two_pass_variances in place (a schedule's or a plan's own
    copy), as the module docstring says. Returns how many."""
    found = two_pass_variances(fusion)
    for r1, scale, r2 in found:
        _rewrite(fusion, r1, scale, r2)
    return len(found)


def _rewrite(fusion, r1: ReductionOp, scale: BinaryOp, r2: ReductionOp) -> None:
    D = DataType.Double
    x, dims = r1.in_val, reduced_axes(r1.outputs[0])
    src = x.domain.logical_no_reductions
    with fusion:
        w = arith.unary(UnaryOpType.Cast, x, D)
        s1 = arith.reduction(ReductionOpType.Sum, w, dims, D, 0.0)
        s2 = arith.reduction(ReductionOpType.Sum, arith.binary(BinaryOpType.Mul, w, w, D),
                             dims, D, 0.0)
        m = arith.binary(scale.op, s1, scale.inputs[1], D)
        n = S.Scalar(D)
        UnaryOp(UnaryOpType.Cast, n, S.product(src[d].user_extent for d in dims))
        # sum((x - m)^2) = S2 - m (2 S1 - n m)
        two_s1 = arith.binary(BinaryOpType.Mul, s1, S.as_scalar(2.0, D), D)
        centered = arith.binary(BinaryOpType.Sub, two_s1,
                                arith.binary(BinaryOpType.Mul, m, n, D), D)
        squares = arith.binary(BinaryOpType.Sub, s2,
                               arith.binary(BinaryOpType.Mul, m, centered, D), D)
        squares = arith.binary(BinaryOpType.Max, squares, S.as_scalar(0.0, D), D)
        new_r1 = arith.unary(UnaryOpType.Cast, s1, r1.outputs[0].dtype)
        new_r2 = arith.unary(UnaryOpType.Cast, squares, r2.outputs[0].dtype)
    fusion.replace_uses(r1.outputs[0], new_r1)
    fusion.replace_uses(r2.outputs[0], new_r2)
    # The square's chain goes where nothing else reads it (x - mean is often also the
    # normalization's numerator).
    sq = r2.in_val.definition
    sub = sq.inputs[0].definition
    r2.detach()
    r1.detach()
    for op in (sq, sub):
        out = op.outputs[0]
        if not out.uses and out not in fusion.outputs:
            op.detach()

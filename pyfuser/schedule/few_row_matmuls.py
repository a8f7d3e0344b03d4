"""Matmuls of few rows as reductions: x @ w^T over M <= REDUCTION_MAX_ROWS rows is a row sum of
the products, each output element one row of w times x: the weight streams from memory once,
through a kernel with a smaller fixed cost than cuBLAS's, and the epilogue fuses into it.

    Before:  Y = linear(X, W, B)                 X [..., K], W [N, K], B [N]
             (or Y = matmul(A, Bt) with Bt [K, N] a view of W [N, K]: its K dim of stride 1)
    After:   P = cast(broadcast(X, [..., 1, K]), f32) * cast(broadcast(W, [1.., N, K]), f32)
             Y' = cast(sum(P, K) (+ cast(B, f32)), X's dtype)          every use of Y reads Y'

Why: a tensor-core tile of 128 rows over one row of x is 1/128 busy, and the kernel is bound by
how fast W arrives (read once whatever M is). As a reduction each output element is one block's
row of the product, x's row read again by every block from L1 / L2; with M > 1 each row of W is
read again too (once per row of x), which is why only one row is taken. On the H200 the
reduction has the smaller fixed cost and cuBLAS the faster stream (BARE_MAX_WEIGHT_BYTES); with
an epilogue the reduction saves the epilogue's kernel (docs/performance.md, "Matmuls of few
rows as reductions").

Taken when every rule holds (`rewritable`), else the op stays (a library segment or the matmul
kernel): M (the product of the output's dims other than N) at most REDUCTION_MAX_ROWS; an
epilogue to fuse (a bias, ops on the result) or a weight of at most BARE_MAX_WEIGHT_BYTES; the
weight read along K (its K dim of stride 1: a Linear's weight, or `w.t()` passed to matmul),
since a reduction over a strided dim reads one element per row per step; no batch dims on the
weight (a batched matmul keeps its op); the options leave it on (feature
`matmul_as_reduction`) and do not force the matmul kernel (`matmul_few_rows`) or a heuristic.

Numerics: the products of 16-bit operands are exact in float32 and summed in float32, as
cuBLAS accumulates; the order of the sum differs (a block reduction's), so results differ in
rounding only. float32 operands give full float32 products (torch's default without TF32).
"""
from __future__ import annotations

import math

from ..ir import arith
from ..ir import scalar as S
from ..ir.dtype import DataType
from ..ir.exprs import BinaryOpType, LinearOp, MatmulOp, ReductionOpType, UnaryOpType
from ..ir.tensor import TensorView

# Rows of x (M) up to which a matmul runs as a reduction. Measured on the H200 (linear, bf16,
# tools/bench_few_rows.py; docs/performance.md, "Matmuls of few rows as reductions"): at 2 rows
# of 4096 x 4096 the reduction took 27.6 us against cuBLAS's 18.9, at 4 rows 48.9: every row
# of x reads W again.
REDUCTION_MAX_ROWS = 1
# A bare matmul (no bias, nothing computed from its result) runs as a reduction only up to this
# many bytes of weight. Measured on the H200, one row of x: the reduction has the smaller fixed
# cost (about 6 us against cuBLAS's 10.5, from 4096 x 4096 at 17.2 / 19.0 us and 16384 x 4096
# at 50.3 / 45.2) but streams W slower (2.9 TB/s against 3.8), so cuBLAS wins from about 57 MB
# (14336 x 5120: 57.2 / 48.6 us; 4096 x 14336: 45.0 / 42.4). With an epilogue the alternative
# is cuBLAS and then an epilogue kernel, and the reduction was 0.97-1.24x the best of eager and
# torch.compile at every size measured.
BARE_MAX_WEIGHT_BYTES = 48 << 20


def rewritable(fusion, bindings: dict, inputs, options) -> tuple:
    """The positions in fusion.exprs() of the matmul and linear ops this call runs as
    reductions (module docstring), or () when none. `bindings`: the call's extents; `inputs`:
    its arguments, in the order of fusion.inputs."""
    if (options.is_enabled("matmul_as_reduction") is False
            or options.is_enabled("matmul_few_rows") or options.heuristic is not None):
        return ()
    found = []
    extents = dict(bindings)      # S.evaluate memoizes into it

    def size(i) -> int:
        return int(S.evaluate(i.maybe_expanded_extent, extents))
    for k, e in enumerate(fusion.exprs()):
        if isinstance(e, (LinearOp, MatmulOp)) and _few_rows(e, size) and \
                _weight_along_k(fusion, e, inputs) and (
                    _has_epilogue(fusion, e) or _weight_bytes(e, size) <= BARE_MAX_WEIGHT_BYTES):
            found.append(k)
    return tuple(found)


def _has_epilogue(fusion, e) -> bool:
    """A bias, or ops computed from the result (which the reduction kernel fuses)."""
    return (isinstance(e, LinearOp) and len(e.inputs) > 2) or bool(fusion.uses_of(e.outputs[0]))


def _weight_bytes(e, size) -> int:
    w = e.inputs[1]
    return w.dtype.size * math.prod(size(i) for i in w.domain.logical_no_reductions)


def _few_rows(e, size) -> bool:
    out = e.outputs[0].domain.logical_no_reductions
    if isinstance(e, MatmulOp):
        b = e.inputs[1].domain.logical_no_reductions
        if len(b) != 2:         # a batched or 1-D second operand keeps its op
            return False
        rows = out[:-1] if len(e.inputs[0].domain.logical_no_reductions) > 1 else []
    else:
        rows = out[:-1]
    return math.prod(size(i) for i in rows) <= REDUCTION_MAX_ROWS


def _weight_along_k(fusion, e, inputs) -> bool:
    """The weight is a fusion input whose K dim has stride 1 (W [N, K] row-major for linear;
    b [K, N] with stride 1 along K, a transposed view, for matmul)."""
    w = e.inputs[1]
    if w not in fusion.inputs:
        return False
    k_dim = 1 if isinstance(e, LinearOp) else 0
    return inputs[fusion.inputs.index(w)].stride(k_dim) == 1


def as_reductions(fusion, which: tuple):
    """A clone of `fusion` with the ops at positions `which` of fusion.exprs() (rewritable's)
    made reductions (module docstring); inputs and outputs in the same positions."""
    new, _ = fusion.clone_for_rewrite()
    exprs = new.exprs()
    for k in which:
        _rewrite(new, exprs[k])
    return new


def describe(fusion, which: tuple) -> str:
    """What as_reductions(fusion, which) changed, for RunInfo's reason."""
    exprs = fusion.exprs()
    ops = ", ".join(f"{'linear' if isinstance(exprs[k], LinearOp) else 'matmul'} "
                    f"T{exprs[k].outputs[0].name}" for k in which)
    return (f"{ops} of at most {REDUCTION_MAX_ROWS} row(s) of x: a row reduction of the "
            "products (schedule/few_row_matmuls.py)")


def _rewrite(fusion, e) -> None:
    out = e.outputs[0]
    x, w = e.inputs[0], e.inputs[1]
    bias = e.inputs[2] if isinstance(e, LinearOp) and len(e.inputs) > 2 else None
    rank_x = len(x.domain.logical_no_reductions)
    with fusion:
        if isinstance(e, MatmulOp):
            w = arith.permute(w, [1, 0])                  # [K, N] -> [N, K]
        lead = rank_x - 1                                 # x's dims before K
        # x's size-1 dims (a [1, K] row from torch) squeezed, then broadcast again with the
        # product's: a size-1 dim of an input standing for a kept dim is one the reduction
        # scheduler refuses (its kept loop would not line up).
        ones = [d for d in range(lead) if x.domain.logical_no_reductions[d].is_broadcast]
        if ones:
            x = arith.squeeze(x, ones)
        xb = arith.broadcast(x, [d in ones for d in range(lead)] + [True, False])  # [..., 1, K]
        wb = arith.broadcast(w, [True] * lead + [False, False])     # [1.., N, K]
        f32 = DataType.Float
        prod = arith.binary(BinaryOpType.Mul, _as_f32(xb), _as_f32(wb), f32)
        total = arith.reduction(ReductionOpType.Sum, prod, [lead + 1], f32, 0.0)
        if bias is not None:
            b = arith.broadcast(_as_f32(bias), [True] * lead + [False])
            total = arith.binary(BinaryOpType.Add, total, b, f32)
        result = total if out.dtype == f32 else arith.unary(UnaryOpType.Cast, total, out.dtype)
    fusion.replace_uses(out, result)
    e.detach()


def _as_f32(t: TensorView) -> TensorView:
    return t if t.dtype == DataType.Float else arith.unary(UnaryOpType.Cast, t, DataType.Float)

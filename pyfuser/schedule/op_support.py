"""Which kind of plan segment runs each fusion op.

A fusion becomes a plan of segments (issue "A plan of kernels"): generated kernels, library ops
run on the plan's stream (not a fallback), and the reference evaluator (a fallback, with a
warning). The segmenter, the tests and the fuzzer read these lists instead of keeping their own.

- KERNEL_OPS: expression types the schedulers generate kernels for.
- LIBRARY_OPS: expression types run by a library call (matmul and linear through torch/cuBLAS
  until pyfuser's matmul scheduler exists). Each has a runtime implementation in
  runtime/library.py.
- LIBRARY_FALLBACK_OPS: kernel ops that also have a library implementation: a scheduler that
  takes them fuses them into a kernel (the `scan`, `topk` and `scatter` schedulers); a group
  of one such op that no scheduler takes (a scan along a dim strided in memory, a top-k of a
  row longer than a block holds, a scatter that stores rather than adds) runs as a library
  segment, not in the reference.
- Anything else runs in a reference segment.
- BOUNDARY_OPS: kernel ops whose output the segmenter never merges across (fd.ops.segment_set):
  the op runs in its producer's segment, and the consumers of its output in others.
- FORWARDED_UNARY_OPS, FORWARDED_BINARY_OPS: ops cheap enough to recompute (no MUFU work, one
  instruction or two) that the segmenter forwards when they start at fusion inputs: each
  segment reading their result recomputes it from the inputs rather than one segment writing
  it to global memory for the others (see segmenter.py). A binary op is forwarded only where
  at most one of the tensors it reads is full size, the rest broadcasts (BatchNorm backward's
  x_hat = (x - mean[C]) * rstd[C] from the saved statistics).
"""
from __future__ import annotations

from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, GatherOp,
                        IndexCheckOp, IotaOp, LinearOp, LoadStoreOp, MatmulOp, RandOp,
                        ReductionOp, ReshapeOp, ScanOp, ScatterOp, SegmentSetOp, SqueezeOp,
                        TopKOp, UnaryOp, UnaryOpType, WhereOp,
                        WindowOp)
from ..ir.scalar import ScalarOp

# ScalarOp: arithmetic on scalars (a mean's 1/N, a variance's correction, the element count
# of a mean over an expanded dim), which kernels compute from their scalar parameters.
KERNEL_OPS: tuple = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp,
                     ReshapeOp, ReductionOp, FullOp, IotaOp, RandOp, WindowOp, GatherOp, ScalarOp,
                     SegmentSetOp, ScanOp, TopKOp, IndexCheckOp, ScatterOp, MatmulOp, LinearOp)
LIBRARY_OPS: tuple = ()
LIBRARY_FALLBACK_OPS: tuple = (ScanOp, TopKOp, ScatterOp, MatmulOp, LinearOp)
# Ops that one scheduler alone is asked to take, by name (schedulers/registry.py): a fusion
# holding one is offered to that scheduler only, and that scheduler to no other fusion.
DEDICATED_OPS: dict = {ScanOp: "scan", TopKOp: "topk", ScatterOp: "scatter", MatmulOp: "matmul",
                       LinearOp: "matmul"}
BOUNDARY_OPS: tuple = (SegmentSetOp,)
# Ops that only move or fill data (no arithmetic worth a launch): the segmenter keeps them out
# of segments of their own wherever a neighbour takes them.
CHEAP_OPS: tuple = (BroadcastOp, ExpandOp, ReshapeOp, SqueezeOp, FullOp, IotaOp, WindowOp,
                    LoadStoreOp)


FORWARDED_UNARY_OPS: tuple = (UnaryOpType.Cast, UnaryOpType.Set, UnaryOpType.Neg,
                               UnaryOpType.Abs, UnaryOpType.Relu, UnaryOpType.Not)
FORWARDED_BINARY_OPS: tuple = (BinaryOpType.Add, BinaryOpType.Sub, BinaryOpType.Mul)


def is_forwardable(expr) -> bool:
    """Whether `expr` is a unary op a segment may recompute from its input instead of reading
    its result from another segment (FORWARDED_UNARY_OPS)."""
    return isinstance(expr, UnaryOp) and expr.op in FORWARDED_UNARY_OPS


def is_forwardable_binary(expr) -> bool:
    """Whether `expr` is a binary op a segment may recompute from what it reads, where those
    are forwarded (FORWARDED_BINARY_OPS; the segmenter checks what it reads)."""
    return isinstance(expr, BinaryOp) and expr.op in FORWARDED_BINARY_OPS


def segment_kind(expr) -> str:
    """"kernel", "library" or "reference": the kind of segment that runs `expr`."""
    if isinstance(expr, LIBRARY_OPS):
        return "library"
    if isinstance(expr, KERNEL_OPS):
        return "kernel"
    return "reference"


def has_library_implementation(expr) -> bool:
    """Whether runtime/library.py can run `expr` (a library op, or a kernel op that falls back
    to one)."""
    return isinstance(expr, LIBRARY_OPS + LIBRARY_FALLBACK_OPS)


def is_cheap(expr) -> bool:
    """Whether `expr` only moves, fills or casts data (see CHEAP_OPS)."""
    from ..ir.exprs import UnaryOpType
    if isinstance(expr, BOUNDARY_OPS):
        return False
    if isinstance(expr, UnaryOp):
        return expr.op in (UnaryOpType.Cast, UnaryOpType.Set)
    return isinstance(expr, CHEAP_OPS)

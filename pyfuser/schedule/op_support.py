"""Which kind of plan segment runs each fusion op.

A fusion becomes a plan of segments (issue "A plan of kernels"): generated kernels, library ops
run on the plan's stream (not a fallback), and the reference evaluator (a fallback, with a
warning). The segmenter, the tests and the fuzzer read these lists instead of keeping their own.

- KERNEL_OPS: expression types the schedulers generate kernels for.
- LIBRARY_OPS: expression types run by a library call (matmul and linear through torch/cuBLAS
  until pyfuser's matmul scheduler exists). Each has a runtime implementation in
  runtime/library.py.
- Anything else runs in a reference segment.
"""
from __future__ import annotations

from ..ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, LinearOp, LoadStoreOp, MatmulOp,
                        ReductionOp, ReshapeOp, SqueezeOp, UnaryOp, WhereOp)
from ..ir.scalar import ScalarOp

# ScalarOp: arithmetic on scalars (a mean's 1/N, a variance's correction, the element count
# of a mean over an expanded dim), which kernels compute from their scalar parameters.
KERNEL_OPS: tuple = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp,
                     ReshapeOp, ReductionOp, FullOp, ScalarOp)
LIBRARY_OPS: tuple = (MatmulOp, LinearOp)


def segment_kind(expr) -> str:
    """"kernel", "library" or "reference": the kind of segment that runs `expr`."""
    if isinstance(expr, LIBRARY_OPS):
        return "library"
    if isinstance(expr, KERNEL_OPS):
        return "kernel"
    return "reference"

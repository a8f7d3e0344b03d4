"""Library segments: fusion ops run by a library call instead of a generated kernel.

A plan runs each op of schedule/op_support.LIBRARY_OPS (and each op of LIBRARY_FALLBACK_OPS that
no kernel took: a scan, a top-k, a scatter) as a segment of its own through
`run_library_op`: torch on the inputs' device and current stream (cuBLAS on a CUDA device, so
on the plan's stream; torch's CPU kernels on CPU tensors, which the interpreter plans use). This
is not a fallback: it is how pyfuser runs matmul and linear until it has a matmul scheduler.
The reference evaluator runs these ops through the same table, so the oracle and the plans
agree on shape rules (in float64 with promote_to_double).

Accumulation: bf16 and fp16 operands accumulate in fp32. torch lets cuBLAS reduce split-K
partials in 16 bits by default (torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision
_reduction); a library segment turns that off for its call and restores it after (a host cost
of a few attribute writes). fp32 operands follow torch's TF32 setting (off by default: full fp32
products), the user's choice as in eager torch.

`IMPLEMENTATIONS` maps each library expression type to its implementation; tests check that it
covers op_support.LIBRARY_OPS and LIBRARY_FALLBACK_OPS exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..ir.exprs import LinearOp, MatmulOp, ScanOp, ScatterOp, TopKOp


@dataclasses.dataclass(frozen=True)
class LibraryImpl:
    name: str                    # the fusion op, as the frontend spells it
    call: str                    # the torch function that runs it
    run: Callable                # (expr, input tensors) -> output tensors
    # For describe(): what runs it on a GPU, and what follows the dtype.
    runs_as: str = " (cuBLAS on a CUDA device)"
    numerics: str = ", fp32 accumulation"


class _fp32_accumulation:
    """cuBLAS reductions of 16-bit operands in fp32 for the duration of one call (a class, not
    a contextlib generator: it runs at every library call, and costs a few microseconds less)."""

    __slots__ = ("cuda", "saved")

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            m = torch.backends.cuda.matmul
            self.saved = (m.allow_fp16_reduced_precision_reduction,
                          m.allow_bf16_reduced_precision_reduction)
            m.allow_fp16_reduced_precision_reduction = False
            m.allow_bf16_reduced_precision_reduction = False

    def __exit__(self, *exc):
        if self.cuda:
            m = torch.backends.cuda.matmul
            (m.allow_fp16_reduced_precision_reduction,
             m.allow_bf16_reduced_precision_reduction) = self.saved
        return False


def _matmul(expr, inputs):
    a, b = inputs
    with _fp32_accumulation(a.device):
        return [torch.matmul(a, b)]


def _linear(expr, inputs):
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    with _fp32_accumulation(x.device):
        return [torch.nn.functional.linear(x, w, bias)]


def _topk(expr, inputs):
    x, k = inputs[0], (inputs[1] if len(inputs) > 1 else expr.k)
    values, indices = torch.topk(x, int(k), expr.dim, largest=expr.largest, sorted=expr.sorted)
    return [values, indices]


def _scan(expr, inputs):
    x, = inputs
    scan = torch.cumsum if expr.op == "sum" else torch.cumprod
    return [scan(x, expr.dim)]


def scatter_values(expr, index, src, x, shape, iteration, dtype):
    """What ScatterOp `expr` computes, as torch does (Tensor.scatter_ for op "set",
    scatter_add_ for "add"): x (zeros of `shape` where None) in `dtype`, with src's elements
    written or added along expr.dim at index's values; index and src are broadcast to the op's
    `iteration` shape. IndexOutOfRange (as the kernels raise it) for an index outside the
    dim, before anything is written. The reference evaluator and the library segment share it."""
    from .index_check import IndexOutOfRange, index_error_message
    n = shape[expr.dim]
    idx = index.to(torch.int64).expand(iteration)
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise IndexOutOfRange(index_error_message(expr.what, expr.dim,
                                                  int(idx[bad].flatten()[0]), n))
    out = (x.to(dtype).clone() if x is not None
           else torch.zeros(shape, dtype=dtype, device=index.device))
    if 0 in iteration:
        return out
    src = src.to(dtype).expand(iteration)
    if expr.op == "add":
        return out.scatter_add_(expr.dim, idx, src)
    return out.scatter_(expr.dim, idx, src)


def _scatter(expr, inputs, sizes):
    index, src = inputs[0], inputs[1]
    x = inputs[2] if len(inputs) > 2 else None
    out = expr.outputs[0]
    shape = [sizes(i.maybe_expanded_extent) for i in out.domain.logical]
    iteration = [sizes(i.maybe_expanded_extent)
                 for i in out.domain.maybe_root]
    from ..ir.dtype import to_torch
    return [scatter_values(expr, index, src, x, shape, iteration, to_torch(out.dtype))]


IMPLEMENTATIONS: dict = {
    MatmulOp: LibraryImpl("matmul", "torch.matmul", _matmul),
    LinearOp: LibraryImpl("linear", "torch.nn.functional.linear", _linear),
    TopKOp: LibraryImpl("topk", "torch.topk", _topk, runs_as="",
                        numerics=" values and int64 indices"),
    ScanOp: LibraryImpl("scan", "torch.cumsum or torch.cumprod", _scan, runs_as="",
                        numerics=""),
    ScatterOp: LibraryImpl("scatter", "torch.Tensor.scatter_ or scatter_add_", _scatter,
                           runs_as="", numerics=""),
}
# Library ops whose outputs' shapes are not their inputs' (a scatter into zeros of the
# target's shape): their implementation also takes `sizes`, the value of an extent Scalar.
_SIZED = (ScatterOp,)


def implementation(expr) -> LibraryImpl:
    impl = IMPLEMENTATIONS.get(type(expr))
    if impl is None:
        raise TypeError(f"{type(expr).__name__} is not a library op (runtime/library.py runs "
                        f"{', '.join(t.__name__ for t in IMPLEMENTATIONS)})")
    return impl


def run_library_op(expr, inputs: list, sizes=None) -> list:
    """The outputs of library expression `expr` on `inputs` (torch tensors, one per expr input,
    in order), computed by torch on their device and current stream, in their dtype.
    `sizes(extent Scalar) -> int`: the call's extents, for an op whose output shape its inputs
    do not give (a scatter into zeros)."""
    impl = implementation(expr)
    if len(inputs) != len(expr.inputs):
        raise ValueError(f"{impl.name}: {len(inputs)} tensors for {len(expr.inputs)} operands")
    if isinstance(expr, _SIZED):
        if sizes is None:
            raise ValueError(f"{impl.name}: its output's sizes are needed (sizes=...)")
        return impl.run(expr, list(inputs), sizes)
    return impl.run(expr, list(inputs))


def describe(expr) -> str:
    """One line for RunInfo and explain: which op, on which tensors, run by what."""
    impl = implementation(expr)
    operands = ", ".join(f"T{v.name}" for v in expr.inputs)
    out = expr.outputs[0]
    outs = ", ".join(f"T{o.name}" for o in expr.outputs)
    op, call = impl.name, impl.call
    if isinstance(expr, ScanOp):
        op = "cumsum" if expr.op == "sum" else "cumprod"
        call, operands = f"torch.{op}", f"{operands}, dim={expr.dim}"
    if isinstance(expr, ScatterOp):
        op = expr.what
        call = "torch.Tensor.scatter_add_" if expr.op == "add" else "torch.Tensor.scatter_"
        into = f"T{expr.x.name}" if expr.x is not None else "zeros"
        operands = (f"{into}, dim={expr.dim}, index=T{expr.index.name}, "
                    f"src=T{expr.src.name}")
    return (f"{impl.name}: {outs} = {op}({operands}) by {call}{impl.runs_as}, "
            f"{out.dtype.short_name}{impl.numerics}")

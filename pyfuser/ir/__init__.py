"""Fusion IR: data types, scalars, IterDomains, TensorViews, expressions, Fusion."""
from .base import Expr, Val
from .dtype import DataType, promote, result_type
from .exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, GatherOp, IotaOp,
                    IndexCheckOp, LoadKind, RandOp, ScatterOp,
                    LoadStoreOp, ReductionOp, ReductionOpType, ReshapeOp, SqueezeOp, UnaryOp,
                    UnaryOpType, WhereOp, WindowOp)
from .fusion import Fusion
from .iter_domain import IterDomain, IterType, Merge, ParallelType, Split
from .scalar import Scalar
from .tensor import (CircularBufferOptions, CpAsyncPipelined, MemoryType, PipelinedBuffer,
                     ScheduleError, TensorDomain, TensorView, WarpSpecialized)

__all__ = [
    "BinaryOp", "BinaryOpType", "BroadcastOp", "CircularBufferOptions", "CpAsyncPipelined",
    "DataType", "ExpandOp",
    "Expr", "FullOp", "Fusion", "GatherOp", "IndexCheckOp", "RandOp", "ScatterOp", "IotaOp", "IterDomain", "IterType", "LoadKind", "LoadStoreOp", "MemoryType",
    "Merge", "ParallelType", "PipelinedBuffer", "ReductionOp", "ReductionOpType", "ReshapeOp",
    "Scalar", "ScheduleError", "Split", "SqueezeOp", "TensorDomain", "TensorView", "UnaryOp",
    "UnaryOpType", "Val", "WarpSpecialized", "WhereOp", "WindowOp", "promote", "result_type",
]

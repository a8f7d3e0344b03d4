"""What every scheduler shares: the runtime facts heuristics read, and the scheduler interface.

A scheduler is a pure function (fusion, heuristic) -> scheduled fusion; its heuristic is a frozen,
hashable dataclass computed from the fusion, the runtime facts of the inputs and the device's
properties. The same heuristic always gives the same kernel, so kernels are reused across input
shapes whose heuristics are equal.
"""
from __future__ import annotations

import dataclasses

from ...ir import scalar as S
from ...ir.exprs import ReductionOp
from ...ir.tensor import TensorView


@dataclasses.dataclass(frozen=True)
class InputFacts:
    """What a heuristic may know about one input tensor at run time."""

    sizes: tuple
    strides: tuple
    alignment: int          # largest power of two (<= 16) dividing the data pointer, in bytes


@dataclasses.dataclass
class RuntimeInfo:
    """Extents and input layouts of one call, and the device it runs on."""

    bindings: dict                 # symbolic extent Scalar -> int
    inputs: tuple                  # InputFacts or None (scalars), per fusion input
    device: object                 # DeviceProperties

    def extent(self, s) -> int:
        return int(S.evaluate(s, dict(self.bindings)))


class SchedulerError(ValueError):
    pass


def reduction_tensors(fusion) -> list[TensorView]:
    return [e.outputs[0] for e in fusion.exprs() if isinstance(e, ReductionOp)]


def max_vector_bytes(alignment: int) -> int:
    return min(16, alignment)


def pow2_divisor(x: int, limit: int) -> int:
    """The largest power of two <= limit dividing x."""
    v = 1
    while v * 2 <= limit and x % (v * 2) == 0:
        v *= 2
    return v

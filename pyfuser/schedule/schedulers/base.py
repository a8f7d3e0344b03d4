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


def vector_inputs(fusion, info: RuntimeInfo, vector: int) -> tuple:
    """Fusion inputs that can be read with `vector`-wide accesses along their innermost dim:
    that dim contiguous (and not a broadcast), the data pointer aligned to the access, and every
    other stride a multiple of the width."""
    from ...ir.tensor import TensorView
    out = []
    if vector <= 1:
        return ()
    for k, v in enumerate(fusion.inputs):
        if not (isinstance(v, TensorView) and fusion.uses_of(v)):
            continue
        f = info.inputs[k]
        if f is None or not v.domain.logical or v.domain.logical[-1].is_broadcast:
            continue
        if vector * v.dtype.size > 16:
            continue        # wider than one 16-byte access
        if (f.strides[-1] == 1 and f.alignment >= vector * v.dtype.size
                and all(s % vector == 0 for d, s in enumerate(f.strides[:-1]) if f.sizes[d] != 1)):
            out.append(k)
    return tuple(out)


def vector_width(fusion, inner_extent: int) -> int:
    """Elements per 16-byte access along the innermost dim: limited by the widest input read
    along it (inputs whose innermost dim is a broadcast are not read with vectors) and by what
    divides the innermost extent."""
    from ...ir.tensor import TensorView
    widest = max([v.dtype.size for v in fusion.inputs if isinstance(v, TensorView)
                  and v.domain.logical and not v.domain.logical[-1].is_broadcast] + [1])
    return pow2_divisor(inner_extent, max(1, 16 // widest))


def vectorize_along(tv: TensorView, vec_axis, graph) -> None:
    """Vectorize tv's loop axis that maps (in the permissive ID graph `graph`) to `vec_axis`, the
    reference's vector split of the row; a trailing broadcast dim may follow it. A tensor
    without such an axis is left alone: e.g. a row statistic [M] scheduled like the row has
    threadIdx.y innermost, and vectorizing that axis would make one thread write the rows
    that other threads hold."""
    from ...ir.iter_domain import ParallelType as PT
    pos = next((k for k, i in enumerate(tv.domain.loop) if graph.mapped(i, vec_axis)), None)
    if pos is not None and all(i.is_broadcast for i in tv.domain.loop[pos + 1:]):
        tv.parallelize(pos, PT.Vectorize)


def reduced_and_kept(red, reduced_positions, info: RuntimeInfo) -> tuple[int, int]:
    """(product of the reduced extents, product of the kept extents) of reduction `red`."""
    n, m = 1, 1
    for k, i in enumerate(red.domain.maybe_root):
        e = 1 if i.is_broadcast else info.extent(i.extent)
        if k in reduced_positions:
            n *= e
        else:
            m *= e
    return n, m

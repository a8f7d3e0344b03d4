"""Pointwise scheduler: fusions without reductions, one flat loop over the output.

Kernel shape (bf16, 16-byte vectors, 128 threads, unroll 2):

    for blockIdx.x:                       output flattened in its memory order, split as
      for u in 0..2 (unrolled):           [ceilDiv(n, 8*128*2)] x [2] x [128] x [8]
        for threadIdx.x:
          8 elements: one 16-byte load per input, math in registers, one 16-byte store

Broadcast inputs read through the flat index (e.g. a bias is indexed by flat % N). Inputs whose
layout differs from the output's are read with their own strides (correct, not coalesced), and
element-wise: a vector lane steps through the output's stride-1 dim, which is not theirs (an
NCHW input of an NHWC output). Each tensor's access width comes from its own dtype (base.vectorize).
Every output must iterate the reference's elements (or broadcast them): one loop nest cannot
cover outputs of unrelated shapes (the segmenter makes them kernels of their own). The reference
is the output that iterates the most dims; an [M, 1] or [1, N] output beside an [M, N] one runs
in its flat loop, each element written by one iteration (the lowering guards the write to column
0, row 0), element-wise where its lanes would step along a dim it broadcasts. So does an output
of a lower rank whose dims are the reference's ([N] or a 0-dim scalar beside [M, N], as
nvFuser's pointwise scheduler takes the largest output as its reference): the dims it lacks
are guarded like broadcast ones, so one launch reads the shared inputs once, where two
kernels would read them twice and launch twice.

A fusion of 0-dim outputs only (scalars as tensors) is one thread: no loop, no split, a
block of one thread in a grid of one block:

    T3[0] = exp(T0[0]) + T1[0]
"""
from __future__ import annotations

import dataclasses

from ...ir.exprs import BroadcastOp, GatherOp, IotaOp, RandOp, ScatterOp, SqueezeOp, WindowOp
from ...ir.id_graph import IdGraph
from ..cache import cached_uses
from ...ir.tensor import TensorView
from .. import inline_most
from .base import (RuntimeInfo, SchedulerError, access_width, cache_inputs_and_outputs,
                   input_vector_problems, mapped_dim, orient_vector_inputs, pow2_divisor,
                   reduction_tensors, split_flat_loop, vector_gathers, vector_inputs,
                   vector_windows, vectorize)

NAME = "pointwise"


@dataclasses.dataclass(frozen=True)
class PointwiseParams:
    vector: int = 1          # elements per thread per access (the innermost split)
    threads: int = 128       # threads per block (TIDx)
    unroll: int = 1          # vectors per thread, strided by threads * vector
    vector_inputs: tuple = ()  # fusion input positions read with vector loads
    # Windows (slices, pads) of inputs read with vector loads: positions among the fusion's
    # WindowOps in expression order (base.vector_windows).
    vector_windows: tuple = ()
    # Gathers whose source rows are read with vector loads: positions among the fusion's
    # GatherOps in expression order (base.vector_gathers).
    vector_gathers: tuple = ()
    # The flat loop's vectors run across the rows of dense tensors whose innermost extent holds
    # no whole vectors (a row of 1001): only the last vector of the run is checked, lane by
    # lane (lower/vectorize.py); no extent need be a multiple of the width.
    ragged: bool = False
    note: str = ""

    def describe(self) -> str:
        windows = (f", vector loads for windows {list(self.vector_windows)}"
                   if self.vector_windows else "")
        gathers = (f", vector loads for gathers {list(self.vector_gathers)}"
                   if self.vector_gathers else "")
        ragged = (", vectors across rows, the last checked lane by lane" if self.ragged
                  else "")
        return (f"pointwise: {self.threads} threads, vector {self.vector}, unroll {self.unroll}, "
                f"vector loads for inputs {list(self.vector_inputs)}{windows}{gathers}{ragged}"
                + (f" ({self.note})" if self.note else ""))


def can_schedule(fusion) -> tuple[bool, str]:
    if reduction_tensors(fusion):
        return False, "the fusion has reductions"
    if not any(isinstance(o, TensorView) for o in fusion.outputs):
        return False, "no tensor outputs"
    back = _reduced_squeeze_broadcast_back(fusion)
    if back is not None:
        return False, (f"T{back.name} reduces an expanded dim (a squeeze standing for that "
                       "reduction) and is broadcast back: the flat loop would need it before "
                       "computing it")
    ref = _reference(fusion)
    apart = _outside_reference(fusion, ref)
    if apart is not None:
        k, d = apart
        j = fusion.outputs.index(ref)
        return False, (f"output {k} does not iterate the elements of output {j}: its dim {d} is "
                       f"none of output {j}'s, nor broadcast from one (outputs of unrelated "
                       "shapes, such as the updates of two parameters of different sizes); one "
                       "pointwise kernel loops over one output's shape")
    return True, "no reductions: one flat loop over the output"


def _reduced_squeeze_broadcast_back(fusion) -> TensorView | None:
    """The output of a squeeze that stands for a reduction over expanded dims (min over an
    expanded [N]: its one element), when a broadcast reads it downstream: its input lies in the
    flat loop (the expanded dim maps to the loop's), and the loop would read the broadcast
    before the squeeze is computed (a cycle of loops; fuzz 20261334:1080). None otherwise."""
    for e in fusion.exprs():
        if not isinstance(e, SqueezeOp) or e.reduction is None:
            continue
        todo, seen = [e.outputs[0]], set()
        while todo:
            v = todo.pop()
            if v in seen or not isinstance(v, TensorView):
                continue
            seen.add(v)
            for use in fusion.uses_of(v):
                if isinstance(use, BroadcastOp):
                    return e.outputs[0]
                todo += use.outputs
    return None


def _reference(fusion) -> TensorView:
    """The output whose loop nest the others share: the one that iterates the most dims (not
    broadcasts), then the most expanded ones, then the highest rank; the first of equals.
    Beside an [M, N] output, an [M, 1] or [1, N] output only broadcasts it, and the loop over
    its M elements would not reach the [M, N] output's."""
    def iterated(o):
        ids = o.domain.logical_no_reductions
        return (sum(not i.is_broadcast for i in ids),
                sum(i.is_broadcast and i.expanded_extent is not None for i in ids), len(ids))
    outs = [o for o in fusion.outputs if isinstance(o, TensorView)]
    return max(outs, key=iterated)


def _inner_dim(ref: TensorView):
    """The reference's innermost allocated dim, which vector lanes step through; None when it
    is a broadcast (every lane would be the same element)."""
    alloc = [i for i in ref.domain.maybe_allocation if not i.is_reduction]
    return alloc[-1] if alloc and not alloc[-1].is_broadcast else None


def _outside_reference(fusion, ref) -> tuple[int, int] | None:
    """(output position, logical dim) of an output dim (not a broadcast) that is none of the
    reference's dims (the exact graph): the reference's loop nest would not iterate it. Two
    dims that only meet through a broadcast both are broadcast to (a [1, 1] input beside an
    [M, N] input and a [1, K] zeros) are not the same iteration: their extents may differ."""
    graph = IdGraph(fusion)
    ref_ids = ref.domain.logical_no_reductions
    for k, o in enumerate(fusion.outputs):
        if not isinstance(o, TensorView) or o is ref or o.definition is None:
            continue
        for d, i in enumerate(o.domain.logical_no_reductions):
            if not i.is_broadcast and not any(graph.mapped(i, r) for r in ref_ids):
                return k, d
    return None


def compute_heuristics(fusion, info: RuntimeInfo) -> PointwiseParams:
    ref = _reference(fusion)
    logical = ref.domain.logical_no_reductions
    if not logical:
        return PointwiseParams(threads=1, note="0-dim outputs: one thread")
    numel = 1
    for i in logical:
        numel *= info.extent(i.maybe_expanded_extent)
    if numel == 0:
        return PointwiseParams(note="empty output")
    # The loop is the reference flattened in its memory order: vector lanes step through its
    # stride-1 dim. The outputs are allocated dense and aligned: the scheduled width is what
    # that dim's extent and the widest output along it allow; each input then gets vector loads
    # only where its own layout and dtype allow them (base.vector_inputs).
    # A broadcast innermost dim keeps vector 1 (a [1]-shaped reference: no run of elements).
    inner = _inner_dim(ref)
    inner_ext = info.extent(inner.extent) if inner is not None else 1
    graph = IdGraph(fusion)
    max_bytes = max([t.dtype.size for t in fusion.outputs if isinstance(t, TensorView)
                     and inner is not None and mapped_dim(t, inner, graph) is not None] + [1])
    full = max(1, 16 // max_bytes)
    vector = pow2_divisor(inner_ext, full)
    ragged = vector < full and numel >= full and _dense_flat_run(fusion, ref)
    if ragged:
        vector = full
        vec_inputs = flat_run_inputs(fusion, info, ref, vector)
        vec_windows = vec_gathers = ()
    else:
        vec_inputs = vector_inputs(fusion, info, vector, inner) if inner is not None else ()
        vec_windows = vector_windows(fusion, info, vector, inner) if inner is not None else ()
        vec_gathers = vector_gathers(fusion, info, vector, inner) if inner is not None else ()
    # Measured on the H100 (bench/results/2026-11-22-h100-sweeps.md), 256 MB bf16 cases:
    # - no broadcast input (silu_mul): one vector per thread in large blocks is best
    #   (512 threads x 1: 3017 GB/s; 128 x 4: 2925);
    # - a broadcast input (gelu_bias) costs an integer div/mod per vector to index it; four
    #   independent vectors per thread hide that (128 x 4: 2860 GB/s; 512 x 1: 2685).
    sms = info.device.sm_count
    if _has_broadcast_input(fusion, ref):
        threads, unroll = 128, 1
        while unroll < 4 and numel >= threads * vector * unroll * 2 * sms * 8:
            unroll *= 2
    else:
        threads, unroll = 128, 1
        while threads < 512 and numel >= threads * 2 * vector * sms * 16:
            threads *= 2
    return PointwiseParams(vector=vector, threads=threads, unroll=unroll, vector_inputs=vec_inputs,
                           vector_windows=vec_windows, vector_gathers=vec_gathers,
                           ragged=ragged)


def _dense_flat_run(fusion, ref) -> bool:
    """Whether the flat loop can run vectors across rows: every tensor it reads or writes is
    the reference's shape, dense in one order (its flat index is the loop's), with no
    broadcast input (indexed by a division of the flat index: a lane past a row's end reads
    the next row's element), window, gather, random draw or in-place output."""
    if fusion.output_aliases or _has_broadcast_input(fusion, ref):
        return False
    if any(isinstance(e, (WindowOp, GatherOp, RandOp, IotaOp, ScatterOp)) for e in fusion.exprs()):
        return False
    rank = len(ref.domain.logical_no_reductions)
    order = _memory_order(ref)
    for t in fusion.outputs:
        if not isinstance(t, TensorView):
            return False
        if len(t.domain.logical_no_reductions) != rank or _memory_order(t) != order \
                or any(i.is_broadcast for i in t.domain.logical_no_reductions):
            return False
    return True


def _memory_order(t: TensorView) -> list:
    logical = t.domain.logical_no_reductions
    return [logical.index(i) for i in t.domain.maybe_allocation if not i.is_reduction]


def flat_run_inputs(fusion, info: RuntimeInfo, ref, vector: int) -> tuple:
    """Inputs read with vectors across rows (PointwiseParams.ragged): the reference's shape and
    memory order, contiguous by definition (indexed by the flat loop), dense and aligned in
    this call (input_vector_problems, ragged)."""
    rank = len(ref.domain.logical_no_reductions)
    order = _memory_order(ref)
    out = []
    for k, v in enumerate(fusion.inputs):
        if not (isinstance(v, TensorView) and cached_uses(v)) or info.inputs[k] is None:
            continue
        if len(v.domain.logical) != rank or _memory_order(v) != order \
                or not all(c for c in v.domain.contiguity if c is not None):
            continue
        w = access_width(v.dtype, vector)
        if w > 1 and not input_vector_problems(v, info.inputs[k], w, ragged=True):
            out.append(k)
    return tuple(out)


def _has_broadcast_input(fusion, ref) -> bool:
    n = len(ref.domain.logical_no_reductions)
    for v in fusion.inputs:
        if isinstance(v, TensorView) and cached_uses(v):
            if len(v.domain.logical) < n or any(i.is_broadcast for i in v.domain.logical):
                return True
    return False


def schedule(fusion, params: PointwiseParams) -> None:
    # Inputs read with vectors, directly or through a window, get the layout the reads assume
    # (a size-1 dim defined inside the read dim moves out: fuzz 20263012:501, a [1, N] input
    # defined with its size-1 dim innermost, sliced along N). A window's source is read along
    # the window's dim (base.vector_windows).
    ref_id = _inner_dim(_reference(fusion))
    windows = [e for e in fusion.exprs() if isinstance(e, WindowOp)]
    read_dims = {}
    if params.vector_windows:
        graph = IdGraph(fusion)
        for n in params.vector_windows:
            read_dims[fusion.inputs.index(windows[n].src)] = mapped_dim(windows[n].outputs[0],
                                                                        ref_id, graph)
    orient_vector_inputs(fusion, sorted(set(params.vector_inputs) | set(read_dims)), ref_id,
                         read_dims)
    caches, outputs = cache_inputs_and_outputs(fusion)
    ref = _reference(fusion)
    if not ref.domain.logical_no_reductions:
        # 0-dim outputs only: nothing to split or bind to threads; the launch is one thread.
        inline_most(fusion=fusion)
        return
    _flatten_in_memory_order(ref)
    ref.split(0, params.vector)
    split_flat_loop(ref, params.threads, params.unroll)
    if params.vector > 1:
        inner = _inner_dim(ref)
        graph = IdGraph(fusion)
        windows = [e.outputs[0] for e in fusion.exprs() if isinstance(e, WindowOp)]
        gathers = [e.outputs[0] for e in fusion.exprs() if isinstance(e, GatherOp)]
        # Random draws of 4 consecutive elements share a Philox block: a vector of draws
        # computes one block per 4 (lower/vectorize.py; a draw at a time cost the dropout bar
        # its bandwidth: 80% of the SMs' issue slots on the H200).
        draws = ([e.outputs[0] for e in fusion.exprs() if isinstance(e, RandOp)]
                 if params.vector % 4 == 0 else [])
        for tv in ([caches[k] for k in params.vector_inputs]
                   + [windows[n] for n in params.vector_windows]
                   + [gathers[n] for n in params.vector_gathers] + draws + outputs):
            vectorize(tv, -1, params.vector, along=inner, graph=graph)
        # The heuristic's width divides the innermost extent (a kernel reused for another
        # shape has an equal heuristic, so it does too; the executor checks it): the lanes of
        # a vector lie in one row, and a row's index is read once per vector. Ragged: the
        # lanes run across rows of dense tensors, the last vector checked lane by lane.
        if params.ragged:
            fusion.ragged_vectors = True
        else:
            fusion.extent_multiples = {inner.extent: params.vector}
    inline_most(fusion=fusion)


def _flatten_in_memory_order(ref: TensorView) -> None:
    """Merge the reference's dims into one, outermost first in its allocation order."""
    order = _memory_order(ref)
    if order != list(range(len(order))):
        ref.reorder({old: new for new, old in enumerate(order)})
    if not ref.domain.loop:
        raise SchedulerError("pointwise: a 0-dim output")
    while len(ref.domain.loop) > 1:
        ref.merge(0, 1)

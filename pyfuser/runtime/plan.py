"""The plan of a segmented fusion: its segments run in order, for one input signature.

schedule/segmenter.py cuts a fusion no scheduler takes whole into segments, each with a
sub-fusion. Here each kernel segment's sub-fusion runs through a FusionExecutorCache of its
own (made once per fusion, so each keeps its own plans per signature, its kernels, and the
interpreter, empty-size and fallback handling of a one-kernel fusion); a reference segment
runs through the reference evaluator, after a FallbackWarning that names it. The tensors
between segments are allocated by the segment that writes them (dense, in the writer's
allocation order: what the reader's sub-fusion declares), passed to the segments that read
them, and dropped after the last one of them ran, so none outlives the plan's run.

A view segment (a reshape of a dense input) is the input's torch view under the new sizes.

RunInfo of a segmented run: `segments` holds one SegmentRun per segment; kind is "kernels" only
when no segment ran the reference evaluator; schedulers, num_kernels, heuristics and
kernel_names cover the kernels of every kernel segment, in order.
"""
from __future__ import annotations

import dataclasses
import warnings

from .. import options as opts
from ..ir import scalar as S
from ..ir.tensor import TensorView
from .executor import FallbackWarning, FusionExecutorCache, RunInfo
from .inputs import InputError, check_inputs, laid_out
from .reference import evaluate


class SegmentPlanError(RuntimeError):
    """A segment of a plan refused what another segment wrote: a pyfuser bug (an InputError
    escaping here would blame the user's inputs, which were checked before the plan)."""


@dataclasses.dataclass(frozen=True)
class SegmentRun:
    """What one segment of a plan ran."""

    kind: str                 # "kernel", "library", "view" or "reference"
    name: str                 # the scheduler's name, the library op's, "view" or "reference"
    why: str                  # why this scheduler, or why the reference evaluator
    run_info: RunInfo | None = None   # a kernel segment's own RunInfo (what its executor ran)


def segment_executors(segmented, name: str) -> list:
    """One FusionExecutorCache per kernel segment (None for the others), each given the
    segmenter's choice so that it schedules its sub-fusion whole."""
    from ..schedule.segmenter import SegmentedFusion
    out = []
    for k, seg in enumerate(segmented.segments):
        if seg.kind != "kernel":
            out.append(None)
            continue
        out.append(FusionExecutorCache(seg.fusion, name=f"{name}_s{k}",
                                       segmented=SegmentedFusion(seg.fusion, (seg,), seg.why)))
    return out


class SegmentedPlan:
    """The segments of one input signature, with the slots of the values between them.

    Slots: the fusion's inputs first, then each tensor a segment writes, then the extents
    sub-fusions take as scalar inputs (constant for a signature, filled in here)."""

    def __init__(self, fusion, segmented, executors, bindings, name: str, device=None):
        self.name = name
        # Where the segments run: passed to each segment's executor, since a segment fed only by
        # fills or scalars has no tensor input to tell it.
        self.device = device
        self.segmented = segmented
        self.executors = executors
        slot = {id(v): k for k, v in enumerate(fusion.inputs)}
        self.values = [None] * len(fusion.inputs)
        n_inputs = len(fusion.inputs)
        for seg in segmented.segments:
            for o in seg.outputs:
                slot.setdefault(id(o), len(self.values))
                self.values.append(None)
        for seg in segmented.segments:
            for v in seg.inputs[len(seg.inputs) - seg.extent_inputs:]:
                if id(v) not in slot:
                    slot[id(v)] = len(self.values)
                    self.values.append(int(bindings[v]))
        last_read = {}
        for k, seg in enumerate(segmented.segments):
            for v in seg.inputs:
                last_read[slot[id(v)]] = k
        keep = {slot[id(o)] for o in fusion.outputs}
        self.steps = []
        for k, seg in enumerate(segmented.segments):
            args = [slot[id(v)] for v in seg.inputs]
            outs = [slot[id(o)] for o in seg.outputs]
            free = [s for s, last in last_read.items()
                    if last == k and s >= n_inputs and s not in keep]
            self.steps.append((seg, executors[k], args, outs, free))
        self.n_inputs = n_inputs
        self.results = [slot[id(o)] for o in fusion.outputs]
        self.view_slots = {slot[id(o)] for seg in segmented.segments if seg.kind == "view"
                           for o in seg.outputs}
        self.intermediate_bytes = 0
        self.run_info: RunInfo | None = None
        for k, seg in enumerate(segmented.segments):
            if seg.kind == "reference":
                _warn_reference(name, k, seg)

    def run(self, inputs):
        vals = list(self.values)
        vals[:self.n_inputs] = inputs
        first = self.run_info is None
        moved = 0
        for k, (seg, executor, args, outs, free) in enumerate(self.steps):
            ins = [vals[s] for s in args]
            if executor is not None:
                try:
                    results = executor.run(ins, device=self.device)
                except InputError as error:
                    # The executor checked the user's inputs before this plan was made (its
                    # key fixes their dtypes, shapes and strides): a segment refusing the
                    # values the plan hands it is pyfuser's bug, not the user's.
                    raise SegmentPlanError(
                        f"{self.name}: segment {k} ({seg.why}) refused the tensors the plan "
                        f"handed it: {error}") from error
                if executor.last_run.kind == "reference":
                    # A kernel segment whose heuristic refused this call ran the reference
                    # evaluator, which returns torch's layouts: the segments reading its outputs
                    # declare them as a kernel writes them (fuzz 20261202:28).
                    results = laid_out(seg.fusion, results)
            elif seg.kind == "library":
                results = _run_library(seg, ins)
            elif seg.kind == "view":
                results = _run_view(seg, ins)
            else:
                results = _run_reference(seg, ins)
            for s, r in zip(outs, results):
                vals[s] = r
            if first:
                # Global traffic beside the fusion's inputs and outputs: reads of what other
                # segments wrote, and writes of what only segments read (a view is neither:
                # its reads are reads of the fusion's input).
                moved += sum(_nbytes(vals[s]) for s in args
                             if s >= self.n_inputs and s not in self.view_slots)
                if seg.kind != "view":
                    moved += sum(_nbytes(vals[s]) for s in outs if s not in self.results)
            for s in free:
                vals[s] = None
        if first:
            self.intermediate_bytes = moved
            self.run_info = self._run_info()
        return [vals[s] for s in self.results]

    def _run_info(self) -> RunInfo:
        entries, infos = [], []
        for seg, executor, *_ in self.steps:
            info = executor.last_run if executor is not None else None
            entries.append(SegmentRun(seg.kind, seg.name, seg.why, info))
            if info is not None:
                infos.append(info)
        fallbacks = [(k, e) for k, e in enumerate(entries)
                     if e.kind == "reference" or (e.run_info is not None
                                                  and e.run_info.kind != "kernels")]
        kind = "reference" if fallbacks else "kernels"
        if fallbacks:
            reason = "; ".join(
                f"segment {k} ({e.name}) ran the reference evaluator: "
                f"{e.run_info.reason if e.run_info is not None else e.why}" for k, e in fallbacks)
        else:
            count = len(entries)
            reason = f"{count} segment{'s' if count != 1 else ''}: {self.segmented.why}"
        backends = {i.backend for i in infos if i.backend}
        return RunInfo(
            kind, sum((i.schedulers for i in infos), ()), sum(i.num_kernels for i in infos),
            reason, sum((i.heuristics for i in infos), ()), sum((i.kernel_names for i in infos), ()),
            # The segments' own workspaces, and the intermediates between segments: each
            # written once and read by every segment that reads it.
            sum(i.workspace_bytes for i in infos) + self.intermediate_bytes,
            sum((i.clusters for i in infos), ()),
            backend=backends.pop() if len(backends) == 1 else ",".join(sorted(backends)),
            internal_error="; ".join(i.internal_error for i in infos if i.internal_error),
            traceback="".join(i.traceback for i in infos if i.traceback),
            segments=tuple(entries))


def _nbytes(x) -> int:
    import torch
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def _warn_reference(name: str, k: int, seg) -> None:
    ops = ", ".join(sorted({type(e).__name__ for e in seg.exprs}))
    if opts.current().is_enabled("reference_fallback") is False:
        raise RuntimeError(f"{name}: segment {k} ({ops}): {seg.why}; the reference fallback is "
                           "disabled (PYFUSER_DISABLE=reference_fallback)")
    warnings.warn(f"{name}: segment {k} ({ops}): {seg.why}; running it with the reference "
                  "evaluator", FallbackWarning, stacklevel=6)


def _run_library(seg, ins) -> list:
    """A library segment: its op (runtime/library.py: torch, cuBLAS on a GPU) on the segment's
    inputs, on the current stream; outputs laid out as a kernel segment's are."""
    from .library import run_library_op
    fusion = seg.fusion
    check_inputs(fusion, ins)
    env = {id(v): x for v, x in zip(fusion.inputs, ins)}
    for e in fusion.exprs():
        if not any(isinstance(o, TensorView) for o in e.outputs):
            continue          # extent arithmetic: the library call takes shapes from tensors
        for o, r in zip(e.outputs, run_library_op(e, [env[id(i)] for i in e.inputs])):
            env[id(o)] = r
    return laid_out(fusion, [env[id(o)] for o in fusion.outputs])


def _run_view(seg, ins) -> list:
    """A view segment (schedule/segmenter.py): its input, dense by its declaration, under the
    reshape's sizes: no kernel, no copy."""
    fusion = seg.fusion
    bindings = check_inputs(fusion, ins)
    out = fusion.outputs[0]
    sizes = [int(S.evaluate(i.user_extent if i.is_broadcast else i.extent, dict(bindings)))
             for i in out.domain.logical_no_reductions]
    try:
        return [ins[0].view(sizes)]
    except RuntimeError as error:
        raise SegmentPlanError(f"segment {seg.why}: {error}") from error


def _run_reference(seg, ins) -> list:
    """The reference evaluator on a segment; its outputs laid out as a kernel segment's are
    (dense in allocation order), since later segments' sub-fusions declare them so."""
    fusion = seg.fusion
    bindings = check_inputs(fusion, ins)
    return laid_out(fusion, evaluate(fusion, list(ins), extent_bindings=bindings))

"""The plan of a segmented fusion: its segments run in order, for one input signature.

schedule/segmenter.py cuts a fusion no scheduler takes whole into segments, each with a
sub-fusion. Here each kernel segment's sub-fusion runs through a FusionExecutorCache of its
own (made once per fusion, so each keeps its own plans per signature, its kernels, and the
interpreter, empty-size and fallback handling of a one-kernel fusion); a reference segment
runs through the reference evaluator, after a FallbackWarning that names it. The tensors
between segments are allocated by the segment that writes them (dense, in the writer's
allocation order: what the reader's sub-fusion declares), passed to the segments that read
them, and dropped after the last one of them ran, so none outlives the plan's run; except the
small ones a kernel writes (REUSED_INTERMEDIATE_BYTES), which the plan allocates once per
stream and thread and hands to the kernel at every call, as it does for in-place outputs
(execute copies them into their inputs after the plan ran, and does not return them).

The first run binds each kernel segment's own plan (FusionExecutorCache.plan_for); later runs
call those plans directly, without the segment executors' signature keys and look-ups: the
plan's signature fixes its segments' (measured on the H100, BatchNorm forward's plan of three
kernels took 104 us of host time per call, more than its kernels' 88).

A view segment (a reshape of a dense input) is the input's torch view under the new sizes.

RunInfo of a segmented run: `segments` holds one SegmentRun per segment; kind is "kernels" only
when no segment ran the reference evaluator; schedulers, num_kernels, heuristics and
kernel_names cover the kernels of every kernel segment, in order.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import warnings

import torch

from .. import options as opts
from ..ir import scalar as S
from ..ir.dtype import to_torch
from ..ir.tensor import TensorView
from . import launch
from .executor import FallbackWarning, FusionExecutorCache, RunInfo, _KernelPlan
from .inputs import InputError, check_inputs, laid_out, lay_out, output_strides
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

    # An intermediate of up to this many bytes is allocated once per plan (and stream and
    # thread) and written again by every call: a plan of short kernels waits on the host, where
    # an allocation costs 2-3 us on the H100; a larger one is allocated per call (its kernels
    # take far longer than its allocation, and a cached plan would hold its memory).
    REUSED_INTERMEDIATE_BYTES = 1 << 20
    # (stream, thread) pairs whose reused intermediates a plan keeps (the first made dropped).
    REUSE_KEYS = 4

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
        # What execute hands the caller: every other tensor a kernel writes (intermediates, and
        # in-place outputs, which execute copies into their inputs) may go to a reused buffer.
        self.returned = {s for k, s in enumerate(self.results) if k not in fusion.hidden_outputs}
        self.intermediate_bytes = 0
        self.run_info: RunInfo | None = None
        # After the first run: per step, (run, argument slots, output slots, slots to free,
        # whether its outputs are laid out again, its sub-fusion).
        self.bound: list | None = None
        # Step -> (its number of outputs, [(output index, spec)] of the intermediates it writes
        # into reused buffers); (stream, thread) -> per step, the buffers (see run()).
        self.reused: dict = {}
        self._reuse: dict = {}
        for k, seg in enumerate(segmented.segments):
            if seg.kind == "reference":
                _warn_reference(name, k, seg)

    def run(self, inputs):
        if self.bound is None:
            return self._first_run(inputs)
        vals = list(self.values)
        vals[:self.n_inputs] = inputs
        buffers = self._buffers() if self.reused else None
        for k, (run, args, outs, free, relayout, fusion) in enumerate(self.bound):
            ins = [vals[s] for s in args]
            results = run(ins) if buffers is None or buffers[k] is None else run(ins, buffers[k])
            if relayout:
                results = laid_out(fusion, results)
            for s, r in zip(outs, results):
                vals[s] = r
            for s in free:
                vals[s] = None
        return [vals[s] for s in self.results]

    def _first_run(self, inputs):
        """The first call: each kernel segment's executor makes (or finds) the plan of its
        inputs, which the plan binds and calls directly from then on: the signature of every
        segment's inputs follows from the plan's own (the fusion's inputs, views of them, and
        intermediates its segments allocate as their sub-fusions declare them)."""
        vals = list(self.values)
        vals[:self.n_inputs] = inputs
        moved = 0
        bound = []
        for k, (seg, executor, args, outs, free) in enumerate(self.steps):
            ins = [vals[s] for s in args]
            relayout = False
            if executor is not None:
                try:
                    inner = executor.plan_for(ins, device=self.device)
                    results = inner.run(ins)
                except InputError as error:
                    # The executor checked the user's inputs before this plan was made (its
                    # key fixes their dtypes, shapes and strides): a segment refusing the
                    # values the plan hands it is pyfuser's bug, not the user's.
                    raise SegmentPlanError(
                        f"{self.name}: segment {k} ({seg.why}) refused the tensors the plan "
                        f"handed it: {error}") from error
                executor.last_run = inner.run_info
                # A kernel segment whose heuristic refused this call ran the reference
                # evaluator, which returns torch's layouts: the segments reading its outputs
                # declare them as a kernel writes them (fuzz 20261202:28).
                relayout = inner.run_info.kind == "reference"
                if relayout:
                    results = laid_out(seg.fusion, results)
                run = inner.run
            elif seg.kind == "library":
                # Bound to the plan's signature: later runs skip the input check.
                run = _LibraryRun(seg, ins)
                results = run(ins)
            else:
                results = _RUNNERS[seg.kind](seg, ins)
                # A view's sizes are the signature's: later runs only take the view.
                if seg.kind == "view":
                    dims = _view_permutation(seg)
                    run = (functools.partial(_view, tuple(results[0].shape)) if dims is None
                           else functools.partial(_permuted, tuple(dims)))
                else:
                    run = functools.partial(_RUNNERS[seg.kind], seg)
            bound.append((run, args, outs, free, relayout, seg.fusion))
            for s, r in zip(outs, results):
                vals[s] = r
            # Global traffic beside the fusion's inputs and outputs: reads of what other
            # segments wrote, and writes of what only segments read (a view is neither: its
            # reads are reads of the fusion's input).
            moved += sum(_nbytes(vals[s]) for s in args
                         if s >= self.n_inputs and s not in self.view_slots)
            if seg.kind != "view":
                moved += sum(_nbytes(vals[s]) for s in outs if s not in self.results)
            self._note_reusable(k, run, outs, vals)
            for s in free:
                vals[s] = None
        self.intermediate_bytes = moved
        self.run_info = self._run_info()
        self.bound = bound
        return [vals[s] for s in self.results]

    def _note_reusable(self, k: int, run, outs, vals) -> None:
        """Record the tensors step k writes that later calls write into again: the small ones
        (REUSED_INTERMEDIATE_BYTES) that execute does not return, of a kernel plan on a CUDA
        device."""
        plan = getattr(run, "__self__", None)
        if not isinstance(plan, _KernelPlan):
            return
        specs = [(k_out, vals[s]) for k_out, s in enumerate(outs)
                 if s not in self.returned and vals[s] is not None and vals[s].is_cuda
                 and _nbytes(vals[s]) <= self.REUSED_INTERMEDIATE_BYTES]
        if specs:
            self.reused[k] = (len(outs), [(j, plan.out_specs[j]) for j, _ in specs])

    def _buffers(self) -> list:
        """Per step, the tensors its kernel writes its reused intermediates into (None for
        the others), for the current stream and thread: calls on one stream run in order,
        calls on two streams or threads must not share them."""
        key = (launch.current_stream_handle(self.device.index or 0), threading.get_ident())
        cache = self._reuse
        got = cache.get(key)
        if got is None:
            got = [None] * len(self.steps)
            for k, (n, specs) in self.reused.items():
                into = [None] * n
                for j, (sz, st, dt) in specs:
                    into[j] = torch.empty_strided(sz, st, dtype=dt, device=self.device)
                got[k] = into
            cache[key] = got
            if len(cache) > self.REUSE_KEYS:
                cache.pop(next(iter(cache)))
        return got

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
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def _warn_reference(name: str, k: int, seg) -> None:
    ops = ", ".join(sorted({type(e).__name__ for e in seg.exprs}))
    if opts.current().is_enabled("reference_fallback") is False:
        raise RuntimeError(f"{name}: segment {k} ({ops}): {seg.why}; the reference fallback is "
                           "disabled (PYFUSER_DISABLE=reference_fallback)")
    warnings.warn(f"{name}: segment {k} ({ops}): {seg.why}; running it with the reference "
                  "evaluator", FallbackWarning, stacklevel=6)


class _LibraryRun:
    """A library segment: its ops (runtime/library.py: torch, cuBLAS on a GPU) on the segment's
    inputs, on the current stream, outputs laid out as a kernel segment's are. Bound to the
    signature of its plan's first call (a plan serves one signature: its extents, and so its
    outputs' sizes and strides, are fixed): the inputs are checked and the extents evaluated
    once. Checked at every call, they took about 70 us of host time per call on the H200's
    host, 4x eager's F.linear (session 25)."""

    def __init__(self, seg, ins):
        from .library import run_library_op
        self._run_op = run_library_op
        fusion = seg.fusion
        bindings = dict(check_inputs(fusion, ins))
        self.sizes = lambda extent: int(S.evaluate(extent, bindings))
        slot = {id(v): k for k, v in enumerate(fusion.inputs)}
        self.steps = []
        for e in fusion.exprs():
            if not any(isinstance(o, TensorView) for o in e.outputs):
                continue      # extent arithmetic: the library call takes shapes from tensors
            outs = []
            for o in e.outputs:
                slot[id(o)] = len(slot)
                outs.append(slot[id(o)])
            self.steps.append((e, [slot[id(i)] for i in e.inputs], outs))
        self.n_values = len(slot)
        self.outputs = [(slot[id(o)], o, to_torch(o.dtype)) for o in fusion.outputs]
        self.strides: list | None = None    # each output's, as a kernel writes it (first call)

    def __call__(self, ins) -> list:
        vals = list(ins) + [None] * (self.n_values - len(ins))
        for e, args, outs in self.steps:
            for k, r in zip(outs, self._run_op(e, [vals[a] for a in args], self.sizes)):
                vals[k] = r
        results = [vals[k] for k, _, _ in self.outputs]
        if self.strides is None:
            self.strides = [output_strides(o, list(r.shape))
                            for (_, o, _), r in zip(self.outputs, results)]
        return [r if r.dtype == dtype and list(r.stride()) == strides else lay_out(o, r, dtype)
                for (_, o, dtype), r, strides in zip(self.outputs, results, self.strides)]


def _run_view(seg, ins) -> list:
    """A view segment (schedule/segmenter.py): its input, dense by its declaration, under the
    reshape's sizes, or with its dims permuted: no kernel, no copy."""
    fusion = seg.fusion
    bindings = check_inputs(fusion, ins)
    dims = _view_permutation(seg)
    if dims is not None:
        return _permuted(dims, ins)
    out = fusion.outputs[0]
    sizes = [int(S.evaluate(i.maybe_expanded_extent, dict(bindings)))
             for i in out.domain.logical_no_reductions]
    try:
        return [ins[0].view(sizes)]
    except RuntimeError as error:
        raise SegmentPlanError(f"segment {seg.why}: {error}") from error


def _view_permutation(seg):
    """The dims of a view segment that permutes its input, else None (a reshape)."""
    from ..schedule.segmenter import permutation
    exprs = seg.fusion.exprs()
    return permutation(exprs[0]) if len(exprs) == 1 else None


def _view(sizes, ins) -> list:
    return [ins[0].view(sizes)]


def _permuted(dims, ins) -> list:
    return [ins[0].permute(dims)]


def _run_reference(seg, ins) -> list:
    """The reference evaluator on a segment; its outputs laid out as a kernel segment's are
    (dense in allocation order), since later segments' sub-fusions declare them so."""
    fusion = seg.fusion
    bindings = check_inputs(fusion, ins)
    return laid_out(fusion, evaluate(fusion, list(ins), extent_bindings=bindings))


# How a plan runs a segment that has no executor, by kind.
_RUNNERS = {"view": _run_view, "reference": _run_reference}

"""The plan of a fusion for given inputs, without a GPU: `fd.explain(inputs, device="h100")`.

What execute() would do on that device, computed the way the executor computes it: the
segmentation (schedule/segmenter.py; searched afresh, not replayed from the disk cache as
execute() does, so that explaining writes nothing there: a replayed decision gives the same
segments), then for each kernel segment its sub-fusion's scheduling clone, RuntimeInfo and
heuristic, and the kernel's launch; with `compile=True`, NVRTC's ptxas report for the device's
architecture. The heuristics read the device table (runtime/device.py),
so the answer is the same on any machine.

Inputs may be CPU tensors or `meta` tensors (only sizes, strides and dtypes are read); data
pointers are taken as 16-byte aligned, as a fresh torch allocation is. The tensors between
segments are described as the plan allocates them (runtime/plan.py): dense in their writer's
allocation order, with sizes from the bound extents.

Not modelled: the grid a cooperative or persistent kernel is fitted to on the live device (it
reads the compiled kernel's occupancy: a clustered matmul's 132 CTAs become 128 on the H200),
and the launch-time checks of vector widths and bulk rows, which send a fusion to the
reference evaluator with a FallbackWarning.
"""
from __future__ import annotations

import dataclasses

import torch

from ..ir import scalar as S
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView
from ..ir.dtype import from_torch
from .device import DeviceProperties, get_device_properties
from .executor import index_type_for
from .empty_dims import empty_call, specialize
from .inputs import check_inputs, heuristic_info, output_sizes, output_strides


@dataclasses.dataclass(frozen=True)
class KernelExplanation:
    """The kernel of one kernel segment: its heuristic, launch and (compiled) ptxas report."""

    name: str
    scheduler: str
    params: object            # the scheduler's frozen heuristic dataclass
    heuristic: str            # params.describe()
    index_type: str
    grid: tuple
    block: tuple
    kernel: object            # runtime.fusion_kernel.FusionKernel (.source, .stages)
    ptxas: str | None = None  # with compile=True


@dataclasses.dataclass(frozen=True)
class SegmentExplanation:
    index: int
    kind: str                 # "kernel", "library", "view" or "reference"
    name: str                 # the scheduler's name, the library op's, "view" or "reference"
    why: str
    rejected: tuple           # (scheduler name, why not) tried before the chosen one
    inputs: tuple             # one line per input: "T3 [64, 256] bfloat16" or "i5 = 7"
    outputs: tuple            # "T7 [64, 256] float"
    kernel: KernelExplanation | None = None
    refused: str = ""         # why the heuristic refused these inputs
    library_call: str = ""    # a library segment's op and what runs it
    # Where the heuristic refused: the plan of the segment without that scheduler, which
    # execute() runs instead (an Explanation).
    again: object = None

    def __str__(self) -> str:
        what = self.kind if self.name == self.kind else f"{self.kind} {self.name}"
        lines = [f"segment {self.index}: {what}", f"  why: {self.why}"]
        for name, why in self.rejected:
            lines.append(f"  not {name}: {why}")
        lines.append(f"  inputs: {', '.join(self.inputs)}")
        lines.append(f"  outputs: {', '.join(self.outputs)}")
        if self.library_call:
            lines.append(f"  call: {self.library_call}")
        if self.refused:
            lines.append(f"  heuristic refuses these inputs: {self.refused}; execute() plans "
                         f"this segment again without the {self.name} scheduler:")
            lines.append("    " + str(self.again).replace("\n", "\n    "))
        k = self.kernel
        if k is not None:
            lines.append(f"  kernel {k.name}, {k.index_type} indexing")
            lines.append("  heuristic: " + k.heuristic.replace("\n", "\n    "))
            lines.append(f"  launch: grid {k.grid}, block {k.block}")
            if k.ptxas is not None:
                lines.append("  ptxas: " + k.ptxas.strip().replace("\n", "\n         "))
        if self.kind == "reference":
            lines.append("  execute() runs this segment with the reference evaluator "
                         "(with a FallbackWarning)")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What execute() would run for some inputs on a device: `segmentation` is the segmenter's
    summary (the text PYFUSER_DUMP=segments prints), `segments` one SegmentExplanation each."""

    name: str
    device: DeviceProperties
    segmented: object         # schedule.segmenter.SegmentedFusion
    segments: tuple
    # What execute() rewrote before planning (matmuls of few rows as reductions), or "".
    rewritten: str = ""

    @property
    def segmentation(self) -> str:
        return str(self.segmented)

    @property
    def kernels(self) -> list:
        return [s.kernel for s in self.segments if s.kernel is not None]

    @property
    def segments_run(self) -> list:
        """The segments execute() runs for the call, in order: each one whose heuristic refused
        the call replaced by the plan it is run as instead."""
        return [leaf for s in self.segments
                for leaf in (s.again.segments_run if s.refused else [s])]

    @property
    def kernels_run(self) -> list:
        """The kernels execute() launches for the call, in order (tests/fuzz/
        test_explain_agrees.py holds them to the interpreter's runs)."""
        return [s.kernel for s in self.segments_run if s.kernel is not None]

    def __str__(self) -> str:
        head = f"{self.name} on {self.device.name} ({self.device.arch}): {self.segmentation}"
        if self.rewritten:
            head = f"{head}\n  rewritten first: {self.rewritten}"
        return "\n\n".join([head] + [str(s) for s in self.segments])


def explain_fusion(fusion, inputs, device: str | DeviceProperties = "h100",
                   compile: bool = False, name: str = "fusion",
                   exclude: dict | None = None) -> Explanation:
    """The plan execute() would make for `inputs` on `device` (a device-table name such as
    "h100" or "h200", or DeviceProperties), computed without a GPU; see the module docstring.
    `exclude`: schedulers whose heuristic refused these inputs (name -> why), as execute()
    segments a fusion again without them."""
    from .. import options
    from ..schedule import few_row_matmuls, split_normalizations
    from ..schedule.logsumexp import fuse_logsumexp
    from ..schedule.schedulers import registry
    from ..schedule.segmenter import segment

    props = device if isinstance(device, DeviceProperties) else get_device_properties(device)
    fusion = fuse_logsumexp(fusion)          # as FusionExecutorCache plans it
    bindings = check_inputs(fusion, inputs)
    rewritten = ""
    prefix = name            # the kernels' names: the executor's, with its rewrites' suffixes
    # Dims of size 0, as FusionExecutorCache._make_plan plans them (runtime/empty_dims.py).
    no_kernels, empty = empty_call(fusion, bindings, output_sizes(fusion, bindings))
    if no_kernels:
        return Explanation(name, props, _NoKernels(no_kernels), ())
    if empty:                                # the fusion specialized to what has elements
        rewritten = empty.describe()
        prefix = f"{prefix}_nonempty"         # each rewrite's executor's name, as execute()
        fusion = specialize(fusion, empty)
        bindings = check_inputs(fusion, inputs)
    rewrite = few_row_matmuls.rewritable(fusion, bindings, inputs, options.current())
    if rewrite:                              # as FusionExecutorCache._make_plan
        rewritten = "; ".join(filter(None, [rewritten,
                                            few_row_matmuls.describe(fusion, rewrite)]))
        fusion = few_row_matmuls.as_reductions(fusion, rewrite)
        prefix = f"{prefix}_as_reduction"
        bindings = check_inputs(fusion, inputs)   # the clone's extents
    segmented = segment(fusion, exclude)
    split = split_normalizations.better_split(fusion, segmented, exclude)
    if split is not None:                    # as FusionExecutorCache._split_plan
        rewritten = "; ".join(filter(None, [rewritten, split_normalizations.DESCRIPTION]))
        fusion, segmented = split
        prefix = f"{prefix}_split"
        if exclude:
            # A rewrite made after refusals runs through its own executor, which plans it from
            # every scheduler and refuses for itself (FusionExecutorCache._split_plan gives it
            # no segmentation then): the refused scheduler may take the rewrite.
            exclude = None
            segmented = segment(fusion, None)
        bindings = check_inputs(fusion, inputs)
    values = {id(v): _as_meta(x) for v, x in zip(fusion.inputs, inputs)}
    several = len(segmented.segments) > 1
    out = []
    for k, seg in enumerate(segmented.segments):
        for v, declared in zip(seg.inputs, seg.fusion.inputs):
            if id(v) not in values:
                # An extent a sub-fusion takes as a scalar input, or a tensor between segments.
                values[id(v)] = (_intermediate(v, declared.dtype, bindings)
                                 if isinstance(v, TensorView)
                                 else int(S.evaluate(v, dict(bindings))))
        ins = [values[id(v)] for v in seg.inputs]
        outs = []
        if seg.kind == "view":
            # As the plan runs it (runtime/plan.py _run_view): a permute's view keeps its
            # input's strides, permuted.
            from .plan import _view_permutation
            dims = _view_permutation(seg)
            if dims is not None:
                values.setdefault(id(seg.outputs[0]), ins[0].permute(dims))
        for o, written in zip(seg.outputs, seg.fusion.outputs):
            # As the segment writes it: a view has its input's dtype, not the reshape's.
            values.setdefault(id(o), _intermediate(o, written.dtype, bindings))
            outs.append(values[id(o)])
        choice = seg.choice
        if choice is None and seg.kind == "reference":
            choice = registry.choose(seg.fusion)     # for the schedulers that refused it
        entry = dict(index=k, kind=seg.kind, name=seg.name, why=seg.why,
                     rejected=tuple(choice.rejected) if choice is not None else (),
                     inputs=tuple(_describe(v, x) for v, x in zip(seg.inputs, ins)),
                     outputs=tuple(_describe(v, x) for v, x in zip(seg.outputs, outs)))
        if seg.kind == "library":
            from .library import describe
            entry["library_call"] = "; ".join(describe(e) for e in seg.exprs)
        elif seg.kind == "kernel":
            # The name execute() gives the segment executor's first kernel.
            kname = f"{prefix}_s{k}" if several else prefix
            kname = f"{kname}_{seg.scheduler.NAME}_0"
            try:
                entry["kernel"] = _kernel(seg, ins, outs, props, compile, kname)
            except _Refused as e:
                entry["refused"] = str(e)
                # As execute(): the whole fusion's re-plan keeps the schedulers refused before
                # it; a segment's executor starts from its own refusal.
                again = {seg.scheduler.NAME: str(e)}
                entry["again"] = explain_fusion(
                    seg.fusion, ins, props, compile, f"{prefix}_s{k}" if several else prefix,
                    again if several else {**(exclude or {}), **again})
        out.append(SegmentExplanation(**entry))
    return Explanation(name, props, segmented, tuple(out), rewritten)


class _Refused(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class _NoKernels:
    """The plan of a call that launches nothing (every output empty, or an index into a dim of
    size 0): what execute() does instead, in the explanation's summary line."""

    why: str
    segments: tuple = ()

    def __str__(self) -> str:
        return f"no kernels: {self.why}"


def _kernel(seg, ins, outs, props, compile_now: bool, name: str) -> KernelExplanation:
    """As executor._kernel_plan: the scheduling clone, RuntimeInfo and heuristic of the
    segment's sub-fusion, then the kernel built (and compiled) from them."""
    from ..schedule.schedulers.base import SchedulerError
    from .fusion_kernel import build_kernel

    sched = seg.choice.scheduler
    clone, info = heuristic_info(seg.fusion, ins, props)
    tensors = [x for x in ins if isinstance(x, torch.Tensor)]
    index_type = index_type_for(tensors)
    if any(o.numel() >= 2 ** 31 - 1 for o in outs):
        index_type = "int64"
    # A refusal by the heuristic or by the schedule itself (the executor's _kernel_plan
    # catches both and plans without the scheduler; so does explain).
    try:
        params = sched.compute_heuristics(clone, info)
        fk = build_kernel(clone, sched, params, index_type, name, compile_now=compile_now)
    except SchedulerError as e:
        raise _Refused(str(e)) from None
    grid, block = fk.launch_dims(info.bindings)
    return KernelExplanation(fk.name, sched.NAME, params,
                             params.describe() if hasattr(params, "describe") else repr(params),
                             index_type, grid, block, fk,
                             fk.stages.get("ptxas") if compile_now else None)


def _as_meta(x):
    """A meta tensor of `x`'s sizes, strides and dtype (so tensors between segments, which are
    meta, sit on one device with the inputs); other inputs as they are."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _intermediate(v: TensorView, dtype, bindings: dict):
    """A meta tensor of `dtype` for a tensor a segment writes: sizes from the bound extents,
    strides dense in allocation order as the plan allocates it."""
    from ..ir.dtype import to_torch
    sizes = [int(S.evaluate(i.maybe_expanded_extent, dict(bindings)))
             for i in v.domain.logical_no_reductions]
    return torch.empty_strided(sizes, output_strides(v, sizes), dtype=to_torch(dtype),
                               device="meta")


def _describe(v, x) -> str:
    if isinstance(v, TensorView):
        return f"T{v.name} {list(x.shape)} {from_torch(x.dtype).short_name}"
    if isinstance(v, Scalar):
        return f"{v.symbol or S.scalar_str(v)} = {x}"
    return repr(x)

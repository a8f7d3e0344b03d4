"""Running a fusion: the executor cache.

Fast path (a call with the same input signature as an earlier one): one dict look-up keyed on
each input's dtype, sizes, strides, pointer alignment and device, then output allocation,
pointer patching and one launch. Validation is folded into the key: a signature is only
cached after check_inputs accepted it, so a wrong input never matches.

Slow path (a new signature): check_inputs, segment the fusion (once per fusion:
schedule/segmenter.py; for a plan of several segments on the GPU, the segmenter's decision is
kept in the disk cache, so that a new process replays it instead of searching again), and for
a fusion one scheduler takes whole compute its heuristic, and reuse a compiled kernel whose
heuristic is equal (kernels are shared across shapes) or schedule a clone of the fusion, lower,
generate CUDA and compile it. A fusion of several segments runs as a
plan of them (runtime/plan.py: an executor like this one per kernel segment, the reference
evaluator for reference segments). Inputs not on a CUDA device run through the reference
evaluator; RunInfo says what ran. Degenerate sizes: when every output is empty, only the
outputs are allocated (no launch); when some are, or a sum over a dim of size 0 reaches an
output, the kernels of the fusion specialized to what has elements run (runtime/empty_dims.py:
empty outputs allocated, sums of no elements filled with 0). With `interpret` enabled, CPU
inputs run the generated kernels on the kernel-IR interpreter instead (scheduled for a
device-table entry, PYFUSER_DEVICE, by default the H100 with 4 SMs).

No internal error reaches the caller: a scheduling, lowering, code generation or compilation
failure on a fusion a scheduler accepted is a pyfuser bug, so the fusion runs through the
reference evaluator with a FallbackWarning that says so (RunInfo.internal_error holds the error;
PYFUSER_DISABLE=reference_fallback raises it instead).
"""
from __future__ import annotations

import dataclasses
import traceback
import warnings
from collections import OrderedDict

from .. import options as opts
from ..schedule import few_row_matmuls, split_normalizations
from ..schedule.logsumexp import fuse_logsumexp
from ..schedule.roles import has_shared_roles, scheduling_clone
from ..schedule.segmenter import segment
from ..schedule.schedulers.base import InputFacts, RuntimeInfo, SchedulerError, facts_per_input
from . import index_check
from .empty_dims import INDEX_INTO_NOTHING, SpecializedPlan, empty_call, specialize
from .inputs import InputError, check_inputs, not_a_list, output_sizes, output_strides
from .output_aliases import write_aliased_outputs
from .rewritten_plan import RewrittenPlan
from .reference import evaluate


class FallbackWarning(UserWarning):
    """A fusion ran through the reference evaluator instead of generated kernels (RunInfo.reason
    says why)."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What one execute() ran: tests assert on it so that no fallback goes unnoticed."""

    kind: str                      # "kernels" or "reference"
    schedulers: tuple[str, ...]    # one per kernel, e.g. ("pointwise",)
    num_kernels: int
    reason: str = ""               # why the reference evaluator ran, or why this scheduler
    heuristics: tuple = ()         # the heuristic of each kernel
    kernel_names: tuple = ()
    # Bytes the kernels move through global intermediates (column partials of a norm
    # backward: written once, read once), beside the fusion's own inputs and outputs.
    workspace_bytes: int = 0
    clusters: tuple = ()           # each kernel's launch cluster dims, None without clusters
    # Where the kernels ran: "cuda" (the GPU) or "interpreter" (the kernel-IR interpreter on the
    # CPU); "" for the reference evaluator.
    backend: str = ""
    # For a reference run forced by a pyfuser bug (scheduling, lowering, codegen, NVRTC): the
    # error, "Type: message", and its traceback. The fuzzer counts these as failures.
    internal_error: str = ""
    traceback: str = dataclasses.field(default="", repr=False, compare=False)
    # A segmented fusion's plan (runtime/plan.py): one plan.SegmentRun per segment (its kind,
    # scheduler or library op, why, and a kernel segment's own RunInfo); empty when the whole
    # fusion ran as one kernel or through the reference evaluator alone.
    segments: tuple = ()


def _alignment(ptr: int) -> int:
    a = 16
    while a > 1 and ptr % a:
        a //= 2
    return a


def index_type_for(tensors) -> str:
    """32-bit indexing when every tensor's largest offset fits, else 64-bit."""
    for t in tensors:
        span = 1
        for size, stride in zip(t.shape, t.stride()):
            if size > 1:
                span += (size - 1) * abs(stride)
        if span >= 2 ** 31 - 1 or t.numel() >= 2 ** 31 - 1:
            return "int64"
    return "int"


# PYFUSER_DUMP stages printed while a kernel is built (none of them on a disk hit).
_BUILD_STAGES = ("scheduled_ir", "transforms", "heuristics", "kernel_ir", "kernel_ir_passes",
                 "cuda", "ptxas")
_torch_tensor = None     # torch.Tensor, bound on the first call (torch is imported lazily)


def _bind_torch_tensor():
    global _torch_tensor
    import torch
    _torch_tensor = torch.Tensor
    return _torch_tensor


def signature_class(inputs) -> tuple:
    """What the disk cache keys on about the call's inputs besides the heuristic: per tensor its
    dtype, rank, stride order, which dims are dense over the ones inside them, and its pointer
    alignment; per scalar its type. The extents a heuristic specializes on are in its result
    (an equal heuristic is an equal kernel), so they are not repeated here."""
    out = []
    for x in inputs:
        shape = getattr(x, "shape", None)
        if shape is None:
            out.append(type(x).__name__)
            continue
        strides = x.stride()
        order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
        dense, span = [], 1
        for d in reversed(order):
            dense.append(strides[d] == span)
            span *= shape[d]
        out.append((str(x.dtype), len(shape), tuple(order), tuple(reversed(dense)),
                    _alignment(x.data_ptr())))
    return tuple(out)


def plan_key_fields(fusion, scheduler: str, params, index_type: str, options, signature,
                    device, text: str | None = None) -> dict:
    """Everything that changes a kernel, known before scheduling: the fields of
    kernel_cache.plan_key (which adds the NVRTC version and pyfuser's source hash). `text`:
    `fusion`'s canonical text where the caller has it already."""
    from ..ir.fingerprint import fusion_text
    from .fusion_kernel import ARCH
    fields = {"fusion": text or fusion_text(fusion), "signature": signature, "scheduler": scheduler,
              "heuristic": repr(params), "index_type": index_type,
              "device": repr(device), "arch": ARCH}
    enable, disable = opts.kernel_features(options)
    fields["enable"], fields["disable"] = list(enable), list(disable)
    if any(t.dtype.is_float8 for t in fusion.tensors()):
        # The kernel converts into e4m3fn by the installed torch's rule (NaN before 2.13,
        # saturation since: codegen/device_library.py): a disk cache shared across torch
        # versions must not hand one's kernel to the other.
        from ..ir.dtype import e4m3fn_overflow_is_nan
        fields["e4m3fn_overflow_is_nan"] = e4m3fn_overflow_is_nan()
    return fields


def _requested_device(name: str, device, tensors, options):
    """The CUDA torch.device a call runs on, or None (CPU tensors: the reference evaluator, or
    the interpreter). Tensor inputs decide; `device` (execute's) must agree with them. A fusion
    without tensor inputs (factories, scalars, a segment of a plan fed only by fills) runs on
    `device`, by default the current CUDA device, as torch's factories do with device="cuda"."""
    import torch
    wanted = None
    if device is not None:
        try:
            wanted = (torch.device("cuda", device) if isinstance(device, int)
                      else torch.device(device))
        except (RuntimeError, TypeError) as error:
            raise InputError(f"{name}: execute(device={device!r}): {error}") from None
        if wanted.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"{name}: execute(device={device!r}), but CUDA is not available")
        if wanted.type == "cuda" and wanted.index is None:
            wanted = torch.device("cuda", torch.cuda.current_device())
    if tensors:
        if not all(t.is_cuda for t in tensors):
            if wanted is not None and wanted.type == "cuda":
                raise InputError(f"{name}: execute(device={device!r}), but inputs are not on "
                                 "a CUDA device")
            return None
        on = tensors[0].device
        if wanted is not None and wanted != on:
            raise InputError(f"{name}: execute(device={device!r}), but the inputs are on {on}")
        return on
    if options.is_enabled("interpret"):
        return None
    if wanted is not None:
        return wanted if wanted.type == "cuda" else None
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


class _KernelPlan:
    """Everything one input signature needs at launch, computed once: the cached path only
    allocates outputs, patches pointers and scalars into `values`, packs and launches."""

    # Tensor maps encoded per plan, by input and pointer (the most recent kept).
    TENSOR_MAP_CACHE = 16

    def __init__(self, fk, device, grid, block, values, ptr_slots, scalar_slots, out_specs,
                 run_info, poison: bool, tmap_slots=(), workspaces=(), index_checks=None,
                 tile_slots=(), launch_scratch=()):
        import torch

        from .launch import ParamLayout
        self.fk = fk
        self.loaded = fk.loaded(device.index or 0)
        self.layout = ParamLayout(fk.param_kinds)
        self.loaded.check_layout(self.layout)
        self.device = device
        self.grid, self.block = grid, block
        self.values = values
        self.ptr_slots = ptr_slots           # (param position, "input"|"output", k)
        self.scalar_slots = tuple(scalar_slots)     # (param position, input k)
        # Split by role and bound once: the cached call is the path whose Python is counted.
        self._input_ptrs = tuple((pos, k) for pos, role, k in ptr_slots if role == "input")
        self._output_ptrs = tuple((pos, k) for pos, role, k in ptr_slots if role == "output")
        self._empty = torch.empty_strided
        self._launch = self.loaded.launch
        # (param position, kir.RowBoxMap): a tensor map embeds the input's address, so it is
        # encoded for each new pointer (a host call of a few microseconds), then reused.
        self.tmap_slots = tuple(tmap_slots)
        # (param position, kir.TileBoxMap), split by role: an output's map is encoded after
        # the output is allocated (its pointer is new at each call unless the caching
        # allocator hands the same block back, when the cached map is reused).
        self._input_tiles = tuple((pos, m) for pos, m in tile_slots if m.role == "input")
        self._output_tiles = tuple((pos, m) for pos, m in tile_slots if m.role == "output")
        self._tmaps: dict = {}
        self.out_specs = out_specs           # (sizes, strides, torch dtype)
        self.run_info = run_info
        self.poison = poison
        self.smem = fk.launch.shared_mem_bytes
        self.zeroed = fk.launch.zeroed_outputs
        self.cooperative = fk.launch.cooperative
        self.cluster = fk.launch.cluster
        # Global scratch of the kernel for this launch shape: owned by the plan, released with it.
        self.workspaces = tuple(workspaces)
        # (param position, _workspace_spec) of the scratch a launch holds while it runs (grid
        # reductions' data and semaphores, split-K's partials, chained scans, intermediates):
        # the set in `workspaces` serves the stream the plan was made on, and each other stream
        # gets a set of its own at its first call, allocated (and zeroed) on it, so launches
        # running at once on two streams never share one.
        self.launch_scratch = tuple(launch_scratch)
        self._home_stream = (_stream_handle(device.index or 0) if self.launch_scratch
                             else None)
        self._scratch_by_stream: dict = {}    # stream handle -> ([(position, pointer)], buffers)
        # The record of an index found out of range by a gather, read back without waiting
        # for the kernel (runtime/index_check.py).
        self.index_checks = index_checks
        # Nothing to do at a call but allocate, patch pointers and make a plain launch: the
        # guarded call (run_if_aligned) launches through a launcher that packs in place.
        self.lean = not (poison or self.zeroed or self.scalar_slots or self.tmap_slots
                         or tile_slots or index_checks is not None or self.cooperative
                         or self.cluster is not None or self.launch_scratch)
        self._launch_values = (self.loaded.launcher(grid, block, self.layout, self.smem)
                               if self.lean else None)
        # (options, the executor's guarded call of this plan under them), once one is made.
        self.guarded = None

    def run(self, inputs, into=None):
        """Launch on `inputs`; the outputs are new tensors, or where `into` (one entry per
        output) has a tensor, that tensor (of the output's spec: a segmented plan's buffer
        for an intermediate, reused from call to call)."""
        dev, empty = self.device, self._empty
        if into is None:
            outs = [empty(sz, st, dtype=dt, device=dev) for sz, st, dt in self.out_specs]
        else:
            outs = [t if t is not None else empty(sz, st, dtype=dt, device=dev)
                    for t, (sz, st, dt) in zip(into, self.out_specs)]
        if self.poison:
            for o in outs:
                o.fill_(float("nan") if o.dtype.is_floating_point else -1)
        for k in self.zeroed:
            outs[k].zero_()         # a scatter's sums start from zero (kir/launch.py)
        vals = self.values.copy()   # each call its own: threads may share the plan
        if self.launch_scratch:
            self._scratch_for_stream(vals)
        for pos, k in self._input_ptrs:
            vals[pos] = inputs[k].data_ptr()
        for pos, k in self._output_ptrs:
            vals[pos] = outs[k].data_ptr()
        if self._launch_values is not None:
            # (lean: nothing below applies) the launcher packs in place, as the guarded call's
            # run_if_aligned: a plan of segments runs its kernels through here at every call.
            self._launch_values(vals)
            return outs
        for pos, k in self.scalar_slots:
            vals[pos] = inputs[k]
        for pos, row_map in self.tmap_slots:
            vals[pos] = self._tensor_map(inputs[row_map.input], row_map)
        for pos, tile_map in self._input_tiles:
            vals[pos] = self._tensor_map(inputs[tile_map.index], tile_map)
        for pos, tile_map in self._output_tiles:
            vals[pos] = self._tensor_map(outs[tile_map.index], tile_map)
        checks = self.index_checks
        if checks is not None:
            checks.settle()         # an earlier launch's failure is raised before this one
        self._launch(self.grid, self.block, self.layout.pack(vals), shared_mem=self.smem,
                     cooperative=self.cooperative, cluster=self.cluster)
        if checks is not None:
            checks.after_launch()
        return outs

    def run_if_aligned(self, inputs, residues):
        """run(inputs), or None where the pointer of a tensor input is not at the residue mod
        16 that the plan was made for (`residues[k]`, None for a scalar: its vector widths and
        tensor maps depend on it): the executor's guarded call, whose guard checked every
        other part of the signature (call_guard.py). A `lean` plan checks only the inputs it
        reads by pointer, as it reads them, and launches through its launcher."""
        if self._launch_values is None:
            for x, residue in zip(inputs, residues):
                if residue is not None and x.data_ptr() & 15 != residue:
                    return None
            return self.run(inputs)
        vals = self.values.copy()   # each call its own: threads may share the plan
        for pos, k in self._input_ptrs:
            ptr = inputs[k].data_ptr()
            if ptr & 15 != residues[k]:
                return None
            vals[pos] = ptr
        dev, empty = self.device, self._empty
        outs = [empty(sz, st, dtype=dt, device=dev) for sz, st, dt in self.out_specs]
        for pos, k in self._output_ptrs:
            vals[pos] = outs[k].data_ptr()
        self._launch_values(vals)
        return outs

    def _scratch_for_stream(self, vals) -> None:
        """Point `vals` at the launch scratch of the current stream (launch_scratch)."""
        stream = _stream_handle(self.device.index or 0)
        if stream == self._home_stream:
            return
        entry = self._scratch_by_stream.get(stream)
        if entry is None:
            buffers = tuple(_allocate_workspace(spec, self.device)
                            for _, spec in self.launch_scratch)
            entry = ([(pos, b.data_ptr()) for (pos, _), b in zip(self.launch_scratch, buffers)],
                     buffers)
            self._scratch_by_stream[stream] = entry
        for pos, ptr in entry[0]:
            vals[pos] = ptr

    def _tensor_map(self, x, tensor_map) -> bytes:
        # The plan fixes the tensor's shape, strides and alignment: only the pointer varies.
        # Keyed by the map itself (its role and index, and its box: one tensor may be read
        # through two maps) and the pointer.
        key = (tensor_map, x.data_ptr())
        tmap = self._tmaps.pop(key, None)
        if tmap is None:
            from ..kir.nodes import TileBoxMap
            from .tensor_map import encode_row_box, encode_tile_box
            encode = encode_tile_box if isinstance(tensor_map, TileBoxMap) else encode_row_box
            tmap = encode(x, tensor_map)
            if len(self._tmaps) >= self.TENSOR_MAP_CACHE:
                # (another thread may have dropped that entry since: no KeyError then)
                self._tmaps.pop(next(iter(self._tmaps)), None)
        self._tmaps[key] = tmap          # most recent last
        return tmap


class _ReferencePlan:
    def __init__(self, fusion, run_info):
        self.fusion = fusion
        self.run_info = run_info

    def run(self, inputs):
        bindings = check_inputs(self.fusion, inputs)
        return evaluate(self.fusion, list(inputs), extent_bindings=bindings, all_outputs=True)


class _DiskDecisions:
    """The segmenter's `decisions` for a fusion and the schedulers excluded (name -> why; their
    names key it): the disk cache (kernel_cache.load_segmentation), which the segmenter asks
    first (a one-kernel fusion's decision is its scheduler)."""

    def __init__(self, fusion, exclude: dict | None):
        self.fusion = fusion
        self.exclude = exclude
        self.key = None
        self.text = None        # the fusion's canonical text, once the key is made

    def recorded(self):
        from ..ir.fingerprint import fusion_text
        from ..schedule.schedulers import registry
        from ..schedule.segmenter import SegmentationDecision
        from . import kernel_cache
        if not kernel_cache.disk_cache_enabled():
            return None
        self.text = fusion_text(self.fusion)
        self.key = kernel_cache.segmentation_key({
            "fusion": self.text, "exclude": sorted(self.exclude or ()),
            "schedulers": [s.NAME for s in registry.SCHEDULERS]})
        return SegmentationDecision.from_json(kernel_cache.load_segmentation(self.key))

    def record(self, decision) -> None:
        from . import kernel_cache
        if self.key is not None:
            kernel_cache.store_segmentation(self.key, decision.to_json())


def _disk_decisions(fusion, target, exclude: dict | None = None) -> _DiskDecisions | None:
    """Where the segmenter keeps its decision for a plan on `target`: the disk cache, except for
    the interpreter, whose kernels are not on disk either (_kernel_for)."""
    return None if target.interpret else _DiskDecisions(fusion, exclude)


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where a plan's kernels run: the device properties heuristics read, the torch device of
    the outputs, and whether the kernel-IR interpreter runs them (CPU tensors)."""

    props: object
    device: object
    interpret: bool = False


class _EmptyPlan:
    """Every output has no element: nothing to launch (a kernel would index empty inputs,
    whose data pointers may be null), only outputs of the right shape to allocate."""

    def __init__(self, fusion, out_sizes, target, run_info):
        import torch

        from ..ir.dtype import to_torch
        self.specs = [(tuple(sz), tuple(output_strides(o, sz)), to_torch(o.dtype))
                      for o, sz in zip(fusion.outputs, out_sizes)]
        self.device = target.device
        self.run_info = run_info
        self._torch = torch

    def run(self, inputs):
        return [self._torch.empty_strided(sz, st, dtype=dt, device=self.device)
                for sz, st, dt in self.specs]


class _InterpretPlan:
    """The generated kernel run by the kernel-IR interpreter on CPU tensors."""

    def __init__(self, fusion, fk, run_info):
        self.fusion = fusion
        self.fk = fk
        self.run_info = run_info

    def run(self, inputs):
        from .interpreter import Interpreter
        bindings = check_inputs(self.fusion, inputs)
        return Interpreter(self.fk.kernel, self.fk.bind(bindings)).run(list(inputs))


def _stream_handle(device_index: int) -> int:
    """PyTorch's current stream on the device, as launches see it (launch.py)."""
    from .launch import current_stream_handle
    return current_stream_handle(device_index)


def _workspace_spec(fk, w, inputs, grid, block) -> tuple:
    """(kind, dtype name, elements) of a kernel's global scratch `w` for one launch shape."""
    kind, dtype, _ = fk.launch.workspaces[w]
    return kind, dtype, fk.launch.workspace_elements(w, inputs, grid, block)


# The plan's own scratch, read between calls (index_check.py); every other kind a launch holds
# only while it runs, and two launches at once (on two streams) must not share it.
_PLAN_SCRATCH = frozenset({"index_error", "index_report"})


def _allocate_workspace(spec: tuple, device):
    """A kernel's global scratch of `spec` (_workspace_spec).

    Grid-reduction data: one slot per thread and grouped value of every block. Semaphores:
    one counter per block, zeroed here once; kernels leave them at zero when they finish;
    split-K's counters (one per warp group of a matmul tile) too.
    A chained scan's totals and prefixes: two per row of threads of every block; their flags
    one, zeroed here once (a kernel tags the flags it sets with its launch's generation).
    """
    import torch

    from ..ir.dtype import DataType, to_torch
    kind, dtype, n = spec
    if kind in ("semaphore", "split_k_counters"):
        return torch.zeros(n, dtype=torch.int32, device=device)
    if kind == "scan_flag":
        return torch.zeros(n, dtype=torch.int64, device=device)
    if kind == "index_error":       # zero while no index check failed (index_check.py)
        return torch.zeros(n, dtype=torch.int64, device=device)
    if kind == "index_report":      # the record's copy the host reads (index_check.py)
        return torch.zeros(n, dtype=torch.int64, pin_memory=True)
    return torch.empty(n, dtype=to_torch(DataType[dtype]), device=device)


def _guarded_call(executor, check, options, plan, residues):
    """inputs -> the outputs of `plan` run on them, where `check` (call_guard.tensor_guard)
    passes them and the options in force are `options` (the same object: no override active);
    else None, and the caller takes the look-up."""
    current = opts.current
    live, settle_all = index_check.LIVE, index_check.settle_all
    run = plan.run_if_aligned
    info = plan.run_info

    def call(inputs):
        if type(inputs) is not list and type(inputs) is not tuple:
            return None
        try:
            if not check(*inputs):
                return None
        except TypeError:           # another number of inputs, or not tensors
            return None
        if current() is not options:
            return None
        if live:
            settle_all()        # an index error of an earlier call, raised at the next
        outputs = run(inputs, residues)
        if outputs is not None:
            executor.last_run = info
        return outputs
    return call


def _inputs_check(check, count: int, positions: tuple, scalars: tuple):
    """inputs -> whether they are a list or tuple of `count`, with scalars of the types in
    `scalars` ((position, type)) and at `positions` tensors that `check` passes."""
    every = len(positions) == count

    def passes(inputs) -> bool:
        if type(inputs) is not list and type(inputs) is not tuple or len(inputs) != count:
            return False
        for k, kind in scalars:
            if type(inputs[k]) is not kind:
                return False
        try:
            return bool(check(*inputs) if every else check(*[inputs[k] for k in positions]))
        except TypeError:           # not tensors where the plan's were
            return False
    return passes


def _guarded_plan_call(executor, check, options, plan, residues, positions, scalars):
    """_guarded_call for the other plans of kernels: one kernel with in-place outputs, a plan
    of segments, a rewrite's plan. They do not check their inputs' alignment as they launch,
    so the call does (the key holds each tensor's data_ptr() % 16); it runs the plan and
    writes the in-place outputs, as the look-up's `_run` does."""
    current = opts.current
    live, settle_all = index_check.LIVE, index_check.settle_all
    fusion = executor.fusion
    aliased = bool(fusion.output_aliases)
    aligned = tuple((k, r) for k, r in enumerate(residues) if r is not None)
    passes = _inputs_check(check, len(residues), positions, scalars)

    def call(inputs):
        if not passes(inputs):
            return None
        for k, r in aligned:
            if inputs[k].data_ptr() & 15 != r:
                return None
        if current() is not options:
            return None
        if live:
            settle_all()        # an index error of an earlier call, raised at the next
        outputs = plan.run(inputs)
        executor.last_run = plan.run_info
        return write_aliased_outputs(fusion, inputs, outputs) if aliased else outputs
    return call


def _checked_already(*inputs) -> bool:
    """The check of a _guarded_call whose caller checked the inputs itself."""
    return True


def _guarded_mixed_call(executor, check, options, plan, residues, positions, scalars):
    """_guarded_call for inputs that mix tensors (at `positions`) and scalars ((position,
    type) in `scalars`: the key holds a scalar's type, not its value, which the plan passes
    to the kernel at each call)."""
    tensors_only = _guarded_call(executor, _checked_already, options, plan, residues)
    passes = _inputs_check(check, len(residues), positions, scalars)

    def call(inputs):
        return tensors_only(inputs) if passes(inputs) else None
    return call


class FusionExecutorCache:
    # Bounds of the in-memory caches, least recently used dropped first: plans by input
    # signature (each holds its outputs' specs and workspaces), and compiled kernels by
    # heuristic (each holds a cubin, loaded on the device while a plan uses it).
    MAX_PLANS = 64
    MAX_KERNELS = 32

    def __init__(self, fusion, name: str = "fusion", segmented=None):
        # A whole fusion's max / sum-of-exp pairs become one-pass logsumexp reductions
        # (schedule/logsumexp.py), on a clone: the caller's fusion is the reference's.
        self.fusion = fuse_logsumexp(fusion) if segmented is None else fusion
        self.name = name
        self.last_run: RunInfo | None = None
        self._plans: OrderedDict = OrderedDict()
        self._kernels: OrderedDict = OrderedDict()
        # schedule/segmenter.SegmentedFusion, once per fusion (given for a segment's own
        # executor: its sub-fusion is scheduled whole); with several segments, one executor
        # per kernel segment (runtime/plan.py).
        self._segmented = segmented
        self._segment_executors: list = []
        # The fusion's canonical text, where the segmentation's disk look-up made it (the
        # kernel's disk key reuses it).
        self._fusion_text: str | None = None
        self._shared_roles: bool | None = None   # roles.has_shared_roles, asked once
        # The names of schedulers whose heuristic refused a call's shapes -> [the fusion
        # segmented without them, its segment executors] (LRU, MAX_PLANS).
        self._resegmented: OrderedDict = OrderedDict()
        self._kernel_count = 0
        # runtime/empty_dims.EmptyDims -> the executor of the fusion specialized to them.
        self._specialized: dict = {}
        # few_row_matmuls.rewritable's positions -> the executor of the fusion with those
        # matmuls made reductions.
        self._as_reductions: dict = {}
        # The schedulers whose heuristic refused a call (frozenset of names) -> the executor
        # of the fusion with its normalizations split (schedule/split_normalizations.py), or
        # None where the fusion's own plan without them is kept.
        self._split: dict = {}
        # The guarded call of the last plan found: inputs -> outputs, or None where they do
        # not match (_guarded_call). None where no such call is made.
        self.guarded_call = None
        self._guarded_plan = self._guarded_options = None

    # Public ------------------------------------------------------------------------------------
    def run(self, inputs, options=None, device=None):
        """`device`: where a fusion without tensor inputs runs and puts its outputs (a CUDA
        device index, "cuda:1" or a torch.device; default: the current CUDA device); with
        tensor inputs it must be theirs."""
        call = self.guarded_call
        if options is not None:
            with opts.override(options):
                # (equal per-call options are one Options object: the guarded call's test)
                outputs = call(inputs) if call is not None and device is None else None
                return outputs if outputs is not None else self._run(inputs, opts.current(),
                                                                     device)
        if call is not None and device is None:
            outputs = call(inputs)
            if outputs is not None:
                return outputs
        return self._run(inputs, opts.current(), device)

    def plan_for(self, inputs, device=None):
        """The plan `run` runs for these inputs under the current options, made if needed: for
        a caller that runs it again itself while the signature cannot change (a segmented
        plan binds its kernel segments' plans at its first run). Its `run(inputs)` returns
        every output of the fusion, in-place ones included (no write into their inputs)."""
        return self._plan_of(inputs, opts.current(), device)

    def _plan_of(self, inputs, options, device=None):
        if not isinstance(inputs, (list, tuple)):      # before _key iterates them
            raise not_a_list(self.fusion, inputs)
        if index_check.LIVE:
            index_check.settle_all()   # an index error of an earlier call, raised at the next
        key = self._key(inputs, options, device)
        plans = self._plans
        plan = plans.get(key)
        if plan is None:
            plan = self._make_plan(inputs, options, device)
            if key is not None:
                plans[key] = plan
                if len(plans) > self.MAX_PLANS:
                    plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        if key is not None and device is None and (
                plan is not self._guarded_plan or options is not self._guarded_options):
            self._guard_next_calls(inputs, options, plan)
        return plan

    def _guard_next_calls(self, inputs, options, plan) -> None:
        """Make `guarded_call`: the next calls with this signature (and these options) run
        `plan` after one C++ check of their tensors (call_guard.py) and a type check of their
        scalars, instead of the key's Python reads and the dict look-up. For a plan of kernels:
        one kernel (_guarded_call, or _guarded_plan_call where it has in-place outputs), a plan
        of segments, a rewrite's plan; not for the reference evaluator or the plans of empty
        dims (the look-up serves them)."""
        from .plan import SegmentedPlan
        self._guarded_plan, self._guarded_options = plan, options
        self.guarded_call = None
        tensor = _torch_tensor or _bind_torch_tensor()
        one_kernel = isinstance(plan, _KernelPlan) and not self.fusion.output_aliases
        if not isinstance(plan, (_KernelPlan, SegmentedPlan, RewrittenPlan)):
            return
        made = getattr(plan, "guarded", None)
        if made is not None and made[0] is options:
            # Made for this plan before: calls alternating between signatures build no guard.
            self.guarded_call = made[1]
            return
        positions = tuple(k for k, x in enumerate(inputs) if isinstance(x, tensor))
        if any(type(inputs[k]) is not tensor for k in positions):
            return      # a subclass (nn.Parameter): torch's guard refuses it anyway
        from .call_guard import tensor_guard
        check = tensor_guard([inputs[k] for k in positions])
        if check is None:
            return
        residues = tuple(x.data_ptr() & 15 if isinstance(x, tensor) else None for x in inputs)
        scalars = tuple((k, type(x)) for k, x in enumerate(inputs) if k not in positions)
        if not one_kernel:
            self.guarded_call = _guarded_plan_call(self, check, options, plan, residues,
                                                   positions, scalars)
        elif len(positions) == len(inputs):
            self.guarded_call = _guarded_call(self, check, options, plan, residues)
        else:
            self.guarded_call = _guarded_mixed_call(self, check, options, plan, residues,
                                                    positions, scalars)
        plan.guarded = (options, self.guarded_call)

    def _run(self, inputs, options, device=None):
        plan = self._plan_of(inputs, options, device)
        outputs = plan.run(inputs)
        self.last_run = plan.run_info     # a segmented plan's is complete after its first run
        if self.fusion.output_aliases:      # in-place outputs: plans compute every output
            return write_aliased_outputs(self.fusion, inputs, outputs)
        return outputs

    # Keys --------------------------------------------------------------------------------------
    def _key(self, inputs, options, device=None):
        tensor = _torch_tensor or _bind_torch_tensor()
        parts = [options.enable, options.disable, options.heuristic, options.device, device]
        append = parts.append
        try:
            for x in inputs:
                if isinstance(x, tensor):
                    append((x.dtype, x.shape, x.stride(), x.device, x.data_ptr() % 16))
                else:
                    append(type(x))
        except Exception:
            return None
        return tuple(parts)

    # Plans -------------------------------------------------------------------------------------
    def _make_plan(self, inputs, options, device=None):
        import torch
        from .device import INTERPRET_DEVICE, get_device_properties, supported_arch
        bindings = check_inputs(self.fusion, inputs)
        opts.dump("fusion_ir", self.name, lambda: repr(self.fusion))
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        cuda_device = _requested_device(self.name, device, tensors, options)
        if options.is_enabled("interpret"):
            on = sorted({str(t.device) for t in tensors if t.device.type != "cpu"})
            if on:
                raise InputError(f"{self.name}: `interpret` runs the generated kernels on CPU "
                                 f"tensors, but inputs are on {', '.join(on)}; pass CPU tensors "
                                 "or drop `interpret` to run on the GPU")
            target = _Target(get_device_properties(options.device or INTERPRET_DEVICE),
                             torch.device("cpu"), interpret=True)
        elif cuda_device is None:
            return _ReferencePlan(self.fusion, RunInfo(
                "reference", (), 0, "inputs are not on a CUDA device (PYFUSER_ENABLE=interpret "
                "runs the generated kernels on CPU tensors)"))
        else:
            device = cuda_device
            props = get_device_properties(device.index or 0)
            if not supported_arch(props):
                return self._fallback(f"no kernels for {props.name} (sm_{props.major}"
                                      f"{props.minor}): pyfuser generates kernels for sm_90 "
                                      "(H100, H200) only")
            target = _Target(props, device)
        out_sizes = output_sizes(self.fusion, bindings)
        no_kernels, empty = empty_call(self.fusion, bindings, out_sizes)
        if no_kernels == INDEX_INTO_NOTHING:
            return _ReferencePlan(self.fusion, RunInfo("reference", (), 0, no_kernels))
        if no_kernels:
            return _EmptyPlan(self.fusion, out_sizes, target, RunInfo(
                "kernels", (), 0, no_kernels,
                backend="interpreter" if target.interpret else "cuda"))
        if empty:
            # Empty outputs beside others, or sums of no elements reaching an output: kernels of
            # the fusion specialized to what has elements (runtime/empty_dims.py).
            spec = self._specialized.get(empty)
            if spec is None:
                spec = self._specialized[empty] = FusionExecutorCache(
                    specialize(self.fusion, empty), name=f"{self.name}_nonempty")
            return SpecializedPlan(self.fusion, empty, spec, out_sizes, target.device)
        rewrite = few_row_matmuls.rewritable(self.fusion, bindings, inputs, options)
        if rewrite:
            # Matmuls of few rows as reductions: the fusion rewritten, planned as any other.
            sub = self._as_reductions.get(rewrite)
            if sub is None:
                sub = self._as_reductions[rewrite] = FusionExecutorCache(
                    few_row_matmuls.as_reductions(self.fusion, rewrite),
                    name=f"{self.name}_as_reduction")
            return RewrittenPlan(sub, few_row_matmuls.describe(self.fusion, rewrite),
                                 target.device)
        if self._segmented is None:
            decisions = _disk_decisions(self.fusion, target)
            self._segmented = segment(self.fusion, None, decisions)
            if decisions is not None:
                self._fusion_text = decisions.text
        segmented = self._segmented
        split = self._split_plan({}, segmented, target)
        if split is not None:
            return split
        opts.dump("segments", self.name, lambda: str(segmented))
        if len(segmented.segments) > 1 or segmented.segments[0].kind == "library":
            if options.heuristic is not None:
                from ..options import OptionError
                kinds = ", ".join(s.name for s in segmented.segments)
                raise OptionError(
                    f"{self.name}: a forced heuristic ({type(options.heuristic).__name__}) "
                    f"applies to a fusion that is one kernel; this one is a plan of "
                    f"{len(segmented.segments)} segments ({kinds}): force heuristics per "
                    "segment by splitting the fusion, or drop the option")
            from .plan import SegmentedPlan, segment_executors
            if not self._segment_executors:
                self._segment_executors = segment_executors(segmented, self.name)
            return SegmentedPlan(self.fusion, segmented, self._segment_executors, bindings,
                                 self.name, device=target.device)
        choice = segmented.segments[0].choice
        if choice is None:
            return self._fallback(segmented.why)
        return self._guarded_kernel_plan(inputs, bindings, choice, target, options)

    def _guarded_kernel_plan(self, inputs, bindings, choice, target, options, exclude=None):
        """The kernel plan; where the heuristic refuses these inputs, the plan without that
        scheduler (_plan_without); the reference plan with a FallbackWarning when building the
        kernel fails (a pyfuser bug, reported as one). `exclude`: schedulers refused already."""
        if options.heuristic is not None:       # the caller forced a schedule: its errors are theirs
            from ..kir.launch import LaunchLimitError
            from ..options import OptionError
            try:
                return self._kernel_plan(inputs, bindings, choice, target)
            except LaunchLimitError as e:
                raise OptionError(f"{self.name}: the forced heuristic "
                                  f"({type(options.heuristic).__name__}) launches {e}") from None
        try:
            return self._kernel_plan(inputs, bindings, choice, target)
        except SchedulerError as e:             # the heuristic refuses these inputs
            refused = {**(exclude or {}), choice.scheduler.NAME: str(e)}
            return self._plan_without(refused, inputs, bindings, target, options)
        except InputError:
            raise
        except Exception as e:                  # a pyfuser bug: never the user's problem
            if options.is_enabled("reference_fallback") is False:
                raise
            what = f"{type(e).__name__}: {e}"
            return self._fallback(f"internal error in the {choice.scheduler.NAME} scheduler's "
                                  f"kernel ({what})", internal_error=what,
                                  tb=traceback.format_exc())

    def _plan_without(self, exclude: dict, inputs, bindings, target, options):
        """The plan of the fusion segmented again without the schedulers in `exclude` (name ->
        why), whose heuristic refused the shapes of this call (the outer persistent one where
        the column tiles would leave most SMs idle): another scheduler, or a plan of several
        kernels; the reference only where nothing else takes it. Plans are cached per call
        shape, so other shapes still get the refused scheduler."""
        from .plan import SegmentedPlan, segment_executors
        key = frozenset(exclude)
        entry = self._resegmented.get(key)
        if entry is None:
            # The segmentation reads no shapes: one per set of refused schedulers (its reasons
            # are those of the first call refused).
            entry = self._resegmented[key] = [
                segment(self.fusion, exclude, _disk_decisions(self.fusion, target, exclude)), []]
            if len(self._resegmented) > self.MAX_PLANS:
                self._resegmented.popitem(last=False)
        else:
            self._resegmented.move_to_end(key)
        segmented, executors = entry
        split = self._split_plan(exclude, segmented, target)
        if split is not None:
            return split
        opts.dump("segments", self.name, lambda: str(segmented))
        if len(segmented.segments) > 1 or segmented.segments[0].kind == "library":
            if not executors:
                executors.extend(segment_executors(segmented, self.name))
            return SegmentedPlan(self.fusion, segmented, executors, bindings, self.name,
                                 device=target.device)
        choice = segmented.segments[0].choice
        if choice is None:
            refused = "; ".join(f"{n}: {w}" for n, w in exclude.items())
            return self._fallback(f"{refused}; {segmented.why}")
        return self._guarded_kernel_plan(inputs, bindings, choice, target, options, exclude)

    def _split_plan(self, exclude: dict, segmented, target):
        """The plan of the fusion with its normalizations split (split_normalizations), where
        `segmented`, its plan without the schedulers in `exclude` (whose heuristics refused
        the call; {}: the fusion's own plan), has more segments or stores more bytes between
        them; None otherwise. Decided once per set of refused schedulers."""
        key = frozenset(exclude)
        if key not in self._split:
            asked = []

            def decisions_of(split):
                asked.append(_disk_decisions(split, target, exclude or None))
                return asked[-1]
            found = split_normalizations.better_split(self.fusion, segmented, exclude or None,
                                                      decisions_of)
            sub = None
            if found is not None:
                sub = FusionExecutorCache(found[0], name=f"{self.name}_split")
                if not exclude:
                    # The split's segmentation, just made for the comparison, is the one its
                    # executor makes first (no scheduler excluded): not made again (a new
                    # process's first call segmented the split twice).
                    sub._segmented = found[1]
                    if asked and asked[-1] is not None:
                        sub._fusion_text = asked[-1].text
            self._split[key] = sub
        sub = self._split[key]
        if sub is None:
            return None
        return RewrittenPlan(sub, split_normalizations.DESCRIPTION, target.device)

    def _fallback(self, reason: str, internal_error: str = "", tb: str = ""):
        """The reference plan, with a FallbackWarning (or an error where fallbacks are off)."""
        if opts.current().is_enabled("reference_fallback") is False:
            raise RuntimeError(f"{self.name}: {reason}; the reference fallback is disabled "
                               "(PYFUSER_DISABLE=reference_fallback)")
        warnings.warn(f"{self.name}: {reason}; running the reference evaluator",
                      FallbackWarning, stacklevel=5)
        return _ReferencePlan(self.fusion, RunInfo("reference", (), 0, reason,
                                                   internal_error=internal_error, traceback=tb))

    def _kernel_plan(self, inputs, bindings, choice, target):
        import torch

        if self._shared_roles is None:
            self._shared_roles = has_shared_roles(self.fusion)
        if self._shared_roles:
            clone, mapping = scheduling_clone(self.fusion)
            text = None
            clone_bindings = {mapping[id(k)]: v for k, v in bindings.items() if id(k) in mapping}
        else:
            # Separating the roles would copy nothing: the fusion stands for its scheduling
            # clone (the same inputs and canonical text, made for the segmentation's disk key)
            # in the heuristic and the cache keys; _kernel_for clones it only to build a kernel
            # (a disk hit copies nothing).
            clone, mapping, text = self.fusion, None, self._fusion_text
            clone_bindings = bindings
        facts = tuple(
            InputFacts(tuple(x.shape), tuple(x.stride()), _alignment(x.data_ptr()))
            if isinstance(x, torch.Tensor) else None for x in inputs)
        options = opts.current()
        info = RuntimeInfo(clone_bindings, facts_per_input(clone, facts), target.props, options)
        sched = choice.scheduler
        forced = options.heuristic
        if forced is not None:
            expected = type(sched.compute_heuristics(clone, info))
            if not isinstance(forced, expected):
                raise TypeError(f"{self.name}: forced heuristic {type(forced).__name__} does not "
                                f"fit the {sched.NAME} scheduler, which takes {expected.__name__}")
            params = forced
        else:
            params = sched.compute_heuristics(clone, info)
        out_sizes = output_sizes(self.fusion, bindings)
        index_type = index_type_for([x for x in inputs if isinstance(x, torch.Tensor)])
        for sz in out_sizes:
            n = 1
            for s in sz:
                n *= max(s, 1)
            if n >= 2 ** 31 - 1:
                index_type = "int64"
        cache_facts = (signature_class(inputs), target.props)
        fk = self._kernel_for(sched, params, index_type, clone, mapping,
                              compile_now=not target.interpret, cache_facts=cache_facts,
                              fusion_text=text)
        self._check_vector_widths(fk, inputs)
        self._check_extent_multiples(fk, inputs)
        self._check_bulk_rows(fk, inputs)
        self._check_tile_maps(fk, inputs)
        if target.interpret:
            return _InterpretPlan(self.fusion, fk, RunInfo(
                "kernels", (fk.scheduler,), 1, choice.reason, (fk.params,), (fk.name,),
                clusters=(fk.launch.cluster,), backend="interpreter"))
        device = target.device
        fk = self._fit_resident_grid(fk, inputs, sched, index_type, device, cache_facts)
        return self._plan_for(fk, inputs, bindings, out_sizes, device, choice)

    def _kernel_for(self, sched, params, index_type, clone, mapping, compile_now=True,
                    cache_facts=None, fusion_text=None):
        """The kernel for this heuristic: from memory (an equal heuristic of another shape),
        from the disk cache (keyed before scheduling: a hit schedules, lowers and prints
        nothing), or built from `clone` (scheduled, lowered, printed, compiled) and stored.
        `cache_facts`, (signature class, device properties), completes the disk key; without
        it (or for the interpreter, which runs the kernel IR) the disk is not used."""
        options = opts.current()
        # Forced features that change kernels are part of the key: a call that turns one off
        # (shared_divisor_quotients, streaming_loads) gets its own kernel, not the one built
        # for the other setting (the plans of the two differ; their kernels did not).
        kkey = (sched.NAME, params, index_type, compile_now, opts.kernel_features(options))
        reuse = options.is_enabled("kernel_reuse") is not False
        fk = self._kernels.get(kkey) if reuse else None
        if fk is not None:
            self._kernels.move_to_end(kkey)
            return fk
        from . import kernel_cache
        from .fusion_kernel import build_kernel, from_cache_entry
        disk_key = None
        if compile_now and cache_facts is not None and kernel_cache.disk_cache_enabled():
            disk_key = kernel_cache.plan_key(
                plan_key_fields(clone, sched.NAME, params, index_type, options, *cache_facts,
                                text=fusion_text))
            # A dump of a build stage asks to see the kernel built: no disk look-up then.
            shown = any(options.dumps(stage) for stage in _BUILD_STAGES)
            entry = kernel_cache.load_plan(disk_key) if reuse and not shown else None
            if entry is not None and entry.scheduler == sched.NAME:
                fk = from_cache_entry(entry, params)
        if fk is None:
            if clone is self.fusion:        # scheduling changes it: the executor's own stays
                clone, mapping = self.fusion.clone()
            name = f"{self.name}_{sched.NAME}_{self._kernel_count}"
            self._kernel_count += 1
            fk = build_kernel(clone, sched, params, index_type, name, clone_of=mapping,
                              compile_now=compile_now)
            if disk_key is not None:
                fk.cache_key = disk_key
                kernel_cache.store_plan(disk_key, fk.module, fk.launch, sched.NAME, index_type)
        self._kernels[kkey] = fk
        while len(self._kernels) > self.MAX_KERNELS:
            self._kernels.popitem(last=False)
        return fk

    def _fit_resident_grid(self, fk, inputs, sched, index_type, device, cache_facts):
        """Fit a grid-synchronizing (cooperative) kernel's grid, or a persistent one's
        (launch.persistent), to the blocks that can be resident at once; other kernels pass
        through. A persistent grid past what fits leaves its last blocks to a second wave: a
        matmul asking 66 clusters of 2 CTAs where 64 fit on the H200 ran 8192^3 in 1690 us,
        with the grid fitted to 64 clusters (128 CTAs) in 1596
        (bench/results/2026-11-30/h200-matmul-clusters-session29.txt).

        The one step of planning that needs the compiled kernel: how many blocks fit is a
        property of the loaded cubin (the registers ptxas gave it, and how whole clusters fit
        the GPCs), which no heuristic can know before compiling. When the heuristic's grid is
        larger, the kernel is rescheduled with the grid that fits, and stored on disk under the
        first kernel's key too (with that grid): a later process loads the fitted kernel
        directly, and this step then only confirms that it fits."""
        fit = self._resident_blocks(fk, inputs, device)
        if fit is None:
            return fk
        # Blocks launched per blockIdx.x: the blocks of a cluster along y (norm backward).
        launched, _ = fk.launch.launch_dims(inputs)
        per_x = launched[1] * launched[2]
        grid = getattr(fk.params, "grid", None)
        if not grid or grid * per_x <= fit:
            return fk
        clone, mapping = scheduling_clone(self.fusion)
        params = dataclasses.replace(fk.params, grid=max(1, fit // per_x))
        fitted = self._kernel_for(sched, params, index_type, clone, mapping,
                                  cache_facts=cache_facts)
        if fk.cache_key is not None:
            from .kernel_cache import store_plan
            store_plan(fk.cache_key, fitted.module, fitted.launch, sched.NAME, index_type,
                       fitted_grid=params.grid)
        return fitted

    @staticmethod
    def _resident_blocks(fk, inputs, device):
        """For a grid-synchronizing (cooperative) or persistent kernel, the blocks that fit on
        the GPU at once (its real occupancy times the SMs; with clusters, the clusters that fit
        at once times their size, since a GPC takes whole clusters only); None for other
        kernels."""
        launch = fk.launch
        if not (launch.cooperative or launch.persistent):
            return None
        from .device import get_device_properties
        from .launch import cluster_occupancy, occupancy
        _, block = launch.launch_dims(inputs)
        smem = launch.shared_mem_bytes
        cluster = launch.cluster
        size = cluster[0] * cluster[1] * cluster[2] if cluster else 1
        if size > 1:
            return cluster_occupancy(fk.loaded(device.index or 0), block, smem, cluster) * size
        per_sm = occupancy(fk.loaded(device.index or 0), block[0] * block[1] * block[2], smem)
        return max(1, per_sm) * get_device_properties(device.index or 0).sm_count

    def _check_vector_widths(self, fk, inputs) -> None:
        """Vector reads of an input run along the dim innermost in the kernel's allocation of
        it (schedulers vectorize nothing else; a schedule may move dims of size 1 outward,
        base.orient_vector_inputs): that dim must have stride 1 and hold whole vectors, the
        pointer be aligned and the other strides be multiples of the width. Heuristics only
        choose widths that hold; a reused kernel or a forced heuristic is checked here, before
        any launch, instead of reading out of bounds or the wrong elements."""
        from ..schedule.schedulers.base import InputFacts, input_vector_problems
        for k, width, dim, ragged in fk.launch.vector_reads:
            x, v = inputs[k], self.fusion.inputs[k]
            facts = InputFacts(tuple(x.shape), tuple(x.stride()), _alignment(x.data_ptr()))
            bad = input_vector_problems(v, facts, width, dim, ragged=ragged)
            if bad:
                raise ValueError(
                    f"{self.name}: input {k} (T{v.name}) cannot be read with {width}-wide vectors "
                    f"as heuristic {fk.params!r} asks: " + "; ".join(bad))

    def _check_extent_multiples(self, fk, inputs) -> None:
        """Extents the schedule needs to be multiples of its vector width (rows of whole
        vectors: fusion.extent_multiples). An equal heuristic implies them; a forced one is
        checked here, before any launch."""
        from ..kir.launch import evaluate as launch_value
        for extent, m in fk.launch.extent_multiples:
            n = int(launch_value(extent, inputs))
            if n % m:
                raise ValueError(f"{self.name}: kernel {fk.name} (heuristic {fk.params!r}) needs "
                                 f"an extent of {n} to be a multiple of {m}: the lanes of a "
                                 "vector must lie in one row")

    def _check_bulk_rows(self, fk, inputs) -> None:
        """Inputs a kernel copies row by row with cp.async.bulk, or by boxes of whole rows
        through a tensor map, must keep the copy's rules (16-byte aligned rows, contiguous):
        checked before launch, since a reused kernel may meet other strides than the heuristic
        saw."""
        launch = fk.launch
        if not launch.bulk_inputs and not any(src[0] == "tmap" for src in launch.param_sources):
            return          # nothing to check: spare a new process importing the TMA rules
        from ..kir.nodes import RowBoxMap
        from ..schedule.tma_rules import check_bulk_rows
        from .tensor_map import row_box_problems
        for k in fk.launch.bulk_inputs:
            x = inputs[k]
            bad = check_bulk_rows(list(x.shape), list(x.stride()), _alignment(x.data_ptr()),
                                  x.element_size())
            if bad:
                raise ValueError(f"{self.name}: input {k} (T{self.fusion.inputs[k].name}) cannot "
                                 f"be copied row by row with TMA as heuristic {fk.params!r} "
                                 "asks: " + "; ".join(bad))
        for src in fk.launch.param_sources:
            if src[0] != "tmap":
                continue
            row_map = RowBoxMap(*src[1:])
            bad = row_box_problems(inputs[row_map.input], row_map)
            if bad:
                raise ValueError(f"{self.name}: input {row_map.input} "
                                 f"(T{self.fusion.inputs[row_map.input].name}) cannot be copied "
                                 f"with tensor-map boxes of whole rows as heuristic {fk.params!r} "
                                 "asks: " + "; ".join(bad))

    def _check_tile_maps(self, fk, inputs) -> None:
        """Inputs a kernel copies in 2D tiles through a tensor map (a kir.TileBoxMap: a matmul's
        operands) must keep the map's rules (schedule/tma_rules.check_tile_box: the inner dim
        contiguous, 16-byte aligned pointer and row stride, extents a map can address): checked
        before launch, since a reused kernel may meet other strides than the heuristic saw.
        Outputs are the executor's own allocations (checked in `_plan_for`)."""
        tiles = [src for src in fk.launch.param_sources
                 if src[0] == "tmap_tile" and src[1] == "input"]
        if not tiles:
            return          # spare a new process importing the TMA rules
        from ..kir.nodes import TileBoxMap
        from .tensor_map import tile_box_problems
        for src in tiles:
            tile_map = TileBoxMap(*src[1:])
            k = tile_map.index
            bad = tile_box_problems(inputs[k], tile_map)
            if bad:
                raise ValueError(
                    f"{self.name}: input {k} (T{self.fusion.inputs[k].name}, sizes "
                    f"{tuple(inputs[k].shape)}, strides {tuple(inputs[k].stride())}) cannot be "
                    f"copied in tiles of {tile_map.box_rows} x {tile_map.box_cols} through a "
                    f"tensor map as heuristic {fk.params!r} asks: " + "; ".join(bad))

    def _plan_for(self, fk, inputs, bindings, out_sizes, device, choice):
        """The launch of `fk` for this signature, from its launch description alone (the same
        for a kernel built here and one loaded from disk)."""
        from ..kir.launch import evaluate as launch_value
        launch = fk.launch
        grid, block = launch.launch_dims(inputs)
        if launch.cooperative:
            fit = self._resident_blocks(fk, inputs, device)
            blocks = grid[0] * grid[1] * grid[2]
            if blocks > fit:
                raise RuntimeError(
                    f"{self.name}: kernel {fk.name} synchronizes its grid of {blocks} blocks, but "
                    f"only {fit} blocks of {block[0] * block[1] * block[2]} threads fit on the "
                    "GPU at once")
        from ..ir.dtype import to_torch
        out_specs = [(tuple(sz), tuple(output_strides(o, sz)), to_torch(o.dtype))
                     for o, sz in zip(self.fusion.outputs, out_sizes)]
        values, ptr_slots, scalar_slots, tmap_slots, workspaces = [], [], [], [], []
        tile_slots, launch_scratch = [], []
        workspace_bytes, index_record, index_report = 0, None, None
        for pos, src in enumerate(launch.param_sources):
            tag = src[0]
            if tag in ("input", "output"):
                ptr_slots.append((pos, tag, src[1]))
                values.append(0)
            elif tag == "stride":
                _, role, k, d = src
                if role == "input":
                    values.append(int(inputs[k].stride(d)))
                else:
                    values.append(int(out_specs[k][1][d]))
            elif tag == "value":
                values.append(int(launch_value(src[1], inputs)))
            elif tag == "scalar":
                scalar_slots.append((pos, src[1]))
                values.append(0)
            elif tag == "workspace":
                spec = _workspace_spec(fk, src[1], inputs, grid, block)
                buf = _allocate_workspace(spec, device)
                workspaces.append(buf)
                kind = spec[0]
                if kind not in _PLAN_SCRATCH:
                    launch_scratch.append((pos, spec))
                if kind == "index_error":
                    index_record = buf
                if kind == "index_report":
                    index_report = buf
                values.append(buf.data_ptr())
                if kind == "intermediate":
                    workspace_bytes += 2 * buf.numel() * buf.element_size()
            elif tag == "tmap":
                from ..kir.nodes import RowBoxMap
                tmap_slots.append((pos, RowBoxMap(*src[1:])))
                values.append(bytes(128))
            elif tag == "tmap_tile":
                from ..kir.nodes import TileBoxMap
                tile_map = TileBoxMap(*src[1:])
                if tile_map.role == "output":
                    # The executor allocates outputs densely: a map over one always holds; a
                    # failure here is a lowering bug (a map over a dim that is not innermost).
                    from .tensor_map import ALLOCATION_ALIGN, tile_layout_problems
                    sizes, strides, dtype = out_specs[tile_map.index]
                    bad = tile_layout_problems(sizes, strides, ALLOCATION_ALIGN, dtype.itemsize,
                                               tile_map)
                    if bad:
                        raise RuntimeError(
                            f"{self.name}: kernel {fk.name} stores output {tile_map.index} "
                            f"through tensor map {tile_map}, which its allocation (sizes "
                            f"{out_specs[tile_map.index][0]}, strides "
                            f"{out_specs[tile_map.index][1]}) breaks: " + "; ".join(bad))
                elif tile_map.role != "input":
                    raise RuntimeError(f"unknown tensor-map role in parameter source {src}")
                tile_slots.append((pos, tile_map))
                values.append(bytes(128))
            else:
                raise RuntimeError(f"unknown parameter source {src}")
        info = RunInfo("kernels", (fk.scheduler,), 1, choice.reason, (fk.params,), (fk.name,),
                       workspace_bytes, (launch.cluster,), backend="cuda")
        checks = None
        if index_record is not None:
            from .index_check import DeferredIndexChecks
            # The plan's inputs have fixed sizes: the checked dims' sizes are known now.
            sizes = [int(launch_value(n, inputs)) for _, _, n in launch.index_checks]
            checks = DeferredIndexChecks(
                index_record, index_report, launch.index_checks, sizes, device,
                wait_each=bool(opts.current().is_enabled("sync_index_checks")))
        return _KernelPlan(fk, device, grid, block, values, ptr_slots, scalar_slots, out_specs,
                           info, poison=bool(opts.current().is_enabled("poison_outputs")),
                           tmap_slots=tmap_slots, workspaces=workspaces, index_checks=checks,
                           tile_slots=tile_slots, launch_scratch=launch_scratch)

    # Introspection -----------------------------------------------------------------------------
    def kernels(self) -> list:
        out = list(self._kernels.values())
        again = [ex for _, executors in self._resegmented.values() for ex in executors]
        for ex in [*self._segment_executors, *again, *self._specialized.values(),
                   *self._as_reductions.values(), *self._split.values()]:
            if ex is not None:
                out += ex.kernels()
        return out

"""A compiled kernel for a scheduled fusion, and what it needs at launch.

Everything decided at compile time lives here: the launch description lowering stated
(kir/launch.py: parameters and where each value comes from, grid, block, workspaces, shared
memory, cooperative, cluster, as expressions over the call's inputs), and the text of every
stage (fusion IR, scheduled IR, heuristics, kernel IR, CUDA, ptxas) so `explain`, dumps and
tests can show them. A kernel loaded from the disk cache (`from_cache_entry`) has the
launch description, the cubin and the CUDA text, but no fusion or kernel IR: the executor
launches from the description alone.
"""
from __future__ import annotations

import dataclasses

from .. import options as opts
from ..ir import scalar as S

ARCH = "sm_90a"


@dataclasses.dataclass(eq=False)
class FusionKernel:
    name: str
    scheduler: str
    params: object                 # the heuristic dataclass
    index_type: str
    fusion: object                 # the scheduled clone (None when loaded from disk)
    kernel: object                 # kir Kernel (None when loaded from disk)
    source: str
    launch: object = None          # kir.launch.LaunchDescription
    module: object = None          # CompiledModule (None until compiled)
    compile_source: str = ""       # "memory" | "disk" | "compiled"
    stages: dict = dataclasses.field(default_factory=dict)
    clone_of: dict = dataclasses.field(default_factory=dict)   # id(original Val) -> clone Val
    _loaded: dict = dataclasses.field(default_factory=dict)
    # The key of the kernel cache (runtime/kernel_cache.plan_key) this kernel was built or
    # loaded under, computed before scheduling; None when it is not stored on disk.
    cache_key: str | None = None

    def bind(self, bindings: dict) -> dict:
        """The original fusion's extent bindings as bindings of this kernel's clone."""
        return {self.clone_of[id(s)]: v for s, v in bindings.items() if id(s) in self.clone_of}

    @property
    def param_kinds(self) -> list[str]:
        return list(self.launch.param_kinds)

    def loaded(self, device_index: int):
        k = self._loaded.get(device_index)
        if k is None:
            from .launch import load
            k = self._loaded[device_index] = load(self.module, device_index)
        return k

    def launch_dims(self, bindings: dict) -> tuple[tuple, tuple]:
        """(grid, block) for the clone's extents bound in `bindings` (clone Scalar -> int)."""
        env = dict(bindings)
        grid = tuple(max(1, int(S.evaluate(g, env))) for g in self.kernel.launch.grid)
        block = tuple(max(1, int(S.evaluate(b, env))) for b in self.kernel.launch.block)
        return grid, block


def _refuse_self_merges(fusion, scheduler_name: str) -> None:
    """A schedule whose loops merge two IDs that iterate the same values cannot be indexed
    (IdGraph.self_merges): refused as the heuristic's, so the executor runs the reference
    with that reason instead of a kernel that writes some elements many times and others
    never (fuzz 20261204:2816)."""
    from ..ir.id_graph import IdGraph
    from ..schedule.schedulers.base import SchedulerError
    merges = IdGraph(fusion).self_merges()
    if merges:
        m = merges[0]
        raise SchedulerError(
            f"{scheduler_name}: its loops merge {m.outer!r} with {m.inner!r}, two dims that "
            "iterate the same values (a tensor with two dims mapped to each other, such as "
            "[M, 1] broadcast beside its own reshape to [M]); indexing cannot tell them apart")


def build_kernel(fusion, scheduler, params, index_type: str, name: str,
                 compile_now: bool = True, clone_of: dict | None = None) -> FusionKernel:
    """Schedule `fusion` (a clone, mutated), lower it, print CUDA and compile it. `clone_of`
    maps the original fusion's Vals (by id) to this clone's, to bind runtime extents."""
    # Imported here: a kernel loaded from the disk cache needs no lowering or printing, and a
    # new process whose kernels all come from disk should not pay for importing them.
    from ..codegen.cuda import generate_cuda
    from ..kir.printer import kernel_str
    from ..lower import lower
    before = repr(fusion)
    scheduler.schedule(fusion, params)
    _refuse_self_merges(fusion, scheduler.NAME)
    scheduled = repr(fusion)
    transforms = fusion.print_transforms()
    # Dumped before lowering: a schedule that fails to lower is the one worth reading.
    for stage, text in (("scheduled_ir", scheduled), ("transforms", transforms)):
        opts.dump(stage, name, text)
    kernel = lower(fusion, name, index_type=index_type,
                   streaming_loads=bool(opts.current().is_enabled("streaming_loads")),
                   verify_each=bool(opts.current().is_enabled("verify_kernel_ir")),
                   shared_divisor_quotients=opts.current().is_enabled(
                       "shared_divisor_quotients") is not False,
                   group_reductions=opts.current().is_enabled("group_reductions") is not False)
    source = generate_cuda(kernel)
    fk = FusionKernel(name, scheduler.NAME, params, index_type, fusion, kernel, source,
                      launch=kernel.launch_description, clone_of=clone_of or {})
    fk.stages = {
        "fusion_ir": before, "scheduled_ir": scheduled, "transforms": transforms,
        "heuristics": params.describe() if hasattr(params, "describe") else repr(params),
        "kernel_ir": kernel_str(kernel), "cuda": source,
    }
    for stage in ("heuristics", "cuda"):
        opts.dump(stage, name, fk.stages[stage])
    if compile_now:
        compile_kernel(fk)
    return fk


def compile_kernel(fk: FusionKernel) -> FusionKernel:
    from .kernel_cache import get_or_compile
    fk.module, fk.compile_source = get_or_compile(fk.source, fk.name, arch=ARCH)
    fk.stages["ptxas"] = fk.module.ptxas.summary() + "\n" + "\n".join(fk.module.ptxas.warnings)
    opts.dump("ptxas", fk.name, fk.stages["ptxas"])
    return fk


def from_cache_entry(entry, params) -> FusionKernel:
    """A kernel loaded from the disk cache (kernel_cache.PlanEntry): its heuristic is `params`
    as computed for this call, with the grid the stored kernel was fitted to (the executor's
    fit step, `_fit_resident_grid`, may have lowered it before the kernel was stored)."""
    if entry.fitted_grid is not None:
        params = dataclasses.replace(params, grid=entry.fitted_grid)
    fk = FusionKernel(entry.module.kernel_name, entry.scheduler, params, entry.index_type,
                      None, None, entry.module.source, launch=entry.launch, module=entry.module,
                      compile_source="disk", cache_key=entry.key)
    fk.stages = {"heuristics": params.describe() if hasattr(params, "describe") else repr(params),
                 "cuda": fk.source,
                 "ptxas": fk.module.ptxas.summary() + "\n" + "\n".join(fk.module.ptxas.warnings)}
    return fk

"""Pass `launch_config`: grid and block dimensions, shared memory and launch bounds.

Before: loops bound to blockIdx/threadIdx with (possibly runtime) extents.
After:  kernel.launch = LaunchConfig(grid=[gx, gy, gz], block=[bx, by, bz], ...), where each
        dimension is the largest extent bound to it (a fusion Scalar the executor evaluates per
        call), unless the schedule fixed it (fusion.launch_hints, e.g. a persistent grid).
        A warp-specialized kernel adds its producer rows to the split dim and is bounded to
        one block per SM.
A block dim whose extents all fold to constants in the kernel (specialized extents and the
extents the fusion requires equal to them) is that constant. The block reductions' shared
workspace is sized with the device library's formulas (kir/workspace.py) for the block; with
a runtime block size, for 1024 threads.

The pass also lays out shared memory (kernel.smem_offsets, launch.shared_mem_dynamic: every
shared buffer in one extern array, 128-byte aligned, or more where a buffer asks: swizzled
TMA boxes start on 1024 bytes) and states the whole launch as data over
the call's inputs (kernel.launch_description, kir/launch.py): parameter sources, grid, block,
workspaces, shared memory, cooperative, cluster. Codegen prints from it; the executor launches
from it, also for a kernel loaded from disk without its fusion.
"""
from __future__ import annotations

from ..ir import scalar as S
from ..ir.tensor import TensorView
from ..kir import nodes as K
from ..kir.verifier import Rule, establishes
from ..kir.launch import INDEX_ERROR_ELEMENTS, LaunchDescription, check_launch_limits
from .indexing import scalar_to_kexpr

_ORDER = {"x": 0, "y": 1, "z": 2}


def _launch_declared(v) -> None:
    """A launch configuration of three grid and block dims, the block within 1..1024 threads,
    cooperative when the kernel synchronizes the grid."""
    lc = v.k.launch
    if lc is None:
        v.fail("no launch configuration after launch_config")
    if len(lc.grid) != 3 or len(lc.block) != 3:
        v.fail(f"grid {lc.grid} / block {lc.block} are not three dims each")
    if v.grid_syncs and not lc.cooperative:
        v.fail("the kernel synchronizes the grid but its launch is not cooperative")
    static = [b if isinstance(b, int) else getattr(b, "value", None) for b in lc.block]
    if all(isinstance(b, int) for b in static):
        n = static[0] * static[1] * static[2]
        if n > 1024 or n < 1:
            v.fail(f"block {static} has {n} threads (1..1024)")


def _role_workspaces_apart(v, s, scope) -> None:
    """Compute roles run at the same time: the block reductions of two roles reduce in
    different copies of the workspace."""
    if not isinstance(s, K.RoleSplit):
        return
    seen: dict = {}
    for rb in s.roles:
        for x in K.walk(rb.body):
            if isinstance(x, K.BlockReduce):
                other = seen.setdefault(x.workspace_offset, rb.role.name)
                if other != rb.role.name:
                    v.fail(f"the {other} and {rb.role.name} roles reduce in the same block-"
                           f"reduction workspace (offset {x.workspace_offset})", x)


LAUNCH_DECLARED = Rule("launch declared", stmt=_role_workspaces_apart, kernel=_launch_declared)


def _launch_dims(kernel: K.Kernel) -> tuple[list, list]:
    """The grid and block of the kernel's loops and launch hints (ints, or extents known at run
    time), before launch_config adds a warp-specialized kernel's other roles."""
    ctx = kernel.ctx
    hints = kernel.fusion.launch_hints
    grid = [1, 1, 1]
    block = [1, 1, 1]
    thread_extents: list = [[], [], []]
    for lp in ctx.all_loops():
        pt = lp.parallel
        if not pt.is_thread_or_block:
            continue
        dim = _ORDER[pt.value[-1]]
        target = grid if pt.is_block_dim else block
        target[dim] = lp.extent if target[dim] == 1 else S.smax(target[dim], lp.extent)
        if pt.is_thread_dim:
            thread_extents[dim].append(scalar_to_kexpr(lp.extent, ctx.names))
    for dim, exts in enumerate(thread_extents):
        # Extents the kernel knows to be constants (a specialized row length, or an extent the
        # fusion requires equal to it, e.g. a weight's) make a static block: launch bounds and
        # the block reductions' shared workspace are then sized for it, not for 1024 threads.
        if exts and all(isinstance(e, K.Const) for e in exts):
            block[dim] = max(e.value for e in exts)
    for k, key in enumerate(("grid_x", "grid_y", "grid_z")):
        if key in hints:
            grid[k] = hints[key]
    for k, key in enumerate(("block_x", "block_y", "block_z")):
        if key in hints:
            block[k] = hints[key]
    return grid, block


def block_dims(kernel: K.Kernel) -> list:
    """The block launch_config will size the block reductions' shared workspace for."""
    return _launch_dims(kernel)[1]


def step_workspace_elems(s, block) -> int:
    """Elements of the block-reduction shared workspace a statement needs (0 for other
    statements): a block step's, a block scan's, a grid step's last-block combine's."""
    # Grid reductions go through their global workspace; only block steps use this one.
    if isinstance(s, K.BlockReduce):
        return reduction_workspace_elems(s.dims, K.reduced_values(s), block)
    if isinstance(s, K.BlockScan):
        # One total per warp of each row: block_allreduce_x's formula for one value.
        return reduction_workspace_elems(("x",), 1, block)
    if isinstance(s, K.GridReduce) and s.thread_dims:
        # The last block's combine ends with a block all-reduce over the reduced thread dims.
        return reduction_workspace_elems(s.thread_dims, K.reduced_values(s), block)
    return 0


@establishes(LAUNCH_DECLARED)
def launch_config(kernel: K.Kernel) -> K.Kernel:
    hints = kernel.fusion.launch_hints
    grid, block = _launch_dims(kernel)
    ws = max([step_workspace_elems(s, block) for s in K.walk(kernel.body)], default=0)
    # Compute roles of a warp-specialized kernel reduce at the same time: each in its own copy.
    roles = kernel.warp_roles.compute_roles if kernel.warp_roles is not None else 1
    for s in K.walk(kernel.body):
        if isinstance(s, K.BlockReduce):
            s.workspace_offset = s.role * ws
    kernel.reduction_workspace = ws * roles
    static_block = [b if isinstance(b, int) else b.value for b in block]
    max_threads = None
    if all(v is not None for v in static_block):
        # A block past CUDA's limits (a forced heuristic's) is refused here, before NVRTC
        # sees its launch bounds.
        check_launch_limits((1, 1, 1), static_block)
        max_threads = static_block[0] * static_block[1] * static_block[2]
    min_blocks = hints.get("min_blocks")
    max_threads = hints.get("max_threads", max_threads)
    roles = kernel.warp_roles
    if roles is not None:
        # The other compute roles and the producer warp group(s) add rows along the split dim;
        # one block per SM, so that ptxas gives every thread 65536 / threads registers at entry
        # for setmaxnreg to move.
        dim = _ORDER[roles.dim]
        block[dim] = roles.compute_extent * roles.compute_roles + roles.producer_extent
        max_threads = roles.compute_threads * roles.compute_roles + roles.producer_threads
        min_blocks = 1
    kernel.launch = K.LaunchConfig(grid=grid, block=block,
                                   max_threads=max_threads,
                                   min_blocks=min_blocks,
                                   cooperative=bool(hints.get("cooperative", False)
                                                    or kernel.needs_cooperative),
                                   cluster=hints.get("cluster"),
                                   persistent=bool(hints.get("persistent", False)))
    kernel.launch.shared_mem_dynamic = layout_shared(kernel)
    kernel.launch_description = describe_launch(kernel)
    return kernel


def layout_shared(kernel: K.Kernel) -> int:
    """Offsets of the shared buffers in the kernel's dynamic shared memory (128-byte aligned, so
    TMA boxes may land anywhere), and the total bytes: every shared buffer lives in one extern
    array, which lifts the 48 KB limit of static shared memory."""
    kernel.smem_offsets = {}
    total = 0
    for s in K.walk(kernel.body):
        if isinstance(s, K.Allocate) and s.buffer.memory == "shared":
            size = s.buffer.size
            if not isinstance(size, K.Const):
                raise ValueError(f"shared buffer {s.buffer.name} has a runtime size {size!r}")
            align = max(128, s.buffer.align)
            total = -(-total // align) * align
            kernel.smem_offsets[s.buffer.name] = total
            total += size.value * s.buffer.dtype.size
    # The extern array starts 128-byte aligned; a buffer that needs more (a 128-byte-swizzled
    # box: 1024) is placed from a base codegen aligns by hand, with that much slack.
    kernel.smem_align = max([128] + [s.buffer.align for s in K.walk(kernel.body)
                                     if isinstance(s, K.Allocate) and s.buffer.memory == "shared"])
    return total + (kernel.smem_align - 128 if total else 0)


# Packing kind of each kir parameter kind (runtime/launch.py ParamLayout); "index" follows the
# kernel's index type.
_PARAM_KIND = {"ptr": "ptr", "int64": "i64", "float": "f32", "double": "f64", "bool": "i32",
               "tmap": "tmap"}


def describe_launch(kernel: K.Kernel) -> LaunchDescription:
    """The kernel's launch as data over the call's inputs (kir/launch.py)."""
    fusion = kernel.fusion
    leaves: dict = {}
    for v in fusion.inputs:
        k = fusion.input_position(v)
        if isinstance(v, TensorView):
            for d, i in enumerate(v.domain.logical):
                for s in (i.extent, i.expanded_extent):
                    if isinstance(s, S.Scalar) and s.is_symbolic_input:
                        leaves.setdefault(s, ("extent", k, d))
        else:
            leaves.setdefault(v, ("scalar", k))

    def expr(x):
        if not isinstance(x, S.Scalar):
            return int(x)
        if x.value is not None:
            return x.value
        if x in leaves:
            return leaves[x]
        d = x.definition
        if not isinstance(d, S.ScalarOp):
            return ("unbound", S.scalar_str(x))
        return (d.op, expr(d.inputs[0]), expr(d.inputs[1]))

    index_kind = "i32" if kernel.index_type == "int" else "i64"
    workspace_index = {}
    workspaces = []
    for b, kind in kernel.workspaces:
        if kind == "intermediate":
            n = S.product(i.extent for i in b.tv.domain.logical_no_reductions
                          if not i.is_broadcast)
            elements = expr(n)
        elif b.name in kernel.workspace_elements:       # the split-K workspaces
            elements = expr(kernel.workspace_elements[b.name])
        elif kind == "semaphore":
            elements = 1
        elif kind == "scan_chain":
            elements = 2         # per row of threads of every block (scan.cuh's look-back)
        elif kind == "scan_flag":
            elements = 1
        elif kind in ("index_error", "index_report"):
            elements = INDEX_ERROR_ELEMENTS
        else:
            elements = max((K.reduced_values(s) for s in K.walk(kernel.body)
                            if isinstance(s, K.GridReduce) and s.workspace.name == b.name),
                           default=1)
        workspace_index[b.name] = len(workspaces)
        workspaces.append((kind, b.dtype.name, elements))
    kinds, sources, vector_reads, bulk = [], [], [], []
    for p in kernel.params:
        kinds.append(index_kind if p.kind == "index" else _PARAM_KIND[p.kind])
        src = p.source
        if src[0] in ("input", "output"):
            sources.append((src[0], src[1]))
            width = kernel.vector_widths.get(p.buffer.name, 1)
            if src[0] == "input" and width > 1:
                read = fusion.inputs[src[1]].domain
                dim = (None if read.contiguous_dim is None
                       else read.logical.index(read.contiguous_dim))
                vector_reads.append((src[1], width, dim,
                                     p.buffer.name in kernel.ragged_vectors))
            if src[0] == "input" and p.buffer.name in kernel.bulk_sources:
                bulk.append(src[1])
        elif src[0] == "stride":
            sources.append(tuple(src))
        elif src[0] == "extent":
            sources.append(("value", expr(src[1])))
        elif src[0] == "scalar":
            sources.append(("scalar", src[1]))
        elif src[0] == "workspace":
            sources.append(("workspace", workspace_index[p.name]))
        elif src[0] == "tmap" and isinstance(src[1], K.TileBoxMap):
            m = src[1]
            sources.append(("tmap_tile", m.role, m.index, m.inner, m.outer, m.box_cols,
                            m.box_rows, m.swizzle, m.batch))
        elif src[0] == "tmap" and isinstance(src[1], K.RowBoxMap):
            m = src[1]
            sources.append(("tmap", m.input, m.row_elements, m.inner, m.box_rows))
        else:
            raise ValueError(f"parameter {p.name}: unknown source {src}")
    launch = kernel.launch
    return LaunchDescription(
        param_kinds=tuple(kinds), param_sources=tuple(sources),
        grid=tuple(expr(g) for g in launch.grid), block=tuple(expr(b) for b in launch.block),
        shared_mem_bytes=int(launch.shared_mem_dynamic), cooperative=bool(launch.cooperative),
        cluster=tuple(launch.cluster) if launch.cluster else None,
        workspaces=tuple(workspaces), vector_reads=tuple(vector_reads), bulk_inputs=tuple(bulk),
        index_checks=tuple((what, dim, expr(n)) for what, dim, n in
                           kernel.ctx.index_checks),
        extent_multiples=tuple((expr(s), m) for s, m in fusion.extent_multiples.items()
                               if s.value is None),
        zeroed_outputs=tuple(sorted(getattr(kernel.ctx, "zeroed_outputs", ()))),
        persistent=bool(launch.persistent))


def reduction_workspace_elems(dims, count: int, block) -> int:
    """Shared-memory elements a block all-reduce of `count` values over `dims` needs (the device
    library's formulas); with a runtime block size, the bound for 1024 threads."""
    from ..kir.workspace import block_allreduce_x_smem_elems, block_allreduce_y_smem_elems
    bx, by, bz = (b if isinstance(b, int) else b.value for b in block)
    need = 0
    for dim in dims:
        if None in (bx, by, bz):
            need = max(need, count * 1024)
        elif dim == "x":
            need = max(need, block_allreduce_x_smem_elems(count, bx, by * bz))
        else:
            need = max(need, block_allreduce_y_smem_elems(count, bx, by * bz))
    return max(need, 1)



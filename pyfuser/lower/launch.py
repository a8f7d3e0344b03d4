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
"""
from __future__ import annotations

from ..ir import scalar as S
from ..kir import nodes as K
from .indexing import scalar_to_kexpr

_ORDER = {"x": 0, "y": 1, "z": 2}


def launch_config(kernel: K.Kernel) -> K.Kernel:
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
    ws = 0
    for s in K.walk(kernel.body):
        # Grid reductions go through their global workspace; only block steps use this one.
        if isinstance(s, K.BlockReduce):
            count = s.values[0].vector if s.values else 1
            ws = max(ws, reduction_workspace_elems(s.dims, count, block))
    kernel.reduction_workspace = ws
    static_block = [b if isinstance(b, int) else b.value for b in block]
    max_threads = None
    if all(v is not None for v in static_block):
        max_threads = static_block[0] * static_block[1] * static_block[2]
    min_blocks = hints.get("min_blocks")
    max_threads = hints.get("max_threads", max_threads)
    roles = kernel.warp_roles
    if roles is not None:
        # The producer warp group(s) add rows along the split dim; one block per SM, so that
        # ptxas gives every thread 65536 / threads registers at entry for setmaxnreg to move.
        dim = _ORDER[roles.dim]
        block[dim] = roles.compute_extent + roles.producer_extent
        max_threads, min_blocks = roles.compute_threads + roles.producer_threads, 1
    kernel.launch = K.LaunchConfig(grid=grid, block=block,
                                   max_threads=max_threads,
                                   min_blocks=min_blocks,
                                   cooperative=bool(hints.get("cooperative", False)
                                                    or kernel.needs_cooperative),
                                   cluster=hints.get("cluster"))
    return kernel


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



"""Pass `group_sibling_reductions`: sibling reductions side by side reduce in one pass.

Before (BatchNorm backward's sum(dy) and sum(dy * x_hat) over N, H, W, split over blockIdx.y):
    block_allreduce<y>(sum, [T17[0 .. 8)])
    grid_reduce<y>(sum, [T17[0 .. 8)])                 workspace pf_gws0, semaphore pf_gsem0
    block_allreduce<y>(sum, [T18[0 .. 8)])
    grid_reduce<y>(sum, [T18[0 .. 8)]) follows the first's last block    pf_gws2, pf_gsem2
After:
    block_allreduce<y>(sum, [T17[0 .. 8), T18[0 .. 8)])     one pass over 16 values
    grid_reduce<y>(sum, [T17[0 .. 8), T18[0 .. 8)])        each sibling's partials in a plane
                                                           of pf_gws0; one semaphore, one
                                                           arrival, one combine
Why: a block step is a chain of barriers, a grid step an arrival, a barrier and the last
block's round trips to L2 and another block step; siblings in one pass pay that chain once.
H200 (bench/results/2026-12-01/h200-few-columns-session31.txt): 1.007-1.110x over the steps
apart, BatchNorm backward's channels-last sums 41.2 -> 38.7 us.

The statements must be adjacent in one body (lower_reductions puts each reduction's steps right
after its reduction loop; siblings reduced by the same loops land side by side), each sibling's
steps of the same kind (a block step, a grid step, or both) over the same dims with the same op
and dtype. Reordering them is safe: a step reads and writes its own registers, and a grid step
after the first over its dims already follows the first's last block (lower_reductions).

Limits: siblings are grouped while the kernel's block-reduction shared workspace (which grows
with the values a step reduces at once; codegen declares it once per C type at the kernel's
largest step) stays within GROUPED_WORKSPACE_BYTES, or within what it was without grouping;
ops or dtypes that differ, and cluster reductions, stay apart.
"""
from __future__ import annotations

from ..kir import nodes as K
from ..kir.verifier import establishes
from .launch import block_dims, reduction_workspace_elems, step_workspace_elems

# The block-reduction workspace grouping may grow a kernel's to. Static shared memory is capped
# at 48 KiB a block, and a kernel's other static buffers need some; a single step of 8 float
# values over 1024 threads already takes 32 KiB. Grouping never makes it larger than this, or
# than it was without grouping: a float and a double reduction in one kernel each get an array
# of the largest step's elements (codegen/cuda.py), so a grouped float step grows the double
# array too.
GROUPED_WORKSPACE_BYTES = 32 * 1024


@establishes()
def group_sibling_reductions(kernel: K.Kernel) -> K.Kernel:
    if not kernel.group_reductions:         # the feature of that name, forced off
        return kernel
    block = block_dims(kernel)
    budget = _Workspace(kernel, block)
    dropped: set = set()
    for body in K.bodies(kernel.body):
        body[:] = _group_body(body, budget, dropped)
    if dropped:
        # The workspaces and semaphores of the grid steps folded into another's.
        kernel.params = [p for p in kernel.params if id(p.buffer) not in dropped]
        kernel.workspaces = [(b, kind) for b, kind in kernel.workspaces if id(b) not in dropped]
    return kernel


def _sites(body: list, k: int):
    """The reduction sites of the run of block and grid steps starting at body[k]: lists of one
    reduced tensor's steps ([block], [grid] or [block, grid]), and the index after the run."""
    sites = []
    while k < len(body) and isinstance(body[k], (K.BlockReduce, K.GridReduce)):
        s = body[k]
        if (isinstance(s, K.GridReduce) and sites and len(sites[-1]) == 1
                and isinstance(sites[-1][0], K.BlockReduce) and sites[-1][0].tv is s.tv):
            sites[-1].append(s)
        else:
            sites.append([s])
        k += 1
    return sites, k


def _signature(site: list) -> tuple:
    out = []
    for s in site:
        if isinstance(s, K.BlockReduce):
            out.append(("block", s.op, s.dtype, tuple(s.dims), s.barrier, s.role))
        else:
            out.append(("grid", s.op, s.dtype, tuple(sorted(s.dims)), tuple(s.thread_dims)))
    return tuple(out)


class _Workspace:
    """The kernel's block-reduction workspace as launch_config will size it: elements of its
    largest step, once per C type of the steps that use it."""

    def __init__(self, kernel: K.Kernel, block):
        sizes = [(s, step_workspace_elems(s, block)) for s in K.walk(kernel.body)]
        steps = [s for s, n in sizes if n]
        self.block = block
        self.elems = max([n for _, n in sizes], default=0)
        # One array per dtype (codegen: per C type; dtypes of one C type would share one, so
        # this may count more than is declared, never less).
        self.bytes_per_elem = sum({s.dtype: s.dtype.size for s in steps}.values())
        self.limit = max(GROUPED_WORKSPACE_BYTES, self.elems * self.bytes_per_elem)

    def admits(self, site: list, count: int) -> bool:
        """Whether `site`'s steps reducing `count` values at once keep the workspace within
        the limit; if so, the workspace grows to them."""
        first = site[0]
        dims = first.dims if isinstance(first, K.BlockReduce) else first.thread_dims
        if not dims:
            return True         # a grid step alone: its workspace is global memory
        elems = max(self.elems, reduction_workspace_elems(dims, count, self.block))
        if elems * self.bytes_per_elem > self.limit:
            return False
        self.elems = elems
        return True


def _group_body(body: list, budget: _Workspace, dropped: set) -> list:
    out: list = []
    k = 0
    while k < len(body):
        if not isinstance(body[k], (K.BlockReduce, K.GridReduce)):
            out.append(body[k])
            k += 1
            continue
        sites, k = _sites(body, k)
        groups: list = []            # [site, values reduced so far]
        for site in sites:
            sig = _signature(site)
            g = next((g for g in groups if _signature(g[0]) == sig
                      and budget.admits(g[0], g[1] + K.reduced_values(site[0]))), None)
            if g is None:
                groups.append([site, K.reduced_values(site[0])])
                continue
            for into, s in zip(g[0], site):
                into.values.extend(s.values)
                if isinstance(s, K.GridReduce):
                    dropped.update((id(s.workspace), id(s.sync_buffer)))
            g[1] += K.reduced_values(site[0])
        for site, _ in groups:
            out.extend(site)
    return out

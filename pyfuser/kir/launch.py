"""A kernel's launch as plain data over the call's inputs: what the executor needs to launch a
compiled kernel, with no fusion, schedule or kernel IR at hand.

Lowering states it (`lower/launch.py`, `Kernel.launch_description`); codegen only prints; the
executor evaluates it for each new input signature; the kernel cache stores it beside the
cubin (JSON), so a kernel loaded from disk launches for any shape of its signature class
without scheduling, lowering or printing CUDA.

Expressions (grid, block, extent parameters, workspace sizes) are nested tuples:

    7                         a constant
    ("extent", k, d)          the size of dim d of input k (an expanded dim: its expanded size)
    ("scalar", k)             the value of scalar input k
    (op, a, b)                op one of add, sub, mul, div, ceilDiv, mod, max, min
    ("unbound", "i3")         a runtime extent no input gives (evaluating it is an error)

Parameter sources, one per kernel parameter:

    ("input", k) / ("output", k)          the pointer of input / output k
    ("stride", "input"|"output", k, d)    a stride, in elements
    ("value", expr)                       an extent (index type)
    ("scalar", k)                         scalar input k
    ("workspace", w)                      the pointer of workspaces[w]
    ("tmap", k, row_elements, inner, box_rows)   a tensor map over input k's rows (RowBoxMap)
    ("tmap_tile", role, k, inner, outer, box_cols, box_rows, swizzle, batch)
                                          a 2D tensor map (3D-5D with batch dims)
                                          over input or output k (role
                                          "input"|"output"), its fields a TileBoxMap's in
                                          order: `TileBoxMap(*source[1:])` (encoded per pointer,
                                          an output's after the executor allocates it)

Workspaces: (kind, DataType name, elements). `elements` is an expression for "intermediate"
(the global tensor's elements); for "grid_reduce_data" it is the values per thread (the buffer
holds that many per thread of every block), for "semaphore" it is 1 (one per block), for
"scan_chain" 2 (two per row of threads of every block: a chained scan's aggregates and
inclusive prefixes) and "scan_flag" 1 (their flags, tagged with the launch's generation: zeroed
once, never reset), for "index_error" the record's 2 elements (in GPU memory, zeroed once) and for "index_report" its
copy (2 elements in pinned host memory, which the kernel writes through unified addressing and
the host reads without a copy: runtime/index_check.py).
"""
from __future__ import annotations

import dataclasses

_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "ceilDiv": lambda a, b: -(-a // b),
    "max": max,
    "min": min,
}


# An "index_error" workspace: [check number + 1 (0 while no check failed), the first index found
# out of range] (runtime/index_check.py).
INDEX_ERROR_ELEMENTS = 2


# CUDA's limits on every device pyfuser targets (compute capability 7.0 and later).
MAX_BLOCK_THREADS = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2 ** 31 - 1, 65535, 65535)


class LaunchLimitError(ValueError):
    """A launch's grid or block is past CUDA's limits."""


def check_launch_limits(grid, block) -> None:
    """Raise LaunchLimitError when `grid` or `block` is past CUDA's limits."""
    threads = block[0] * block[1] * block[2]
    if threads > MAX_BLOCK_THREADS or any(b > m for b, m in zip(block, MAX_BLOCK_DIMS)):
        raise LaunchLimitError(f"blocks of {tuple(block)}, {threads} threads, past CUDA's "
                               f"limits ({MAX_BLOCK_THREADS} threads, {MAX_BLOCK_DIMS} a dim)")
    if any(g > m for g, m in zip(grid, MAX_GRID_DIMS)):
        raise LaunchLimitError(f"a grid of {tuple(grid)} blocks, past CUDA's limits "
                               f"({MAX_GRID_DIMS})")


class UnboundExtent(KeyError):
    """A launch expression names a runtime extent that no input of the call gives."""


def evaluate(expr, inputs):
    """The value of a launch expression for the call's `inputs` (tensors and scalars)."""
    if not isinstance(expr, tuple):
        return expr
    tag = expr[0]
    if tag == "extent":
        return inputs[expr[1]].shape[expr[2]]
    if tag == "scalar":
        return inputs[expr[1]]
    if tag == "unbound":
        raise UnboundExtent(f"no input gives the runtime extent {expr[1]}")
    return _OPS[tag](evaluate(expr[1], inputs), evaluate(expr[2], inputs))


def _tuples(x):
    """JSON lists back to the tuples the description holds."""
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    return x


@dataclasses.dataclass(frozen=True)
class LaunchDescription:
    param_kinds: tuple            # packing kind per parameter: ptr, i32, i64, f32, f64, tmap
    param_sources: tuple          # per parameter, a source (module docstring)
    grid: tuple                   # three expressions
    block: tuple                  # three expressions
    shared_mem_bytes: int         # dynamic shared memory
    cooperative: bool             # a grid sync: every block resident (cuLaunchKernelEx)
    cluster: tuple | None         # thread-block cluster dims, or None
    workspaces: tuple = ()        # (kind, DataType name, elements)
    # Runtime rules the kernel relies on, checked before a launch (a kernel reused across
    # shapes, or a forced heuristic, may meet inputs its heuristic did not see):
    # (input k, width, logical dim read along or None, ragged: a flat run whose last vector
    # may stop inside it, checked lane by lane, so its size need not hold whole vectors)
    vector_reads: tuple = ()
    bulk_inputs: tuple = ()       # inputs copied row by row with cp.async.bulk
    # (op name, dim, extent expression) of each index check, by check number: what an
    # "index_error" workspace's record names (runtime/index_check.py).
    index_checks: tuple = ()
    # (extent expression, m): extents the schedule needs to be multiples of m (a vectorized
    # flat loop's rows hold whole vectors: fusion.extent_multiples).
    extent_multiples: tuple = ()
    # Outputs the kernel adds into (a scatter's atomic adds): the executor zeroes them before
    # each launch.
    zeroed_outputs: tuple = ()
    # A persistent grid (the heuristic's params.grid, each block striding over work units)
    # whose speed needs every block resident at once: the executor fits it to the blocks that
    # fit, as it fits a cooperative one (a grid of clusters can ask for more than fit).
    persistent: bool = False

    def launch_dims(self, inputs) -> tuple[tuple, tuple]:
        """(grid, block) of a launch with these inputs; each dim at least 1. A launch past
        CUDA's limits (a forced heuristic's, or a schedule's bug) is a LaunchLimitError here,
        not a failed launch on the device."""
        grid = tuple(max(1, int(evaluate(g, inputs))) for g in self.grid)
        block = tuple(max(1, int(evaluate(b, inputs))) for b in self.block)
        check_launch_limits(grid, block)
        return grid, block

    def workspace_elements(self, w: int, inputs, grid, block) -> int:
        kind, _, elements = self.workspaces[w]
        blocks = grid[0] * grid[1] * grid[2]
        if kind in ("intermediate", "split_k_partials", "split_k_counters"):
            return max(1, int(evaluate(elements, inputs)))
        if kind == "semaphore":
            return blocks
        if kind in ("scan_chain", "scan_flag"):
            return blocks * block[1] * block[2] * elements
        if kind in ("index_error", "index_report"):
            return elements
        return blocks * block[0] * block[1] * block[2] * elements

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "LaunchDescription":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _tuples(v) for k, v in data.items() if k in fields})

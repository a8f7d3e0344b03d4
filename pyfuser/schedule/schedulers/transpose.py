"""Transpose scheduler: pointwise fusions whose inputs and outputs run along different dims in
memory (an NCHW -> NHWC copy, an NCHW input scaled per channel and written channels-last,
x.t() + y), through shared-memory tiles so that both the reads and the writes are coalesced.

The pointwise scheduler walks the output in its memory order; an input whose innermost dim is
another one is then read with a large stride (a warp's 32 lanes touch 32 memory sectors).
Here the tensors fall in two groups: group 1, the inputs whose innermost memory dim is dim a
(a run of dims contiguous in both layouts is merged into a: H and W of NCHW -> NHWC), and group 2,
the reference output (the pointwise scheduler's reference) and everything else, whose innermost
dim is b. A block owns a T x T tile over (a, b); the other dims, with the tile indices, form
the grid:

    for blockIdx.x in [others x ceilDiv(a, T) x ceilDiv(b, T)]:
      # group 1: each group-1 input, read coalesced along a, staged in shared memory
      for j in 0..T/R:                   threadIdx.y = r in 0..R, threadIdx.x = t in 0..T/V
        tile[b = j*R + r][a = t*V .. t*V+V] = in[..., a-tile + t*V.., b-tile + j*R + r]
                                          (V-wide vector loads along a)
      __syncthreads()
      # group 2: compute and write along b, reading the tile transposed
      for i in 0..T/R:
        out[..., a = i*R + r, b = t*V .. t*V+V] = f(tile[b][a] (column read), other inputs)
                                          (V-wide vector stores along b)

One block is one tile: there is no loop over tiles, so the tile buffer is never overwritten
while another warp still reads it. The tile rows hold T + 1 elements (schedule.pad_shared_rows),
so the column reads by the lanes of a warp fall in distinct banks (row r and row r + 1 are one
bank apart); a padded row does not keep V-element vectors aligned, so the V-wide loads go to
registers and the tile is written from there element by element.

Limits: one a per fusion (the innermost dim of the first group-1 input); an input whose
innermost dim is neither a nor b is read directly, strided (correct, not coalesced); outputs
whose innermost dim is not b are written directly, strided; tiles are T x T, so a dim shorter
than T leaves threads idle (predicated); below 16 elements (a [1000, 3] transpose) the call gets
the pointwise scheduler's flat loop instead (TransposeParams.flat).
nvFuser's transpose scheduler groups tensors the same way (by their innermost dim, with the
reference tensors of both groups) and tiles the two inner dims in shared memory.
"""
from __future__ import annotations

import dataclasses

from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ..cache import cached_uses
from ...ir.tensor import MemoryType, TensorView
from .. import (cache_after, cache_before, inline_at, inline_most, pad_shared_rows,
                parallelize_like, propagate_transforms)
from . import pointwise
from .base import (RuntimeInfo, SchedulerError, access_width, input_vector_width,
                   orient_vector_inputs, pow2_divisor, reduction_tensors, vector_inputs,
                   vectorize)

NAME = "transpose"

# Tile dims shorter than this gain little from a shared-memory tile (fewer than half a warp
# along the dim): known extents below it go to the pointwise scheduler, and a call whose
# extents are below it gets the pointwise scheduler's flat loop (TransposeParams.flat).
MIN_TILE_EXTENT = 16


@dataclasses.dataclass(frozen=True)
class TransposeParams:
    tile: int = 32              # T: the tile is T x T elements over (a, b)
    vector: int = 1             # V: elements per access along a (loads) and b (stores)
    rows: int = 8               # R: threadIdx.y; threadIdx.x is T / V
    a_dims: tuple = ()          # the reference's logical dims merged into a, outer first
    b_dims: tuple = ()          # the reference's logical dims merged into b, outer first
    tiled_inputs: tuple = ()    # fusion input positions staged in shared memory (group 1)
    vector_loads: bool = False  # the tiled inputs take V-wide loads (their layout allows)
    vector_stores: bool = False # group-2 outputs take V-wide stores along b
    vector_inputs: tuple = ()   # other input positions read with V-wide loads along b
    # T divides both tile dims in this call (56 x 56 x 256 channels in 64 x 64 tiles): the tile
    # splits are divisible, so no access is guarded (a call with partial tiles gets other
    # params, so another kernel).
    full_tiles: bool = False
    row_pad: int = 1            # spare elements after each tile row (bank-conflict-free columns)
    # In a call where a tile dim is shorter than MIN_TILE_EXTENT, the pointwise scheduler's
    # heuristic: one flat loop (a tile would leave most of its threads idle), else None.
    flat: object = None
    note: str = ""

    def describe(self) -> str:
        if self.flat is not None:
            return f"transpose ({self.note}): {self.flat.describe()}"
        return (f"transpose: tile {self.tile}x{self.tile}, vector {self.vector}, block "
                f"{self.tile // self.vector}x{self.rows}, a = dims {list(self.a_dims)}, b = dims "
                f"{list(self.b_dims)}, shared-memory tiles for inputs {list(self.tiled_inputs)}"
                + (", full tiles (no guards)" if self.full_tiles else "")
                + (f" ({self.note})" if self.note else ""))


@dataclasses.dataclass(frozen=True)
class _Layout:
    ref: TensorView
    a_dims: tuple
    b_dims: tuple
    tiled_inputs: tuple


def _ref_dim(v: TensorView, i, ref: TensorView, graph) -> int | None:
    for d, r in enumerate(ref.domain.logical_no_reductions):
        if not r.is_broadcast and graph.mapped(i, r):
            return d
    return None


def _alloc_dims(tv: TensorView, ref: TensorView, graph) -> list | None:
    """tv's allocation order as the reference's logical dims (broadcasts left out); None when a
    dim of tv maps to none of the reference's."""
    out = []
    for i in tv.domain.maybe_allocation:
        if i.is_broadcast or i.is_reduction:
            continue
        d = _ref_dim(tv, i, ref, graph)
        if d is None:
            return None
        out.append(d)
    return out


def _layout(fusion) -> tuple[_Layout | None, str]:
    if reduction_tensors(fusion):
        return None, "the fusion has reductions"
    outs = [o for o in fusion.outputs if isinstance(o, TensorView)]
    if not outs:
        return None, "no tensor outputs"
    ref = pointwise._reference(fusion)
    graph = IdGraph(fusion)
    out_order = _alloc_dims(ref, ref, graph)
    if not out_order or len(out_order) < 2:
        return None, "the output has fewer than two iterated dims"
    b = out_order[-1]
    a, first = None, None
    tiled = []
    for k, v in enumerate(fusion.inputs):
        if not isinstance(v, TensorView) or not cached_uses(v):
            continue
        order = _alloc_dims(v, ref, graph)
        if not order or b not in order:
            continue
        if order[-1] == b:
            continue
        if a is None:
            a, first = order[-1], order
        if order[-1] == a:
            tiled.append(k)
    if a is None:
        return None, ("no input has its innermost memory dim different from the output's "
                      "(nothing to transpose)")
    # Merge into a the dims just outside it in the first tiled input that sit just outside it in
    # the output too (H of NCHW -> NHWC: H, W are adjacent in both), and likewise into b.
    a_dims = [a]
    while True:
        p = first.index(a_dims[0])
        q = out_order.index(a_dims[0])
        if p == 0 or q == 0 or first[p - 1] != out_order[q - 1] or first[p - 1] == b:
            break
        a_dims.insert(0, first[p - 1])
    b_dims = [b]
    while True:
        p = out_order.index(b_dims[0])
        q = first.index(b_dims[0])
        if p == 0 or q == 0 or out_order[p - 1] != first[q - 1] or out_order[p - 1] in a_dims:
            break
        b_dims.insert(0, out_order[p - 1])
    logical = ref.domain.logical_no_reductions
    for name, dims in (("a", a_dims), ("b", b_dims)):
        ext = 1
        for d in dims:
            e = logical[d].extent.value
            ext = None if e is None or ext is None else ext * e
        if ext is not None and ext < MIN_TILE_EXTENT:
            return None, (f"the tile dim {name} (dims {dims}) has {ext} elements, fewer than "
                          f"{MIN_TILE_EXTENT}: a shared-memory tile gains little")
    return _Layout(ref, tuple(a_dims), tuple(b_dims), tuple(tiled)), ""


def can_schedule(fusion) -> tuple[bool, str]:
    ok, why = pointwise.can_schedule(fusion)
    if not ok:
        return False, why
    lay, why = _layout(fusion)
    if lay is None:
        return False, why
    return True, (f"inputs {list(lay.tiled_inputs)} run along dims {list(lay.a_dims)} in memory, "
                  f"the output along {list(lay.b_dims)}: tiles through shared memory")


def _run_extent(ref, dims, info) -> int:
    n = 1
    for d in dims:
        n *= info.extent(ref.domain.logical_no_reductions[d].extent)
    return n


def compute_heuristics(fusion, info: RuntimeInfo) -> TransposeParams:
    lay, why = _layout(fusion)
    if lay is None:
        raise SchedulerError(f"transpose: {why}")
    ref = lay.ref
    graph = IdGraph(fusion)
    logical = ref.domain.logical_no_reductions
    a_inner, b_inner = logical[lay.a_dims[-1]], logical[lay.b_dims[-1]]
    a_ext, b_ext = _run_extent(ref, lay.a_dims, info), _run_extent(ref, lay.b_dims, info)
    if min(a_ext, b_ext) < MIN_TILE_EXTENT:
        # A [1000, 3] transpose in 32 x 32 tiles would run ten times the threads it has
        # elements; the flat loop reads 3-element runs, which a tile would not improve.
        return TransposeParams(a_dims=lay.a_dims, b_dims=lay.b_dims,
                               flat=pointwise.compute_heuristics(fusion, info),
                               note=f"tile dims of {a_ext} x {b_ext} elements, one under "
                                    f"{MIN_TILE_EXTENT}: one flat loop")
    # One V for both sides (threadIdx.x is T / V for the loads and the stores): 16-byte
    # accesses of the widest tiled input or output, dividing both runs. Other inputs take
    # their own width (fp32 per-channel scales of a bf16 image: two 4-wide loads per 8).
    widest = max([t.dtype.size for t in fusion.outputs if isinstance(t, TensorView)]
                 + [fusion.inputs[k].dtype.size for k in lay.tiled_inputs] + [1])
    vector = pow2_divisor(a_ext, max(1, 16 // widest))
    vector = pow2_divisor(b_ext, vector)
    # Loads: the tiled inputs' layout in this call must allow V-wide vectors along a.
    vector_loads = vector > 1
    for k in lay.tiled_inputs:
        v = fusion.inputs[k]
        d = next(d for d, i in enumerate(v.domain.logical) if graph.mapped(i, a_inner))
        if input_vector_width(v, info.inputs[k], d, vector) != access_width(v.dtype, vector):
            vector_loads = False
    vector_stores = vector > 1
    vec_inputs = tuple(k for k in vector_inputs(fusion, info, vector, b_inner)
                       if k not in lay.tiled_inputs)
    # 64 x 64 tiles for 8-wide (16-bit) vectors keep a row of T / V = 8 lanes at 128 bytes;
    # 32 x 32 otherwise (32 lanes of 4 bytes, or 8 lanes of 16 bytes, per row).
    tile = 64 if vector >= 8 else 32
    lanes = tile // vector
    rows = max(1, min(tile, 256 // lanes))
    return TransposeParams(tile=tile, vector=vector, rows=rows, a_dims=lay.a_dims,
                           b_dims=lay.b_dims, tiled_inputs=lay.tiled_inputs,
                           vector_loads=vector_loads, vector_stores=vector_stores,
                           vector_inputs=vec_inputs,
                           full_tiles=a_ext % tile == 0 and b_ext % tile == 0)


def schedule(fusion, p: TransposeParams) -> None:
    if p.flat is not None:
        pointwise.schedule(fusion, p.flat)
        return
    first_ref = pointwise._reference(fusion)
    orient_vector_inputs(fusion, p.vector_inputs,
                         first_ref.domain.logical_no_reductions[p.b_dims[-1]])
    tiles = {k: cache_after(fusion.inputs[k], memory_type=MemoryType.Shared)
             for k in p.tiled_inputs}
    # V-wide loads go to registers first: the padded tile rows (T + 1 elements) do not keep
    # V-element vectors aligned, so the tile is written element by element.
    staged = [cache_after(fusion.inputs[k]) for k in tiles] if p.vector_loads else []
    caches = {k: cache_after(v) for k, v in enumerate(fusion.inputs)
              if isinstance(v, TensorView) and cached_uses(v) and k not in tiles}
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    ref = pointwise._reference(fusion)
    logical = ref.domain.logical_no_reductions
    a_ids = [logical[d] for d in p.a_dims]
    b_ids = [logical[d] for d in p.b_dims]
    # [others (memory order), a-run, b-run] -> [others, a, b] -> [G, T(a), T(b)]
    alloc = [i for i in ref.domain.maybe_allocation if not i.is_reduction]
    others = [i for i in alloc if i not in a_ids and i not in b_ids]
    order = others + a_ids + b_ids
    ref.reorder([ref.domain.loop.index(i) for i in order])
    n_o = len(others)
    for _ in range(len(a_ids) - 1):
        ref.merge(n_o, n_o + 1)
    for _ in range(len(b_ids) - 1):
        ref.merge(n_o + 1, n_o + 2)
    ref.split(n_o + 1, p.tile, divisible=p.full_tiles)        # [others, a, b/T, T]
    ref.split(n_o, p.tile, divisible=p.full_tiles)            # [others, a/T, T, b/T, T]
    ref.reorder({n_o + 1: n_o + 2, n_o + 2: n_o + 1})   # [others, a/T, b/T, Ta, Tb]
    while len(ref.domain.loop) > 3:
        ref.merge(0, 1)
    if len(ref.domain.loop) != 3:
        raise SchedulerError("transpose: the tile did not leave [grid, Ta, Tb]")
    propagate_transforms(ref)
    tile_tvs = list(tiles.values()) + staged
    # Group 2: [G, Ta, Tb] -> [G, Ta/R, R (TIDy), Tb/V (TIDx), V]
    ref.split(2, p.vector)
    ref.split(1, p.rows)
    ref.parallelize(0, PT.BIDx).parallelize(2, PT.TIDy).parallelize(3, PT.TIDx)
    rest = [t for t in fusion.tensors() if t not in tile_tvs and not t.is_input()]
    reached = set(propagate_transforms(ref, tensors=rest))
    _reach_past_tiles(fusion, ref, tiles.values(), rest, reached)
    parallelize_like(ref, tensors=rest, parallel_types={PT.BIDx, PT.TIDx, PT.TIDy})
    # Group 1: [G, Ta, Tb] -> [G, Tb, Ta] -> [G, Tb/R, R (TIDy), Ta/V (TIDx), V]
    for t in tile_tvs:
        _fold_broadcasts_into_grid(t)
        if len(t.domain.loop) != 3:
            raise SchedulerError(f"transpose: tile T{t.name} has loop {t.domain.loop}, not "
                                 "[grid, Ta, Tb]")
        t.reorder({1: 2, 2: 1})
        t.split(2, p.vector)
        t.split(1, p.rows)
        t.parallelize(0, PT.BIDx).parallelize(2, PT.TIDy).parallelize(3, PT.TIDx)
    for t in tiles.values():
        # Row [Ta/V, V] of T elements, then one spare: a column's elements (b = r, r + 1, ...)
        # are one bank apart, so the transposed reads of a warp's lanes do not conflict.
        pad_shared_rows(t, t.domain.loop[3], p.row_pad)
    graph = IdGraph(fusion)
    if p.vector > 1:
        for t in staged:
            vectorize(t, -1, p.vector)
        if p.vector_stores:
            b_inner = b_ids[-1]
            for t in [caches[k] for k in p.vector_inputs] + outputs:
                vectorize(t, -1, p.vector, along=b_inner, graph=graph)
    inline_most(fusion=fusion)
    for t in tiles.values():
        # A tile is written in group 1's loops and read in group 2's: it shares the grid loop
        # only. The permissive ID graph can map the two groups' loops to each other (a [1]
        # input added both before and after the permute maps the tile's two dims through its
        # broadcast: fuzz 20261378:204, 20261404:933), and a tile inlined into its readers'
        # loops holds no row to pad.
        if t.compute_at_pos > 1:
            inline_at(t, 1)


def _fold_broadcasts_into_grid(t: TensorView) -> None:
    """A tile's size-1 broadcast dims that the reference lacks (an input [M, 1, N] squeezed to
    the output [M, N]: fuzz 5:79) are left after [G, Ta, Tb] by the propagation: merged into
    the grid axis (a merge with a broadcast forwards the other ID), the tile keeps the three
    axes the group-1 schedule splits."""
    extra = [k for k, i in enumerate(t.domain.loop) if k >= 3 and i.is_broadcast]
    if not extra or len(t.domain.loop) - len(extra) != 3:
        return
    t.reorder({k: n for n, k in enumerate(extra)})
    for _ in extra:
        t.merge(0, 1)


def _reach_past_tiles(fusion, ref, tile_tvs, rest, reached: set) -> None:
    """Give group 2's loops to the tensors that only a tile leads to (a cast of the tiled input
    written as a second output, fuzz 20261123:1352): propagation from the reference stops at
    the tiles, whose loops are group 1's. Each such consumer of a tile replays the reference's
    transforms directly (its dims map to the reference's), and passes them on to what only it
    reaches. Left alone, their loops stayed [grid, Ta, Tb], serial, run by one thread.
    So do the tensors reached through one of fewer dims (x + b[N] as a second output, reached
    from b's cache, fuzz 20261331:1387): the dims b lacks stayed whole serial loops, and the
    threads read tile elements no one loaded."""
    from ..transform_propagation import replay
    graph = IdGraph(fusion)
    ref_root = ref.domain.maybe_root

    def ref_dims(t):
        out = {}
        for i in ref_root:
            j = next((x for x in t.domain.maybe_root if graph.mapped(i, x)), None)
            if j is not None:
                out[i] = j
        return out

    def whole(t):
        """A dim of the reference's that t's loop still holds untransformed."""
        return any(j in t.domain.loop and not j.is_broadcast for j in ref_dims(t).values())

    for tile in tile_tvs:
        for c in fusion.consumers(tile):
            if c not in rest or (c in reached and not whole(c)):
                continue
            replay(ref, c, ref_dims(c), "twin")
            reached.add(c)
            todo = [t for t in rest if t is not c and (t not in reached or whole(t))]
            reached |= set(propagate_transforms(c, tensors=todo))

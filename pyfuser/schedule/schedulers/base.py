"""What every scheduler shares: the runtime facts heuristics read, and the scheduler interface.

A scheduler is a pure function (fusion, heuristic) -> scheduled fusion; its heuristic is a frozen,
hashable dataclass computed from the fusion, the runtime facts of the inputs and the device's
properties. The same heuristic always gives the same kernel, so kernels are reused across input
shapes whose heuristics are equal.
"""
from __future__ import annotations

import dataclasses

from ...ir import scalar as S
from ...ir.exprs import ReductionOp
from ...ir.iter_domain import IterDomain, ParallelType
from ..cache import cached_uses
from ...ir.tensor import TensorView


@dataclasses.dataclass(frozen=True)
class InputFacts:
    """What a heuristic may know about one input tensor at run time."""

    sizes: tuple
    strides: tuple
    alignment: int          # largest power of two (<= 16) dividing the data pointer, in bytes


@dataclasses.dataclass
class RuntimeInfo:
    """Extents and input layouts of one call, and the device it runs on."""

    bindings: dict                 # symbolic extent Scalar -> int
    inputs: tuple                  # InputFacts or None (scalars), per fusion input
    device: object                 # DeviceProperties
    # The pyfuser.options.Options of the call (the features a heuristic may be forced into or
    # out of); None: the defaults. Heuristics read options here, never through
    # options.current(): they are pure functions of the fusion and this record.
    options: object = None

    def feature(self, name: str):
        """Forced on: True; forced off: False; else None (the heuristic decides)."""
        return None if self.options is None else self.options.is_enabled(name)

    def extent(self, s) -> int:
        return int(S.evaluate(s, dict(self.bindings)))


def cache_inputs_and_outputs(fusion) -> tuple[dict, list]:
    """The staging the flat schedulers start from: a register cache after each input the fusion
    reads (keyed by input position) and one before each computed output. Returns (caches, the
    computed outputs)."""
    from .. import cache_after, cache_before
    caches = {k: cache_after(v) for k, v in enumerate(fusion.inputs)
              if isinstance(v, TensorView) and cached_uses(v)}
    outputs = [o for o in fusion.outputs if o.definition is not None]
    for o in outputs:
        cache_before(o)
    return caches, outputs


def facts_per_input(fusion, facts: tuple) -> tuple:
    """RuntimeInfo.inputs for `fusion` from the facts of the runtime inputs (one per input of
    the definition): an alias input (schedule/roles.py) has those of the input it aliases."""
    return tuple(facts[fusion.input_aliases.get(k, k)] for k in range(len(fusion.inputs)))


class SchedulerError(ValueError):
    pass


def split_flat_loop(ref: TensorView, threads: int, unroll: int) -> None:
    """ref's outermost loop, a flat iteration, as blockIdx.x x [unroll] x threadIdx.x (the unroll
    iterations `threads` apart), propagated to every tensor and parallelized alike: the flat
    schedulers' (pointwise, scatter) block of elements."""
    from .. import parallelize_like, propagate_transforms
    PT = ParallelType
    ref.split(0, threads)
    if unroll > 1:
        ref.split(0, unroll)
        ref.parallelize(0, PT.BIDx).parallelize(1, PT.Unroll).parallelize(2, PT.TIDx)
    else:
        ref.parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    propagate_transforms(ref)
    parallelize_like(ref, parallel_types={PT.BIDx, PT.TIDx, PT.Unroll})


def own_copy(t: TensorView, uses: list, scheduler: str) -> None:
    """Give `uses` their own copy of t's computation, back to the fusion's inputs (loads
    included: recompute.recompute_for), so that each inlines into its own loop nest; where an
    op on the way is not recomputed, a SchedulerError (the plan without this scheduler)."""
    from ..recompute import recompute_blocker, recompute_for
    blocker = recompute_blocker(t, set())
    if blocker is not None:
        raise SchedulerError(f"{scheduler}: T{t.name} is read in two loop nests, and "
                             f"T{blocker.name} ({type(blocker.definition).__name__}) on its "
                             "way is not recomputed")
    recompute_for(t, uses, set())


def reduction_tensors(fusion) -> list[TensorView]:
    return [e.outputs[0] for e in fusion.exprs() if isinstance(e, ReductionOp)]


def reference_reduction(reds: list[TensorView]) -> TensorView:
    """The reduction a persistent schedule is built around: the first of those whose kept dims
    are iterations rather than broadcasts. A norm backward of one row can mix x [1, N] (a
    one-row tensor as `from_pytorch` defines it, its row dim a broadcast) with mean [M, 1]:
    the reduction of x's terms has a broadcast row dim while the one of x - mean iterates the
    rows; scheduled around the former, the rows of the latter would get no loop of their
    own (a broadcast row dim is an iteration of extent 1 only where no tensor iterates it)."""
    def broadcast_kept(r: TensorView) -> int:
        return sum(1 for i in r.domain.maybe_root if i.is_broadcast)
    return min(reds, key=broadcast_kept)


def iterates_rows(tv: TensorView, ref: TensorView, exact_graph) -> bool:
    """Whether tv has one of the rows the reduction `ref` keeps, as the rows of a persistent
    schedule iterate them (the exact ID graph: a broadcast dim is not the dim it is broadcast
    to). A weight [N] has none, and neither has a one-row input [1, N] broadcast against
    tensors of M rows: both are the same for every row. When ref's own rows are broadcasts
    (every tensor has one row), a [1, N] input has ref's rows."""
    kept = [i for i in ref.domain.maybe_root if not i.is_reduction]
    return any(exact_graph.mapped(i, k) for i in tv.domain.logical for k in kept)


def max_vector_bytes(alignment: int) -> int:
    return min(16, alignment)


def pow2_divisor(x: int, limit: int) -> int:
    """The largest power of two <= limit dividing x."""
    v = 1
    while v * 2 <= limit and x % (v * 2) == 0:
        v *= 2
    return v


# Vector accesses ---------------------------------------------------------------------------------
# A scheduler splits one loop dim of its reference by a vector width (the *scheduled* width,
# chosen by its heuristic). Each tensor accessed in that loop then gets its own width, from its
# own dtype and layout (`access_width`, `input_vector_width`, `vectorize`): at most 16 bytes
# per access, and only along the tensor's stride-1 dim, with a contiguous run of at least the
# width. A tensor that cannot take a vector there is accessed element-wise.

def access_width(dtype, width: int) -> int:
    """Elements per access of a `dtype` tensor in a loop vectorized by `width` (a power of two):
    at most 16 bytes (8 x bf16, 4 x fp32, 2 x int64)."""
    return max(1, min(width, 16 // dtype.size))


def mapped_dim(tv: TensorView, ref_id, graph) -> int | None:
    """The logical dim of `tv` that iterates what the reference's ID `ref_id` does (exact
    graph), or None: tv lacks that dim, or has it as a broadcast (one element for every
    iteration, such as a [1]-shaped input next to a [256] one)."""
    for d, i in enumerate(tv.domain.logical):
        if not i.is_broadcast and not i.is_reduction and graph.mapped(i, ref_id):
            return d
    return None


def stride_one_dim(v: TensorView, facts: InputFacts) -> IterDomain | None:
    """Input v's logical ID whose elements lie next to each other in memory in this call: the
    innermost allocated dim that is neither a broadcast nor of size 1. A dim of size 1 has no
    meaningful stride, so it does not decide the layout wherever the definition puts it (the
    [1, N] view of an [N, 1] tensor, defined with its size-1 dim innermost, is read along N).
    The definition's contiguous_dim when every dim has size 1."""
    logical = v.domain.logical
    for i in reversed(v.domain.maybe_allocation):
        if not i.is_broadcast and not i.is_reduction and facts.sizes[logical.index(i)] != 1:
            return i
    return v.domain.contiguous_dim


def input_vector_width(v: TensorView, facts: InputFacts, dim: int | None, width: int) -> int:
    """The width input `v` is read with along its logical dim `dim` in a loop vectorized by
    `width`: access_width(v.dtype, width) when `dim` is the input's stride-1 dim in this call
    (stride_one_dim) and its layout allows it (input_vector_problems); else 1 (read
    element-wise)."""
    w = access_width(v.dtype, width)
    if dim is None or w <= 1 or facts is None:
        return 1
    if v.domain.logical[dim] is not stride_one_dim(v, facts):
        return 1
    return 1 if input_vector_problems(v, facts, w) else w


def input_vector_problems(v: TensorView, facts: InputFacts, width: int,
                          dim: int | None = None, ragged: bool = False) -> list[str]:
    """Why input `v`, with this call's sizes, strides and pointer alignment, cannot be read with
    `width`-wide vectors along its logical dim `dim` (by default its stride-1 dim in this call,
    stride_one_dim, the only dim schedules vectorize an input along): that dim must have stride
    1 and hold whole vectors (its size a multiple of the width), the pointer must be aligned to
    one access and every other stride a multiple of the width (each row starts a vector).
    `ragged`: the vectors run over the whole tensor as one flat run, the last one checked lane
    by lane (lower/vectorize.py): the tensor must be dense in row-major order instead, and
    aligned. Empty when it can."""
    if ragged:
        return _flat_run_problems(v, facts, width)
    inner = stride_one_dim(v, facts) if dim is None else v.domain.logical[dim]
    if inner is None:
        return ["every dim is a broadcast (one element, no run of elements to read)"]
    d = v.domain.logical.index(inner)
    sizes, strides = facts.sizes, facts.strides
    bad = []
    if strides[d] != 1 and sizes[d] != 1:
        bad.append(f"its dim {d}, innermost in memory, has stride {strides[d]}, not 1")
    if sizes[d] % width:
        bad.append(f"its dim {d}, innermost in memory, has size {sizes[d]}, not a multiple "
                   f"of {width}")
    if facts.alignment < width * v.dtype.size:
        bad.append(f"its data pointer is not {width * v.dtype.size}-byte aligned")
    if any(st % width for e, (sz, st) in enumerate(zip(sizes, strides)) if e != d and sz != 1):
        bad.append(f"its strides {tuple(strides)} are not multiples of {width}")
    return bad


def _flat_run_problems(v: TensorView, facts: InputFacts, width: int) -> list[str]:
    bad = []
    expect = 1
    for d in range(len(facts.sizes) - 1, -1, -1):
        if facts.sizes[d] != 1 and facts.strides[d] != expect:
            bad.append(f"it is not dense in row-major order (strides {tuple(facts.strides)}, "
                       f"sizes {tuple(facts.sizes)}): its vectors run over it as one flat run")
            break
        expect *= facts.sizes[d]
    if facts.alignment < width * v.dtype.size:
        bad.append(f"its data pointer is not {width * v.dtype.size}-byte aligned")
    return bad


def orient_vector_inputs(fusion, positions, ref_id, dims: dict | None = None) -> None:
    """Give the inputs at `positions` (a heuristic's vector inputs) the layout their vector
    reads assume, before they are cached: an input read with vectors along its dim mapped to
    the reference's ID `ref_id` while its definition puts other dims inside that one had, in
    the call the heuristic saw, only dims of size 1 there (stride_one_dim). Those dims move
    outermost in its allocation (a size-1 dim's place says nothing about the layout), so the
    input and its cache have the read dim innermost and vectorize() takes it. Their strides and
    the read dim's are passed at run time, not assumed from contiguity, so the kernel reads any
    input of the definition correctly; the executor checks vector reads against each call's
    layout (input_vector_problems) before launch. `dims` gives the read dim of inputs the
    graph does not map to ref_id (a window's source: its resized dim is the window's)."""
    from ...ir.id_graph import IdGraph
    from ..allocation import set_allocation_domain
    if not positions or ref_id is None:
        return
    graph = IdGraph(fusion)
    for k in positions:
        v = fusion.inputs[k]
        d = (dims or {}).get(k, mapped_dim(v, ref_id, graph))
        if d is None or v.domain.logical[d] is v.domain.contiguous_dim:
            continue
        read = v.domain.logical[d]
        alloc, contig = v.domain.maybe_allocation, v.domain.contiguity
        at = alloc.index(read)
        moved = [i for i in alloc[at + 1:] if not i.is_broadcast]
        order = moved + [i for i in alloc if i not in moved]
        flags = {i: (False if i in moved or i is read else c) for i, c in zip(alloc, contig)}
        set_allocation_domain(v, order, [flags[i] for i in order])


def vector_inputs(fusion, info: RuntimeInfo, vector: int, ref_id) -> tuple:
    """Positions of the fusion inputs that take vector loads in a loop over the reference's
    logical ID `ref_id` vectorized by `vector`: those read with their full access_width (an
    input whose layout allows only a narrower one is read element-wise)."""
    from ...ir.id_graph import IdGraph
    if vector <= 1:
        return ()
    graph = IdGraph(fusion)
    out = []
    for k, v in enumerate(fusion.inputs):
        if not (isinstance(v, TensorView) and cached_uses(v)):
            continue
        w = input_vector_width(v, info.inputs[k], mapped_dim(v, ref_id, graph), vector)
        if w > 1 and w == access_width(v.dtype, vector):
            out.append(k)
    return tuple(out)


def vector_windows(fusion, info: RuntimeInfo, vector: int, ref_id) -> tuple:
    """Positions, among the fusion's WindowOps in expression order, of the windows of inputs
    read with vector loads in a loop over the reference's logical ID `ref_id` vectorized by
    `vector`: the window's dim along ref_id reads the input's stride-1 dim whole vectors at a
    time (step 1, an offset and guard bounds that are multiples of the width, so each vector
    is one run of the input, all read or all filled) and the input's layout allows the width
    (input_vector_width)."""
    from ...ir.exprs import WindowOp
    from ...ir.id_graph import IdGraph
    if vector <= 1:
        return ()
    graph = IdGraph(fusion)
    windows = [e for e in fusion.exprs() if isinstance(e, WindowOp)]
    out = []
    for n, e in enumerate(windows):
        src, tv = e.src, e.outputs[0]
        if src not in fusion.inputs:
            continue
        d = mapped_dim(tv, ref_id, graph)
        w = access_width(src.dtype, vector)
        if d is None or w <= 1 or not _window_whole_vectors(e.windows[d], w):
            continue
        facts = info.inputs[fusion.inputs.index(src)]
        if input_vector_width(src, facts, d, vector) == w:
            out.append(n)
    return tuple(out)


def vector_gathers(fusion, info: RuntimeInfo, vector: int, ref_id) -> tuple:
    """Positions, among the fusion's GatherOps in expression order, of the gathers whose source
    is read with vector loads in a loop over the reference's logical ID `ref_id` vectorized by
    `vector`: out's dim along ref_id reads a source dim other than the gathered one, of the
    same extent (paired with it: GatherOp.dim_map), that dim is the source's stride-1 dim and
    its layout allows the width (input_vector_width), and the index is one value along ref_id
    (an embedding's ids, index_select's index: broadcast there), so a vector of out is one run
    of one source row."""
    from ...ir.exprs import GatherOp
    from ...ir.id_graph import IdGraph
    if vector <= 1:
        return ()
    graph = IdGraph(fusion)
    gathers = [e for e in fusion.exprs() if isinstance(e, GatherOp)]
    out = []
    for n, e in enumerate(gathers):
        src, tv = e.src, e.outputs[0]
        if src not in fusion.inputs or mapped_dim(e.index, ref_id, graph) is not None:
            continue
        d = mapped_dim(tv, ref_id, graph)
        s = next((a for a, b in e.dim_map[0] if b == d), None)
        if d is None or s is None or s == e.dim:
            continue
        # The whole vector in one access: a wider vector split into narrower accesses (a
        # float64 table under float32 outputs: 4 lanes, 2 per access) would put the index
        # outside the inner access's loop, one per lane (fuzz 20261405:251).
        w = access_width(src.dtype, vector)
        facts = info.inputs[fusion.inputs.index(src)]
        if w == vector and input_vector_width(src, facts, s, vector) == w:
            out.append(n)
    return tuple(out)


def _window_whole_vectors(w, width: int) -> bool:
    if w is None:
        return True
    if w.step != 1 or not isinstance(S.const_value(w.offset), int) \
            or S.const_value(w.offset) % width:
        return False
    for a, b, lo, hi in w.guards:
        a, lo, hi = (S.const_value(x) for x in (a, lo, hi))
        if b != 1 or not all(isinstance(x, int) for x in (a, lo, hi)) \
                or (lo - a) % width or (hi - a) % width:
            return False
    return True


def vector_width(fusion, inner_extent: int, ref_id, counted=None) -> int:
    """The scheduled width of a loop over the reference's logical ID `ref_id` of
    `inner_extent` elements: 16-byte accesses of the widest input that iterates that dim
    (inputs without it, such as per-row scalars, are not read with vectors), dividing the
    extent. With `counted` (inputs), only those of them that iterate the dim count, where any
    does: a reduction counts the inputs read at every step of its loop; one over its kept dims
    only (BatchNorm's mean [C] beside its [N, C, H, W] image) is read once per column, and a
    wider dtype of it is read in several 16-byte accesses (vectorize) rather than halving the
    width of every access of the image."""
    from ...ir.id_graph import IdGraph
    graph = IdGraph(fusion)
    along = [v for v in fusion.inputs if isinstance(v, TensorView)
             and mapped_dim(v, ref_id, graph) is not None]
    widest = max([v.dtype.size for v in
                  ([v for v in along if v in counted] if counted else []) or along] + [1])
    return pow2_divisor(inner_extent, max(1, 16 // widest))


def vectorize(tv: TensorView, pos: int, width: int | None = None, along=None,
              graph=None) -> int:
    """Vectorize loop axis `pos` of `tv` (the scheduled vector split, a constant extent) for the
    widest access its dtype and layout allow; returns that width (1: accessed element-wise).

    The axis must step through tv's stride-1 dim (TensorDomain.contiguous_dim; an input's
    cache keeps the input's allocation order), else its lanes are not next to each other in
    memory and the tensor is accessed element-wise: a per-row statistic [M, 1] whose loop took
    the row's split on its broadcast dim, or an input read across its layout (a permute).
    Accesses are at most 16 bytes: when the axis is wider than access_width(tv.dtype), it is
    split and its inner part vectorized (an fp32 output of a loop vectorized for bf16 inputs:
    two 4-wide stores per 8 elements). `width` caps the width further.

    `along` (with the ID graph `graph`) is the reference's dim that the scheduled vector split
    steps through: the axis must step through tv's dim mapped to it. Inlined into the
    reference's loops, a tensor's loop stands for the reference's: an [M, 1] output beside an
    [M, N] reference has its merge with the broadcast dim replayed from the reference's
    merge, so its own history says the split steps through M while its lanes run along N, one
    element of its own for all of them."""
    from ...ir.iter_domain import ParallelType as PT
    if not tv.domain.loop:
        return 1        # a 0-dim tensor (a scalar output beside the reference): one element
    pos = pos + tv.ndim if pos < 0 else pos
    i = tv.axis(pos)
    ext = i.const_extent
    if ext is None or ext <= 1 or i.is_reduction or i.parallel_type != PT.Serial:
        return 1
    inner = tv.domain.contiguous_dim
    if inner is None or tv.domain.dim_stepped_by(i) is not inner:
        return 1
    if along is not None and not graph.mapped(inner, along):
        return 1
    w = access_width(tv.dtype, ext if width is None else min(width, ext))
    if w <= 1:
        return 1
    if w < ext:
        tv.split(pos, w)
        pos += 1
    tv.parallelize(pos, PT.Vectorize)
    return w


def vectorize_along(tv: TensorView, vec_axis, graph, width: int | None = None) -> int:
    """Vectorize tv's loop axis that maps (in the permissive ID graph `graph`) to `vec_axis`, the
    reference's vector split of the row (a trailing broadcast dim may follow it), as wide as
    `vectorize` allows; returns the width (1: left element-wise). A tensor without such an axis
    is left alone: e.g. a row statistic [M] scheduled like the row has threadIdx.y innermost,
    and vectorizing that axis would make one thread write the rows that other threads hold."""
    pos = next((k for k, i in enumerate(tv.domain.loop) if graph.mapped(i, vec_axis)), None)
    if pos is None or not all(i.is_broadcast for i in tv.domain.loop[pos + 1:]):
        return 1
    return vectorize(tv, pos, width)


def reduced_and_kept(red, reduced_positions, info: RuntimeInfo) -> tuple[int, int]:
    """(product of the reduced extents, product of the kept extents) of reduction `red`."""
    n, m = 1, 1
    for k, i in enumerate(red.domain.maybe_root):
        e = 1 if i.is_broadcast else info.extent(i.extent)
        if k in reduced_positions:
            n *= e
        else:
            m *= e
    return n, m


def ops_beside(fusion, allowed: tuple, what: str) -> str | None:
    """Why the `what` kernel (a scan, a top-k: element-wise ops around one kind of op) refuses
    a fusion with ops not in `allowed`, or None."""
    other = sorted({type(e).__name__ for e in fusion.exprs() if not isinstance(e, allowed)})
    if not other:
        return None
    return (f"ops beside the {what} that the {what} kernel does not compute: "
            f"{', '.join(other)} (element-wise ops only)")


def strided_along(fusion, row_id, graph, tensors: list, dim_name: str, op_name: str) -> str | None:
    """Why a kernel that holds rows along `row_id` contiguously refuses a fusion whose input or
    output among `tensors` (fusion.inputs, then fusion.outputs) is laid out along another dim,
    or None."""
    n_in = len(fusion.inputs)
    for k, v in enumerate(tensors):
        if not isinstance(v, TensorView):
            continue
        d = mapped_dim(v, row_id, graph)
        if d is not None and v.domain.contiguous_dim is not v.domain.logical[d]:
            what = f"input {k}" if k < n_in else f"output {k - n_in}"
            return (f"{what} is not laid out along the {dim_name} (its stride-1 dim is another): "
                    f"a strided {op_name} is left to the library op")
    return None


def chunked_row_shape(vectors: int, per_thread: int, max_threads: int, rows: int,
                      max_block_threads: int) -> tuple[int, int, int]:
    """(P, Tx, Ty) of a row of `vectors` vectors held a contiguous chunk per thread
    (schedule_rows_in_chunks): at most `per_thread` vectors a thread while `max_threads` threads
    suffice, else as many more as the row needs; Tx the thread loop's ceilDiv(vectors, P)
    iterations in whole warps (warp-wide steps take full warps; the extra threads hold
    nothing); Ty rows stacked along threadIdx.y, doubling while a block stays within
    `max_block_threads` threads and `rows` rows (1: one row per block)."""
    threads = min(max_threads, -(-vectors // per_thread))
    p = -(-vectors // threads)
    bdimx = -(-(-(-vectors // p)) // 32) * 32
    bdimy = 1
    while bdimx * bdimy * 2 <= max_block_threads and bdimy * 2 <= rows:
        bdimy *= 2
    return p, bdimx, bdimy


def schedule_rows_in_chunks(tv: TensorView, vector: int, per_thread: int, bdimx: int,
                            bdimy: int, row_blocks: int = 1, block_elements: int = 0,
                            striped: bool = False) -> None:
    """The loops of the schedulers that hold rows in registers, a thread a chunk (scan, top-k):
    [rows..., N] -> [M / By (blockIdx.x), By (threadIdx.y), C (blockIdx.y), T (threadIdx.x), P,
    V], a thread's chunk of P x V elements contiguous in the row (blocked); with `striped`,
    [.., C, P, T, V], the threads of a p at consecutive vectors (the global side of a row
    staged through shared memory). Rows merged (rank 1: no row loops); C (the blocks of a row
    along blockIdx.y, each `block_elements` of it) only when `row_blocks` > 1."""
    while len(tv.domain.loop) > 2:
        tv.merge(0, 1)
    r = len(tv.domain.loop) - 1           # position of N: 0 or 1
    c = 1 if row_blocks > 1 else 0
    if c:
        tv.split(r, block_elements)       # [.., C, B]
    tv.split(r + c, vector)               # [.., C, B / V, V]
    tv.split(r + c, bdimx if striped else per_thread)
    if r:
        tv.split(0, bdimy)                # [M / By, By, ...]
        tv.parallelize(0, ParallelType.BIDx).parallelize(1, ParallelType.TIDy)
    pos = 2 if r else 0
    if c:
        tv.parallelize(pos, ParallelType.BIDy)
    tv.parallelize(pos + c + (1 if striped else 0), ParallelType.TIDx)

"""Builders of tensor expressions: each creates the output TensorView with its domains.

These functions trust their callers on types (the frontend promotes and checks); they check
shapes, because only they know how domains line up.
"""
from __future__ import annotations

from . import scalar as S
from .base import current_fusion, next_name
from .dtype import DataType
from .exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, GatherOp, IotaOp,
                    IndexCheckOp, LinearOp, RandOp, ScanOp, ScatterOp, TopKOp,
                    LoadKind, LoadStoreOp, MatmulOp, ReductionOp, ReductionOpType, ReshapeOp,
                    SegmentSetOp, SqueezeOp, UnaryOp, UnaryOpType, WhereOp, WindowOp)
from .iter_domain import IterDomain, IterType, merge_ids, split_id
from .tensor import MemoryType, TensorDomain, TensorView


class ShapeError(ValueError):
    pass


def symbolic_extent(fusion=None) -> S.Scalar:
    fusion = fusion or current_fusion()
    n = next_name("i", fusion)
    return S.Scalar(DataType.Int, fusion=fusion, symbol=f"i{n}")


def new_tensor(logical: list[IterDomain], dtype: DataType, root=None) -> TensorView:
    return TensorView(TensorDomain(logical, root=root), dtype, MemoryType.Local)


def input_tensor(sizes, dtype: DataType, contiguity=None, stride_order=None,
                 expanded=None) -> TensorView:
    """A tensor with `sizes` (None/-1 symbolic, 1 broadcast, else a static extent).

    stride_order[k] is the stride rank of logical dim k (rank-1 outermost, 0 innermost), as in
    nvFuser; contiguity lists the allocation dims outer to inner.
    `expanded[k]` marks a broadcast dim of stride 0 whose size is symbolic.
    """
    ids = []
    for k, s in enumerate(sizes):
        if expanded is not None and expanded[k]:
            ids.append(IterDomain(1, IterType.Broadcast, expanded_extent=symbolic_extent()))
        elif s is None or s == -1:
            ids.append(IterDomain(symbolic_extent()))
        elif s == 1:
            ids.append(IterDomain(1, IterType.Broadcast))
        elif isinstance(s, int) and s > 1:
            ids.append(IterDomain(s))
        else:
            raise ShapeError(f"define_tensor: size {s!r} of dim {k} must be -1, 1 or a positive int")
    allocation = None
    if stride_order is not None:
        n = len(ids)
        if sorted(stride_order) != list(range(n)):
            raise ShapeError(f"define_tensor: stride_order {list(stride_order)} is not a "
                             f"permutation of 0..{n - 1}")
        by_rank = sorted(range(n), key=lambda k: -stride_order[k])
        if by_rank != list(range(n)):
            allocation = [ids[k] for k in by_rank]
    alloc = allocation or ids
    if contiguity is None:
        contiguity = [True] * len(ids)
    if len(contiguity) != len(ids):
        raise ShapeError(f"define_tensor: {len(contiguity)} contiguity flags for {len(ids)} dims")
    contiguity = [None if i.is_broadcast else bool(c) if c is not None else True
                  for i, c in zip(alloc, contiguity)]
    tv = TensorView(TensorDomain(ids, allocation=allocation, contiguity=contiguity), dtype,
                    MemoryType.Global)
    return tv


def _unify_extents(ids: list[IterDomain], what: str, dim: int) -> IterDomain:
    """The output ID of a pointwise dim: broadcast only if every input is broadcast."""
    concrete = [i for i in ids if not i.is_broadcast]
    fusion = current_fusion()
    if not concrete:
        expanded = next((i.expanded_extent for i in ids if i.expanded_extent is not None), None)
        return IterDomain(1, IterType.Broadcast, expanded_extent=expanded)
    first = concrete[0]
    for other in concrete[1:]:
        a, b = first.extent.value, other.extent.value
        if a is not None and b is not None and a != b:
            raise ShapeError(f"{what}: dim {dim} has sizes {a} and {b}, which do not broadcast")
        if not S.same_value(first.extent, other.extent) and fusion is not None:
            fusion.extent_equalities.append((first.extent, other.extent, f"{what} dim {dim}"))
    for i in ids:
        if i.is_broadcast and i.expanded_extent is not None and fusion is not None:
            if not S.same_value(i.expanded_extent, first.extent):
                fusion.extent_equalities.append((i.expanded_extent, first.extent,
                                                 f"{what} dim {dim} (expanded)"))
    extent = first.extent
    if extent.value is None:
        # Prefer a constant extent if any operand knows it.
        extent = next((i.extent for i in concrete if i.extent.value is not None), extent)
    return IterDomain(extent, IterType.Iteration)


def pointwise_output(what: str, operands: list, dtype: DataType) -> TensorView:
    tvs = [t for t in operands if isinstance(t, TensorView)]
    doms = [t.domain.logical_no_reductions for t in tvs]
    rank = len(doms[0])
    for t, d in zip(tvs, doms):
        if len(d) != rank:
            raise ShapeError(f"{what}: operands of rank {rank} and {len(d)} (T{t.name}); "
                             "broadcast them to one rank first")
    out_ids = [_unify_extents([d[k] for d in doms], what, k) for k in range(rank)]
    return new_tensor(out_ids, dtype)


def unary(op: UnaryOpType, x: TensorView, dtype: DataType) -> TensorView:
    out = pointwise_output(op.value, [x], dtype)
    UnaryOp(op, out, x)
    return out


def binary(op: BinaryOpType, a, b, dtype: DataType):
    if not isinstance(a, TensorView) and not isinstance(b, TensorView):
        out = S.Scalar(dtype)
        BinaryOp(op, out, a, b)
        return out
    out = pointwise_output(op.value, [a, b], dtype)
    BinaryOp(op, out, a, b)
    return out


def where(cond, a, b, dtype: DataType):
    out = pointwise_output("where", [cond, a, b], dtype)
    WhereOp(out, cond, a, b)
    return out


def set_op(x: TensorView, load_kind: LoadKind = LoadKind.Set, dtype: DataType | None = None) -> TensorView:
    out = pointwise_output("set", [x], dtype or x.dtype)
    LoadStoreOp(out, x, load_kind)
    return out


def segment_set(x: TensorView) -> TensorView:
    out = pointwise_output("segment_set", [x], x.dtype)
    SegmentSetOp(out, x)
    return out


def permute(x: TensorView, dims: list[int]) -> TensorView:
    src = x.domain.logical_no_reductions
    root = [i.clone() for i in src]
    out = TensorView(TensorDomain([root[d] for d in dims], root=root), x.dtype)
    LoadStoreOp(out, x)
    return out


def broadcast(x: TensorView, is_broadcast_dim: list[bool]) -> TensorView:
    src = iter(x.domain.logical_no_reductions)
    n_kept = sum(1 for f in is_broadcast_dim if not f)
    if n_kept != len(x.domain.logical_no_reductions):
        raise ShapeError(f"broadcast: {len(is_broadcast_dim)} flags keep {n_kept} dims but "
                         f"T{x.name} has {len(x.domain.logical_no_reductions)}")
    ids = [IterDomain(1, IterType.Broadcast) if f else next(src).clone() for f in is_broadcast_dim]
    out = new_tensor(ids, x.dtype)
    BroadcastOp(out, x, is_broadcast_dim)
    return out


def expand(x: TensorView, sizes: list) -> TensorView:
    src = x.domain.logical_no_reductions
    if len(sizes) != len(src):
        raise ShapeError(f"expand: {len(sizes)} sizes for T{x.name} of rank {len(src)}")
    ids = []
    for k, (i, s) in enumerate(zip(src, sizes)):
        keep = s is None or (isinstance(s, int) and s == -1)
        if i.is_broadcast and not keep:
            sv = S.as_scalar(s, DataType.Int)
            if sv.value == 1:
                ids.append(IterDomain(1, IterType.Broadcast))
            else:
                ids.append(IterDomain(1, IterType.Broadcast, expanded_extent=sv))
        else:
            if not keep and not i.is_broadcast:
                sv = S.const_value(s)
                if sv is not None and i.extent.value is not None and sv != i.extent.value:
                    raise ShapeError(f"expand: dim {k} of T{x.name} has size {i.extent.value}, "
                                     f"not 1, and cannot expand to {sv}")
            ids.append(i.clone())
    out = new_tensor(ids, x.dtype)
    ExpandOp(out, x)
    return out


def squeeze(x: TensorView, dims: list[int], reduction=None) -> TensorView:
    """Drop size-1 dims. With `reduction` (a ReductionOpType), expanded dims (stride 0: copies
    of one element) may be dropped too, keeping their one element: the squeeze stands for
    that reduction over them (SqueezeOp.reduction)."""
    src = x.domain.logical_no_reductions
    flags = [False] * len(src)
    for d in dims:
        dd = d + len(src) if d < 0 else d
        if not 0 <= dd < len(src):
            raise ShapeError(f"squeeze: dim {d} out of range for T{x.name} of rank {len(src)}")
        size_one = src[dd].is_broadcast and (src[dd].expanded_extent is None or reduction)
        if not size_one and src[dd].extent.value != 1:
            raise ShapeError(f"squeeze: dim {d} of T{x.name} has size {src[dd].user_extent!r}, not 1")
        flags[dd] = True
    out = new_tensor([i.clone() for i, f in zip(src, flags) if not f], x.dtype)
    SqueezeOp(out, x, flags, reduction)
    return out


def reduction(op: ReductionOpType, x: TensorView, axes: list[int], dtype: DataType,
              init) -> TensorView:
    src = x.domain.logical_no_reductions
    n = len(src)
    norm = sorted({a + n if a < 0 else a for a in axes})
    for a in norm:
        if not 0 <= a < n:
            raise ShapeError(f"{op.value}: axis out of range for T{x.name} of rank {n}: {axes}")
    ids = []
    for k, i in enumerate(src):
        if k in norm:
            ids.append(IterDomain(i.maybe_expanded_extent, IterType.Reduction))
        else:
            ids.append(i.clone())
    out = new_tensor(ids, dtype)
    ReductionOp(op, out, x, S.as_scalar(init, dtype))
    return out


def _shape_ids(sizes: list) -> list[IterDomain]:
    """The IDs of a new tensor of `sizes` (ints or int scalars): a size of 1 is a broadcast."""
    ids = []
    for s in sizes:
        sv = S.as_scalar(s, DataType.Int)
        ids.append(IterDomain(1, IterType.Broadcast) if sv.value == 1 else IterDomain(sv))
    return ids


def full(sizes: list, value, dtype: DataType) -> TensorView:
    out = new_tensor(_shape_ids(sizes), dtype)
    FullOp(out, S.as_scalar(value, dtype) if not isinstance(value, S.Scalar) else value)
    return out


def rand(sizes: list, dist: str, a, b, seed, offset, dtype: DataType) -> TensorView:
    """RandOp of shape `sizes` (ints or int scalars; 1 is a broadcast dim), the fusion's next
    random stream."""
    out = new_tensor(_shape_ids(sizes), dtype)
    stream = next_name("random stream")
    RandOp(out, S.as_scalar(seed, DataType.Int), S.as_scalar(offset, DataType.Int),
           *(v if isinstance(v, S.Scalar) else S.as_scalar(v, DataType.Double) for v in (a, b)),
           dist, stream)
    return out


def iota(length, start, step, dtype: DataType) -> TensorView:
    n = S.as_scalar(length, DataType.Int)
    out = new_tensor([IterDomain(1, IterType.Broadcast) if n.value == 1 else IterDomain(n)], dtype)
    IotaOp(out, *(v if isinstance(v, S.Scalar) else S.as_scalar(v, dtype) for v in (start, step)))
    return out


def window(src: TensorView, windows: list, extents: list, fill) -> TensorView:
    """WindowOp: out dim k has extents[k] where windows[k] is a DimWindow, else src's dim k."""
    ids = []
    for i, w, n in zip(src.domain.logical_no_reductions, windows, extents):
        if w is None:
            ids.append(i.clone())
        else:
            n = S.as_scalar(n, DataType.Int)
            ids.append(IterDomain(1, IterType.Broadcast) if n.value == 1 else IterDomain(n))
    out = new_tensor(ids, src.dtype)
    WindowOp(out, src, windows, fill if isinstance(fill, S.Scalar) else S.as_scalar(fill, src.dtype))
    return out


def scan(x: TensorView, dim: int, op: str, dtype: DataType) -> TensorView:
    """ScanOp: x's dims (cloned), `dtype`."""
    out = new_tensor([i.clone() for i in x.domain.logical_no_reductions], dtype)
    ScanOp(out, x, dim, op)
    return out


def topk(x: TensorView, k, dim: int, largest: bool, sorted: bool) -> tuple:
    """TopKOp: (values, indices), x's dims with k along `dim` (an int or an int scalar)."""
    kk = S.as_scalar(k, DataType.Int)

    def ids():
        return [_shape_ids([kk])[0] if d == dim else i.clone()
                for d, i in enumerate(x.domain.logical_no_reductions)]
    values, indices = new_tensor(ids(), x.dtype), new_tensor(ids(), DataType.Int)
    TopKOp(values, indices, x, kk, dim, largest, sorted)
    return values, indices


def gather(what: str, src: TensorView, index: TensorView, dim: int, src_dims,
           broadcast: bool) -> TensorView:
    """GatherOp: out has index's rank; out dim k is index's dim k (an expanded one: its
    expanded size, iterated), except that with `broadcast` (take_along_axis, index_select) a
    broadcast dim of the index takes src's dim along it. Where index and src both iterate a dim
    out reads src at, the sizes must agree: equal with `broadcast`, index's at most src's
    without it (torch.gather); checked on every call where they are symbolic. The src dims out
    iterates with the same extent are paired with out's in the ID graph (GatherOp.dim_map)."""
    s_ids, i_ids = src.domain.logical_no_reductions, index.domain.logical_no_reductions
    fusion = current_fusion()
    ids = [IterDomain(i.expanded_extent) if i.expanded_extent is not None else i.clone()
           for i in i_ids]
    pairs = []
    for d, k in enumerate(src_dims):
        if k is None:
            continue
        si, ii = s_ids[d], i_ids[k]
        if ii.is_broadcast and ii.expanded_extent is None:
            if broadcast:
                ids[k] = si.clone()
                if not si.is_broadcast:
                    pairs.append((d, k))
            continue
        if si.is_broadcast and si.expanded_extent is None and broadcast:
            continue        # src of size 1 along it: every index reads its one element
        a, b = ids[k].extent, si.user_extent
        av, bv = S.const_value(a), S.const_value(b)
        if av is not None and bv is not None and (av != bv if broadcast else av > bv):
            rule = "equal" if broadcast else "at most"
            raise ShapeError(f"{what}: the index's dim {k} has size {av}, the input's dim {d} "
                             f"{bv}; they must be {rule}")
        if fusion is not None and not S.same_value(a, b):
            where = f"{what}: the index's dim {k} and the input's dim {d}"
            if broadcast:
                fusion.extent_equalities.append((a, b, where))
            else:
                fusion.extent_limits.append((a, b, where + (
                    " (as torch.gather, the index may not be larger than the input along a dim "
                    "it does not index)")))
        if not si.is_broadcast and (broadcast or S.same_value(a, b)):
            pairs.append((d, k))
    out = new_tensor(ids, src.dtype)
    GatherOp(out, src, index, dim, src_dims, what, pairs)
    return out


def check_index(index: TensorView, extent, what: str, dim: int) -> TensorView:
    """IndexCheckOp: index itself, checked against [0, extent) in the kernel that computes it."""
    out = pointwise_output(what, [index], index.dtype)
    IndexCheckOp(out, index, S.as_scalar(extent, DataType.Int), what, dim)
    return out


def scatter(what: str, target: TensorView, x: TensorView | None, index: TensorView,
            src: TensorView, dim: int, op: str, dtype: DataType, exact: bool) -> TensorView:
    """ScatterOp of `src` into `x` (None: zeros) at `index` along `dim`; out has `target`'s
    shape (x's, or the zeros' the frontend did not make) and `dtype`. index, src and target
    have one rank. The op's iteration (out's root) is index's shape, src's where index is a
    broadcast; src's sizes must equal it there (checked on every call where symbolic), and
    so must the target's along the other dims (`exact`: index_add), or be at least it
    (torch.scatter_add)."""
    t_ids, i_ids = target.domain.logical_no_reductions, index.domain.logical_no_reductions
    s_ids = src.domain.logical_no_reductions
    if not len(t_ids) == len(i_ids) == len(s_ids):
        raise ShapeError(f"{what}: the input, index and source have ranks {len(t_ids)}, "
                         f"{len(i_ids)} and {len(s_ids)}; they must have one rank")
    fusion = current_fusion()

    def iteration(i: IterDomain) -> IterDomain:
        if i.expanded_extent is not None:
            return IterDomain(i.expanded_extent)
        return i.clone()

    root = []
    for k, (ii, si) in enumerate(zip(i_ids, s_ids)):
        it = iteration(ii) if not (ii.is_broadcast and ii.expanded_extent is None) else \
            iteration(si)
        root.append(it)
        if not (ii.is_broadcast and ii.expanded_extent is None):
            a, b = it.extent, si.user_extent
            if si.is_broadcast and si.expanded_extent is None:
                b = S.as_scalar(1, DataType.Int)
            _check_size(fusion, what, a, b, True, f"the index's dim {k} and the source's dim {k}")
    for k, (it, ti) in enumerate(zip(root, t_ids)):
        if k == dim or (it.is_broadcast and it.expanded_extent is None):
            continue
        b = ti.expanded_extent if ti.expanded_extent is not None else ti.user_extent
        _check_size(fusion, what, it.extent, b, exact,
                    f"the {'source' if exact else 'index'}'s dim {k} and the input's dim {k}")
    logical = [IterDomain(1, IterType.Broadcast) if i.is_broadcast and i.expanded_extent is None
               else IterDomain(i.expanded_extent if i.expanded_extent is not None else i.extent)
               for i in t_ids]
    out = TensorView(TensorDomain(logical, root=root, loop=list(root)), dtype, MemoryType.Local)
    ScatterOp(out, x, index, src, dim, op, what)
    return out


def _check_size(fusion, what: str, a, b, equal: bool, which: str) -> None:
    """Sizes a, b of two dims: equal (`equal`), else a at most b; constants here, symbolic
    ones on every call (Fusion.extent_equalities, extent_limits)."""
    av, bv = S.const_value(a), S.const_value(b)
    if av is not None and bv is not None:
        if av != bv if equal else av > bv:
            raise ShapeError(f"{what}: {which} have sizes {av} and {bv}; they must be "
                             f"{'equal' if equal else 'at most'}")
        return
    if fusion is None or S.same_value(a, b):
        return
    if equal:
        fusion.extent_equalities.append((a, b, f"{what}: {which}"))
    else:
        fusion.extent_limits.append((a, b, f"{what}: {which}"))


def reshape(x: TensorView, new_sizes: list) -> TensorView:
    """Reshape as row-major flattening: out root (a copy of x's logical) is merged into one ID and
    split into the new sizes; one size may be -1.

    An expanded broadcast of x (stride 0, size E) becomes an iteration ID of extent E in out's
    root: merged into the flat ID it contributes E elements, each reading x's one element along
    it (the producer/consumer pair is a broadcast concretized, as in `add(x [N, 1 ex M], y [N,
    M])`). Kept a broadcast, the merge would count it as extent 1."""
    src = x.domain.logical_no_reductions
    root = [IterDomain(i.expanded_extent, IterType.Iteration) if i.expanded_extent is not None
            else i.clone() for i in src]
    sizes = list(new_sizes)
    if sum(1 for s in sizes if isinstance(s, int) and s == -1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {new_sizes}")
    total = S.product(i.maybe_expanded_extent for i in src)
    known = S.product(s for s in sizes if not (isinstance(s, int) and s == -1))
    tv, kt = total.value, known.value
    if tv is not None and kt is not None and -1 not in sizes and tv != kt:
        raise ShapeError(f"reshape: T{x.name} has {tv} elements, shape {new_sizes} has {kt}")
    if tv is not None and kt is not None and -1 in sizes and (kt == 0 or tv % kt):
        raise ShapeError(f"reshape: {tv} elements do not fill shape {new_sizes}")
    if not root:
        flat = IterDomain(1, IterType.Broadcast)
    else:
        flat = root[0]
        for i in root[1:]:
            flat = merge_ids(flat, i)
    if -1 in sizes:
        neg = sizes.index(-1)
    else:
        # The dim the splits leave over gets a derived extent (ceilDiv of the element count by
        # the other sizes), equal to its size only by the run-time element count check. A
        # static 1 there would be an iteration dim of symbolic extent, which broadcasts
        # nowhere (a reshape to [1, 4, 128] ANDed with a [1, 4, 1, 128]: fuzz 20261204:4628).
        # So the leftover is the first dim not statically 1: every size-1 dim is then a split
        # of factor 1, of static extent 1 in each replay of the transforms, and a broadcast.
        neg = next((k for k, s in enumerate(sizes)
                    if S.as_scalar(s, DataType.Int).value != 1), 0)
    # Inner splits peel the dims right of the -1 (or of the leftover dim), outer splits those left
    # of it.
    logical: list = [None] * len(sizes)
    cur = flat
    for k in range(len(sizes) - 1, neg, -1):
        cur, inner = split_id(cur, sizes[k], inner_split=True)
        logical[k] = inner
    for k in range(0, neg):
        outer, cur = split_id(cur, sizes[k], inner_split=False)
        logical[k] = outer
    logical[neg] = cur
    for k, i in enumerate(logical):
        if i.extent.value == 1 and not i.is_broadcast:
            i.iter_type = IterType.Broadcast
    fusion = current_fusion()
    if fusion is not None and -1 not in sizes and not S.same_value(total, known):
        fusion.extent_equalities.append((total, known, "reshape element count"))
    elif fusion is not None and -1 in sizes:
        # The -1 dim is ceilDiv(total, known): the shape holds the elements only when known
        # divides total (else the kernel would read past the input's last element).
        whole = S.product(i.extent for i in logical)
        if not S.same_value(total, whole):
            fusion.extent_equalities.append((total, whole, "reshape element count"))
    out = TensorView(TensorDomain(logical, root=root), x.dtype)
    ReshapeOp(out, x)
    return out


def _require_same_size(x: IterDomain, y: IterDomain, what: str) -> None:
    """Two dims an op needs of one size (a contraction's K): a static mismatch is an error now,
    a symbolic one a runtime check (Fusion.extent_equalities)."""
    ex, ey = x.user_extent, y.user_extent
    a, b = ex.value, ey.value
    if a is not None and b is not None and a != b:
        raise ShapeError(f"{what}: sizes {a} and {b} differ")
    fusion = current_fusion()
    if fusion is not None and not S.same_value(ex, ey):
        fusion.extent_equalities.append((ex, ey, what))


def _library_output_id(ids: list[IterDomain], what: str, dim: int) -> IterDomain:
    """An output dim of a library op (matmul, linear), from the operand dims it iterates. The
    library writes a dense result: a dim that is an expanded broadcast in every operand (stride
    0) is a dim of that many elements in the output, not a stride-0 one."""
    i = _unify_extents(ids, what, dim)
    if i.is_broadcast and i.expanded_extent is not None:
        return IterDomain(i.expanded_extent, IterType.Iteration)
    return i


def matmul(a: TensorView, b: TensorView) -> TensorView:
    """a @ b with torch.matmul's shape rules (the frontend checks dtypes and ranks >= 1)."""
    da, db = a.domain.logical_no_reductions, b.domain.logical_no_reductions
    kb = len(db) - 2 if len(db) > 1 else 0
    _require_same_size(da[-1], db[kb], f"matmul: K (dim {len(da) - 1} of T{a.name}, dim {kb} "
                                       f"of T{b.name})")
    a_batch, b_batch = len(da) - 2, len(db) - 2          # negative: no batch dims
    nb = max(a_batch, b_batch, 0)
    out_ids: list = []
    map_a: list = []
    map_b: list = []
    for j in range(nb):
        ja, jb = j - (nb - a_batch), j - (nb - b_batch)
        ids = []
        if ja >= 0:
            ids.append(da[ja])
            map_a.append((ja, j))
        if jb >= 0:
            ids.append(db[jb])
            map_b.append((jb, j))
        out_ids.append(_library_output_id(ids, "matmul batch", j))
    if len(da) > 1:
        map_a.append((len(da) - 2, len(out_ids)))
        out_ids.append(_library_output_id([da[-2]], "matmul M", len(out_ids)))
    if len(db) > 1:
        map_b.append((len(db) - 1, len(out_ids)))
        out_ids.append(_library_output_id([db[-1]], "matmul N", len(out_ids)))
    out = new_tensor(out_ids, a.dtype)
    MatmulOp(out, a, b, (map_a, map_b))
    return out


def linear(x: TensorView, w: TensorView, bias: TensorView | None) -> TensorView:
    """x @ w^T (+ bias) with torch.nn.functional.linear's shape rules: x [..., K], w [N, K],
    bias [N] (the frontend checks dtypes and ranks)."""
    dx, dw = x.domain.logical_no_reductions, w.domain.logical_no_reductions
    _require_same_size(dx[-1], dw[1], f"linear: K (dim {len(dx) - 1} of T{x.name}, dim 1 of "
                                      f"T{w.name})")
    out_ids = [_library_output_id([i], "linear", k) for k, i in enumerate(dx[:-1])]
    map_x = [(k, k) for k in range(len(dx) - 1)]
    n = len(out_ids)
    n_ids = [dw[0]]
    map_bias = []
    if bias is not None:
        n_ids.append(bias.domain.logical_no_reductions[0])
        map_bias.append((0, n))
    out_ids.append(_library_output_id(n_ids, "linear N", n))
    out = new_tensor(out_ids, x.dtype)
    dim_map = [map_x, [(0, n)]] + ([map_bias] if bias is not None else [])
    LinearOp(out, x, w, bias, dim_map)
    return out

"""Checking runtime inputs against a fusion's definition.

Every mismatch raises InputError naming the input and the difference, before anything runs.
The check also yields the values of the symbolic extents (i0, i1, ...) that kernels and the
reference evaluator need.
"""
from __future__ import annotations

import torch

from ..ir import scalar as S
from ..ir.dtype import from_torch, to_torch
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView


class InputError(ValueError):
    pass


def _name(k: int, v) -> str:
    return f"input {k} (T{v.name})" if isinstance(v, TensorView) else f"input {k} (scalar {v.symbol or v.name})"


def not_a_list(fusion, inputs) -> InputError:
    """The error for `inputs` that are not a list or tuple. A tensor would be iterated by rows
    (a rank-1 fusion given a [1, 4] tensor would run on its row 0), a generator consumed by a
    first pass: neither is taken."""
    import types
    n = len(fusion.inputs)
    names = ", ".join(f"T{v.name}" if isinstance(v, TensorView) else f"scalar {v.symbol or v.name}"
                      for v in fusion.inputs)
    example = "fd.execute([" + ", ".join(f"x{k}" for k in range(n)) + "])"
    if isinstance(inputs, torch.Tensor):
        got = (f"a torch.Tensor of shape {tuple(inputs.shape)} (wrap even a single input in a "
               "list: fd.execute([x]))")
    elif isinstance(inputs, (types.GeneratorType, map, filter, zip)) or (
            hasattr(inputs, "__next__") and hasattr(inputs, "__iter__")):
        got = f"an iterator ({type(inputs).__name__}); pass list(...) of it"
    else:
        got = f"a {type(inputs).__name__}"
    return InputError(f"inputs must be a list or tuple of the fusion's {n} input"
                      f"{'s' if n != 1 else ''} ({names}), in order, e.g. {example}; got {got}")


def check_inputs(fusion, inputs) -> dict:
    """Validate `inputs` (a list or tuple) and return the bindings Scalar -> int of every
    symbolic extent."""
    if not isinstance(inputs, (list, tuple)):
        raise not_a_list(fusion, inputs)
    if len(inputs) != len(fusion.inputs):
        k = min(len(inputs), len(fusion.inputs))
        what = (f"{_name(k, fusion.inputs[k])} is missing" if len(inputs) < len(fusion.inputs)
                else f"input {k} and after are extra")
        raise InputError(f"the fusion takes {len(fusion.inputs)} inputs, got {len(inputs)}: {what}")
    bindings: dict = {}
    device = None
    for k, (v, x) in enumerate(zip(fusion.inputs, inputs)):
        if isinstance(v, Scalar):
            _check_scalar(k, v, x)
            bindings[v] = x
            continue
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{_name(k, v)} must be a torch.Tensor, got {type(x).__name__}")
        if device is None:
            device = x.device
        elif x.device != device:
            raise InputError(f"{_name(k, v)} is on {x.device} but input 0 is on {device}; "
                             "all tensors must be on one device")
        check_tensor(k, v, x, bindings)
    for a, b, where in fusion.extent_equalities:
        va, vb = S.evaluate(a, bindings), S.evaluate(b, bindings)
        if va != vb:
            raise InputError(_mismatch(fusion, where, a, va, b, vb, bindings))
    for a, b, where in fusion.extent_limits:
        va, vb = S.evaluate(a, bindings), S.evaluate(b, bindings)
        if va > vb:
            raise InputError(f"sizes do not fit at {where}: {va} > {vb}")
    if 0 in bindings.values():
        _check_empty_reductions(fusion, bindings)
    return bindings


def _mismatch(fusion, where: str, a, va, b, vb, bindings: dict) -> str:
    """Two extents an op requires equal differ: what differs, and how to define a broadcast.
    pyfuser decides broadcasts when the fusion is defined, not from run-time sizes: a dim
    defined -1 never broadcasts, even where torch would broadcast it (size 1)."""
    sources = _extent_sources(fusion)
    origins = {e: f"{_name(k, v)} dim {d}" for e, (k, v, d) in sources.items()}
    msg = (f"sizes do not match at {where}: {_describe(a, va, origins)} but "
           f"{_describe(b, vb, origins)}")
    if where.startswith("reshape"):
        return f"{msg}: the new shape does not hold the input's elements (as torch.reshape)"
    one = a if va == 1 else b if vb == 1 else None
    if one is not None and one in sources:
        k, v, d = sources[one]
        shape = _defined_shape(v)
        shape[d] = 1
        return (f"{msg}. {_name(k, v)} dim {d} was defined with size -1, so it does not broadcast "
                "at run time as torch would broadcast a dim of size 1; define it as a broadcast "
                f"dim: shape={shape} in define_tensor (or fd.from_pytorch of a tensor of that "
                "shape), or make the broadcast in the fusion with fd.ops.broadcast_in_dim")
    hint = ""
    if a in sources and b in sources:
        # A rank-1 input lined up with the last dim of a wider one, whose size matches another
        # dim of it (a [4] bias against [4, 5] rows): name the broadcast_in_dim that places it.
        for (k, v, _), (_, w, _) in ((sources[a], sources[b]), (sources[b], sources[a])):
            size = bindings.get(v.domain.logical[0].extent) if len(v.domain.logical) == 1 else None
            dims = [c for c, i in enumerate(w.domain.logical)
                    if not i.is_broadcast and S.evaluate(i.extent, bindings) == size]
            if size is not None and len(w.domain.logical) > 1 and len(dims) == 1:
                hint = (f" (for {_name(k, v)} along dim {dims[0]} of T{w.name}: "
                        f"fd.ops.broadcast_in_dim(T{v.name}, {_defined_shape(w)}, [{dims[0]}]))")
                break
    return (f"{msg}. Operands line up from their last dim, as in torch; a dim broadcasts only "
            "where the definition says so: a dim of size 1 in define_tensor (shape=[..., 1]), "
            "fd.ops.broadcast_in_dim(x, shape, broadcast_dims) to place x's dims among more"
            f"{hint}, or an input defined with expanded=[...] (stride 0)")


def _defined_shape(v: TensorView) -> list:
    """The `shape` define_tensor was given for input `v`: -1 symbolic, 1 broadcast, or the
    static size (an expanded broadcast is -1)."""
    out = []
    for i in v.domain.logical:
        if i.is_broadcast:
            out.append(-1 if i.expanded_extent is not None else 1)
        else:
            out.append(i.extent.value if i.extent.value is not None else -1)
    return out


def _check_empty_reductions(fusion, bindings: dict) -> None:
    """A max or min over a dim of size 0 has no value (no identity element to return): where
    that value reaches an output element, torch raises (`amax(): Expected reduction dim 1 to
    have non-zero size`), and so does pyfuser, instead of returning the -inf / +inf its kernels
    start from. A sum over a dim of size 0 is 0, as in torch."""
    from ..ir.exprs import ReductionOpType, ScatterOp, SqueezeOp
    for e, tv, d, extent in empty_reductions(fusion, bindings):
        if isinstance(e, ScatterOp):
            continue            # nothing added: x, or zeros
        op = e.reduction if isinstance(e, SqueezeOp) else e.op
        if op != ReductionOpType.Sum:
            origins = _extent_origins(fusion)
            raise InputError(
                f"{op.value} over a dim of size 0: T{tv.name} reduces dim {d} of "
                f"T{e.inputs[0].name}, {_describe(extent, 0, origins)}; a {op.value} of no "
                "elements has no value (torch raises here too)")


def empty_reductions(fusion, bindings: dict) -> list:
    """(ReductionOp, its output, dim, extent) for each reduction over a dim of size 0 whose
    result reaches an output element. A value reaches outputs only through tensors with
    elements: the row max of a softmax of [4, 0] rows reduces nothing, but meets only empty
    tensors after it (torch's softmax is an empty tensor too). A scatter of no elements
    (ScatterOp, its iteration's dim d of size 0) counts too: it adds nothing to x or zeros."""
    from ..ir.exprs import ReductionOp, ScatterOp, SqueezeOp

    def has_elements(tv) -> bool:
        return all(S.evaluate(i.maybe_expanded_extent, bindings) != 0
                   for i in tv.domain.logical_no_reductions)

    found = []
    stack = [o for o in fusion.outputs if has_elements(o)]
    seen = set()
    while stack:
        tv = stack.pop()
        e = tv.definition
        if e is None or id(tv) in seen:
            continue
        seen.add(id(tv))
        if isinstance(e, ReductionOp):
            found += [(e, tv, d, i.extent) for d, i in enumerate(tv.domain.maybe_root)
                      if i.is_reduction and S.evaluate(i.extent, bindings) == 0]
        elif isinstance(e, ScatterOp):
            found += [(e, tv, d, i.extent) for d, i in enumerate(tv.domain.root)
                      if S.evaluate(i.maybe_expanded_extent,
                                    bindings) == 0][:1]
        elif isinstance(e, SqueezeOp) and e.reduction is not None:
            # The frontend's reduction over an expanded dim squeezes it (its E copies of one
            # element): with E = 0 there is no element to keep.
            src = e.inputs[0].domain.logical_no_reductions
            found += [(e, tv, d, i.expanded_extent) for d, (i, sq) in
                      enumerate(zip(src, e.is_squeezed)) if sq and i.expanded_extent is not None
                      and S.evaluate(i.expanded_extent, bindings) == 0]
        stack.extend(v for v in e.inputs if isinstance(v, TensorView) and has_elements(v))
    return found


def heuristic_info(fusion, inputs, device_props, alignment: int = 16):
    """(a clone of `fusion` with its roles separated (schedule/roles.py), the RuntimeInfo a
    heuristic reads for `inputs` on `device_props`), the inputs described by their sizes and
    strides with `alignment`-byte data pointers: what `explain` and the forced-heuristic sweeps
    schedule without launching."""
    from ..schedule.roles import scheduling_clone
    from ..schedule.schedulers.base import InputFacts, RuntimeInfo, facts_per_input
    bindings = check_inputs(fusion, inputs)
    clone, mapping = scheduling_clone(fusion)
    cb = {mapping[id(k)]: v for k, v in bindings.items() if id(k) in mapping}
    facts = tuple(InputFacts(tuple(x.shape), tuple(x.stride()), alignment)
                  if isinstance(x, torch.Tensor) else None for x in inputs)
    from .. import options
    return clone, RuntimeInfo(cb, facts_per_input(clone, facts), device_props, options.current())


def _extent_sources(fusion) -> dict:
    """Symbolic extent -> (input k, its TensorView, dim d) where it is first bound."""
    out: dict = {}
    for k, v in enumerate(fusion.inputs):
        if isinstance(v, TensorView):
            for d, i in enumerate(v.domain.logical):
                e = i.expanded_extent if i.is_broadcast else i.extent
                if e is not None and e.value is None and e.definition is None:
                    out.setdefault(e, (k, v, d))
    return out


def _extent_origins(fusion) -> dict:
    """Symbolic extent -> 'input k (Tn) dim d' where it is first bound."""
    return {e: f"{_name(k, v)} dim {d}" for e, (k, v, d) in _extent_sources(fusion).items()}


def _describe(x, value, origins: dict) -> str:
    text = f"{S.scalar_str(x)} = {value}"
    srcs = [origins[i] for i in S.symbolic_inputs(x) if i in origins]
    return f"{text} ({', '.join(srcs)})" if srcs else text


def _check_scalar(k: int, v: Scalar, x) -> None:
    ok = (isinstance(x, (bool, int, float)) if v.dtype.is_floating else
          isinstance(x, (bool, int)) if v.dtype.is_integral else isinstance(x, bool))
    if not ok:
        raise InputError(f"{_name(k, v)} must be a Python {v.dtype.short_name} number, "
                         f"got {type(x).__name__}")


def check_tensor(k: int, v: TensorView, x: torch.Tensor, bindings: dict) -> None:
    name = _name(k, v)
    try:
        dt = from_torch(x.dtype)
    except TypeError:
        dt = None
    if dt != v.dtype:
        raise InputError(f"{name} has dtype {x.dtype}, the definition says {to_torch(v.dtype)}")
    logical = v.domain.logical
    if x.dim() != len(logical):
        raise InputError(f"{name} has {x.dim()} dims, the definition says {len(logical)}")
    sizes, strides = x.shape, x.stride()
    # A tensor with a dim of size 0 holds no element: no stride addresses anything, so every
    # layout is valid (torch gives such tensors arbitrary strides, e.g. (1, 1) for [4, 0]).
    empty = 0 in sizes
    for d, (i, size) in enumerate(zip(logical, sizes)):
        if i.is_broadcast:
            if i.expanded_extent is None and size != 1:
                raise InputError(f"{name} dim {d} has size {size}; it was defined as a broadcast "
                                 "dim of size 1")
            if i.expanded_extent is not None:
                if size != 1 and strides[d] != 0 and not empty:
                    raise InputError(f"{name} dim {d} has stride {strides[d]}; it was defined as "
                                     "an expanded broadcast (stride 0)")
                _bind(name, d, i.expanded_extent, size, bindings)
            continue
        _bind(name, d, i.extent, size, bindings)
    if not empty:
        _check_layout(name, v, sizes, strides)


def _bind(name: str, d: int, extent: Scalar, size: int, bindings: dict) -> None:
    if extent.value is not None:
        if extent.value != size:
            raise InputError(f"{name} dim {d} has size {size}, the definition says {extent.value}")
        return
    if extent.definition is not None:
        return
    old = bindings.get(extent)
    if old is not None and old != size:
        raise InputError(f"{name} dim {d} has size {size}, but {extent.symbol} was already "
                         f"bound to {old}")
    bindings[extent] = int(size)


def _check_layout(name: str, v: TensorView, sizes, strides) -> None:
    """Contiguity and stride order, in the definition's allocation order (outer to inner)."""
    logical = v.domain.logical
    alloc = v.domain.maybe_allocation
    pos = [logical.index(i) for i in alloc]
    contig = v.domain.contiguity
    # Dims of size 1 have no meaningful stride; they neither break nor prove an order.
    live = [(k, d) for k, d in enumerate(pos) if sizes[d] != 1 and not alloc[k].is_broadcast]
    if v.domain.allocation is not None:
        for (ka, a), (kb, b) in zip(live, live[1:]):
            if strides[a] < strides[b]:
                raise InputError(
                    f"{name} has strides {tuple(strides)}: dim {a} (stride {strides[a]}) should be "
                    f"outside dim {b} (stride {strides[b]}) by the defined stride order")
    expected_inner = None
    for k in range(len(pos) - 1, -1, -1):
        d = pos[k]
        if alloc[k].is_broadcast:
            continue
        if contig[k]:
            want = 1 if expected_inner is None else expected_inner
            if sizes[d] != 1 and strides[d] != want:
                which = "innermost dim" if expected_inner is None else "dim"
                raise InputError(
                    f"{name} is not contiguous as defined: {which} {d} has stride {strides[d]}, "
                    f"expected {want} (strides {tuple(strides)}, sizes {tuple(sizes)}); define it "
                    "with contiguity False there, or pass .contiguous()")
        stride = strides[d] if sizes[d] != 1 else (expected_inner or 1) if contig[k] else strides[d]
        expected_inner = stride * sizes[d]


def tensor_descriptor(sizes, strides):
    """(shape spec, contiguity in allocation order, stride_order or None, expanded flags) that
    describe a tensor, as `from_pytorch` defines it."""
    n = len(sizes)
    if any(s < 0 for s in strides):
        raise InputError(f"negative strides {tuple(strides)} are not supported")
    if 0 in sizes:
        # No element, so the strides say nothing (torch gives [4, 0] the strides (1, 1)):
        # describe the dense row-major layout, the one torch allocates for these sizes.
        strides = [0] * n
        acc = 1
        for d in range(n - 1, -1, -1):
            strides[d] = acc
            acc *= max(sizes[d], 1)
    is_bcast = [sizes[d] == 1 or strides[d] == 0 for d in range(n)]
    expanded = [strides[d] == 0 and sizes[d] != 1 for d in range(n)]
    # Dense dims in stride order (ties keep logical order); broadcast dims keep their logical
    # slots, since their stride says nothing about where they lie.
    dense = sorted((d for d in range(n) if not is_bcast[d]), key=lambda d: -strides[d])
    it = iter(dense)
    order = [d if is_bcast[d] else next(it) for d in range(n)]
    contiguity = []
    for k, d in enumerate(order):
        if is_bcast[d]:
            contiguity.append(None)
            continue
        inner = next((e for e in order[k + 1:] if not is_bcast[e]), None)
        want = 1 if inner is None else strides[inner] * max(sizes[inner], 1)
        contiguity.append(strides[d] == want)
    stride_order = None
    if order != list(range(n)):
        stride_order = [0] * n
        for k, d in enumerate(order):
            stride_order[d] = n - 1 - k
    shape = [1 if is_bcast[d] and not expanded[d] else -1 for d in range(n)]
    return shape, contiguity, stride_order, expanded


def output_sizes(fusion, bindings: dict) -> list[list[int]]:
    """Each fusion output's sizes (its expanded extents) for a call's bound extents."""
    return [[int(S.evaluate(i.maybe_expanded_extent, dict(bindings)))
             for i in o.domain.logical_no_reductions] for o in fusion.outputs]


def output_strides(v: TensorView, sizes: list[int]) -> list[int]:
    """Strides of a freshly allocated output, dense in its allocation order. An expanded
    broadcast dim (the output of an expand, or of a reduction of an expanded input) has stride
    0, as torch's expand gives: kernels write one element for all its positions."""
    logical = v.domain.logical_no_reductions
    alloc = [i for i in v.domain.maybe_allocation if not i.is_reduction]
    strides = [0] * len(logical)
    acc = 1
    for i in reversed(alloc):
        d = logical.index(i)
        if i.is_broadcast and i.expanded_extent is not None:
            continue
        strides[d] = acc
        acc *= max(sizes[d], 1)
    return strides


def laid_out(fusion, outs) -> list:
    """`outs` (the fusion's outputs as the reference evaluator or a library call returned
    them, in whatever layout torch's ops gave) dense in each output's allocation order, as a
    kernel writes them (output_strides): what the reader of a plan's intermediate declares,
    and what a user gets from a kernel. Outputs already laid out so are returned as they are."""
    laid = []
    for o, r in zip(fusion.outputs, outs):
        assert isinstance(o, TensorView)
        laid.append(lay_out(o, r, to_torch(o.dtype)))
    return laid


def lay_out(o: TensorView, r, dtype):
    """Output `o`'s value `r` as `dtype`, dense in o's allocation order (output_strides); `r`
    itself where it already is."""
    sizes = list(r.shape)
    strides = output_strides(o, sizes)
    if list(r.stride()) == strides and r.dtype == dtype:
        return r
    # An expanded dim (stride 0) holds one element for all its positions.
    stored = [1 if st == 0 else sz for sz, st in zip(sizes, strides)]
    dense = torch.empty_strided(stored, strides, dtype=dtype, device=r.device)
    src = r
    for d, (sz, st) in enumerate(zip(sizes, strides)):
        if st == 0 and sz > 1:
            src = src.narrow(d, 0, 1)
    dense.copy_(src)
    return dense.expand(sizes) if stored != sizes else dense

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


def check_inputs(fusion, inputs) -> dict:
    """Validate `inputs` and return the bindings Scalar -> int of every symbolic extent."""
    inputs = list(inputs)
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
    origins = _extent_origins(fusion)
    for a, b, where in fusion.extent_equalities:
        va, vb = S.evaluate(a, bindings), S.evaluate(b, bindings)
        if va != vb:
            raise InputError(f"sizes do not match at {where}: {_describe(a, va, origins)} but "
                             f"{_describe(b, vb, origins)}")
    return bindings


def heuristic_info(fusion, inputs, device_props, alignment: int = 16):
    """(a clone of `fusion`, the RuntimeInfo a heuristic reads for `inputs` on `device_props`),
    the inputs described by their sizes and strides with `alignment`-byte data pointers: what
    `explain` and the forced-heuristic sweeps schedule without launching."""
    from ..schedule.schedulers.base import InputFacts, RuntimeInfo
    bindings = check_inputs(fusion, inputs)
    clone, mapping = fusion.clone()
    cb = {mapping[id(k)]: v for k, v in bindings.items() if id(k) in mapping}
    facts = tuple(InputFacts(tuple(x.shape), tuple(x.stride()), alignment)
                  if isinstance(x, torch.Tensor) else None for x in inputs)
    return clone, RuntimeInfo(cb, facts, device_props)


def _extent_origins(fusion) -> dict:
    """Symbolic extent -> 'input k (Tn) dim d' where it is first bound."""
    out: dict = {}
    for k, v in enumerate(fusion.inputs):
        if isinstance(v, TensorView):
            for d, i in enumerate(v.domain.logical):
                e = i.expanded_extent if i.is_broadcast else i.extent
                if e is not None and e.value is None and e.definition is None:
                    out.setdefault(e, f"{_name(k, v)} dim {d}")
    return out


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
    for d, (i, size) in enumerate(zip(logical, sizes)):
        if i.is_broadcast:
            if i.expanded_extent is None and size != 1:
                raise InputError(f"{name} dim {d} has size {size}; it was defined as a broadcast "
                                 "dim of size 1")
            if i.expanded_extent is not None:
                if size != 1 and strides[d] != 0:
                    raise InputError(f"{name} dim {d} has stride {strides[d]}; it was defined as "
                                     "an expanded broadcast (stride 0)")
                _bind(name, d, i.expanded_extent, size, bindings)
            continue
        _bind(name, d, i.extent, size, bindings)
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
        want = 1 if inner is None else strides[inner] * sizes[inner]
        contiguity.append(strides[d] == want)
    stride_order = None
    if order != list(range(n)):
        stride_order = [0] * n
        for k, d in enumerate(order):
            stride_order[d] = n - 1 - k
    shape = [1 if is_bcast[d] and not expanded[d] else -1 for d in range(n)]
    return shape, contiguity, stride_order, expanded


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


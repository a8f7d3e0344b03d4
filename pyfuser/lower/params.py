"""Pass `kernel_params`: the kernel's parameters and the names of runtime values.

Before: a Kernel with no parameters.
After:  one pointer per global tensor (inputs, then outputs), one stride per logical dim that
        needs one, one value per symbolic extent (i0, i1, ...) and per scalar input:

    kernel(const bf16* T0, index_t T0_s0, ..., bf16* T5, index_t T5_s0, index_t i0, index_t i1)

The innermost dim of a tensor whose allocation is contiguous there gets stride 1 as a constant,
which lets index arithmetic fold and vector accesses be proven contiguous. Broadcast dims have no
stride (their index is always 0). ctx.names maps each runtime Scalar to its kernel variable;
an extent the fusion requires equal to a constant (checked on every call) maps to that constant.
"""
from __future__ import annotations

from ..ir.scalar import Scalar
from ..ir.tensor import TensorView
from ..kir import nodes as K
from ..kir.verifier import establishes
from .context import LoweringError
from .indexing import scalar_to_kexpr


def _kind_of(dtype) -> str:
    if dtype.is_floating:
        return "double" if dtype.size == 8 else "float"
    if dtype.is_boolean:
        return "bool"
    return "int64"


@establishes()
def kernel_params(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    fusion = kernel.fusion
    ctx.names = {}
    ctx.buffers = {}
    ctx.strides = {}
    params: list[K.Param] = []

    def add_tensor(tv: TensorView, role: str, k: int):
        buf = K.Buffer(f"T{tv.name}", tv.dtype, "global", tv=tv)
        ctx.buffers[tv] = buf
        params.append(K.Param(buf.name, "ptr", (role, k), buf))
        strides = []
        logical = tv.domain.logical_no_reductions
        alloc = [i for i in tv.domain.maybe_allocation if not i.is_reduction]
        contig = [c for i, c in zip(tv.domain.maybe_allocation, tensor_contiguity(tv)) if not i.is_reduction]
        inner_unit = None
        for i, c in reversed(list(zip(alloc, contig))):
            if i.is_broadcast:
                continue
            if c:
                inner_unit = i
            break
        for d, i in enumerate(logical):
            if i.is_broadcast:
                strides.append(K.Const(0))
            elif i is inner_unit:
                strides.append(K.Const(1))
            else:
                v = K.Var(f"{buf.name}_s{d}")
                params.append(K.Param(v.name, "index", ("stride", role, k, d)))
                strides.append(v)
        ctx.strides[tv] = strides

    for k, v in enumerate(fusion.inputs):
        if isinstance(v, TensorView):
            # An alias input (schedule/roles.py) reads the runtime tensor of the input it aliases.
            add_tensor(v, "input", fusion.input_position(v))
        else:
            var = K.Var(f"s{k}", _kind_of(v.dtype))
            ctx.names[v] = var
            params.append(K.Param(var.name, _kind_of(v.dtype), ("scalar", k)))
    for k, v in enumerate(fusion.outputs):
        if v not in ctx.buffers:
            add_tensor(v, "output", k)
    extents = symbolic_extents(fusion)
    for s in extents:
        var = K.Var(s.symbol or f"e{s.name}")
        ctx.names[s] = var
        params.append(K.Param(var.name, "index", ("extent", s)))
    # Extents the fusion requires equal (checked on every call) share one variable, so index
    # math and predicates see one value: a weight of size i2 lines up with rows of size i1.
    for a, b, _ in fusion.extent_equalities:
        if a in ctx.names and b in ctx.names:
            ctx.names[b] = ctx.names[a]
    # A schedule specialized on some extents (fusion.static_extents, set by the scheduler and
    # part of its heuristic, so the kernel is only reused for those values) sees constants.
    static = fusion.static_extents
    for s, value in static.items():
        ctx.names[s] = K.Const(int(value))
    for a, b, _ in fusion.extent_equalities:
        if a in static and b in ctx.names:
            ctx.names[b] = K.Const(int(static[a]))
        if b in static and a in ctx.names:
            ctx.names[a] = K.Const(int(static[b]))
    # An extent the fusion requires equal to a constant (an input's row against the 1024 of a
    # ones([M, 1024]) it is added to) is that constant, here and in what shares its variable.
    changed = True
    while changed:
        changed = False
        for a, b, _ in fusion.extent_equalities:
            for x, y in ((a, b), (b, a)):
                value = y.value if y.value is not None else getattr(ctx.names.get(y), "value", None)
                if x in ctx.names and not isinstance(ctx.names[x], K.Const) and value is not None:
                    old = ctx.names[x]
                    for s, n in list(ctx.names.items()):
                        if n is old:
                            ctx.names[s] = K.Const(int(value))
                    changed = True
    # Extents the schedule needs to be multiples of a width (fusion.extent_multiples): the
    # index math relies on them (lower/indexing.py), the executor checks the runtime ones.
    ctx.extent_multiples = {}
    for s, m in fusion.extent_multiples.items():
        e = scalar_to_kexpr(s, ctx.names)
        if isinstance(e, K.Const) and e.value % m:
            raise LoweringError(f"the schedule needs extent {e.value} to be a multiple of {m}")
        ctx.extent_multiples[repr(e)] = m
    kernel.params = params
    return kernel


def executor_allocated(tv: TensorView) -> bool:
    """An output the executor allocates dense in its allocation order (runtime/inputs.py
    output_strides; an in-place output too: it is copied into its input after the kernel)."""
    return tv.is_output() and tv.definition is not None and not tv.is_input()


def tensor_contiguity(tv: TensorView) -> list:
    """The contiguity of a global tensor's allocation as the kernel sees it: its definition's,
    or dense for an output the executor allocates."""
    if executor_allocated(tv):
        return [None if i.is_broadcast else True for i in tv.domain.maybe_allocation]
    return tv.domain.contiguity


def symbolic_extents(fusion) -> list[Scalar]:
    """Runtime extents (i0, i1, ...) of the fusion's input tensors, in order of appearance."""
    out: list[Scalar] = []
    for v in fusion.inputs:
        if not isinstance(v, TensorView):
            continue
        for i in v.domain.logical:
            for s in (i.extent, i.expanded_extent):
                if isinstance(s, Scalar) and s.value is None and s.definition is None and s not in out:
                    out.append(s)
    return out

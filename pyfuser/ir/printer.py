"""Text of the fusion IR, in the form compiler engineers read: T3_l_float[iS8{i0}, rS9{i1}]."""
from __future__ import annotations

from . import scalar as S
from .exprs import (BinaryOp, BroadcastOp, ExpandOp, FullOp, GatherOp, IndexCheckOp, IotaOp,
                    ScatterOp, LinearOp,
                    LoadStoreOp, MatmulOp, RandOp, ScanOp, TopKOp, ReductionOp, ReshapeOp, SegmentSetOp,
                    SqueezeOp, UnaryOp, UnaryOpType, WhereOp)
from .iter_domain import id_exprs_between, id_str
from .scalar import Scalar
from .tensor import TensorView


def tv_str(tv: TensorView, with_pos: bool = True) -> str:
    ids = ", ".join(id_str(i) for i in tv.domain.loop)
    s = f"T{tv.name}_{tv.memory_type.value}_{tv.dtype.ir_name}[{ids}]"
    if with_pos and tv.compute_at_pos:
        s += f" ca_pos( {tv.compute_at_pos} )"
    if with_pos and tv.max_producer_pos:
        s += f" produce_pos( {tv.max_producer_pos} )"
    if tv.circular_buffer_options is not None:
        o = tv.circular_buffer_options
        s += f" circular_buffer( stages={o.stages}, prefetch={o.prefetch}, {type(o.kind).__name__} )"
    return s


def val_str(v) -> str:
    if isinstance(v, TensorView):
        return tv_str(v)
    if isinstance(v, Scalar):
        if v.value is None and v.definition is None:
            return f"{v.symbol or 's' + str(v.name)}:{v.dtype.short_name}"
        return S.scalar_str(v)
    return repr(v)


def expr_str(e) -> str:
    out = val_str(e.outputs[0])
    if isinstance(e, UnaryOp):
        name = e.op.value
        if e.op == UnaryOpType.Cast:
            name = f"cast<{e.outputs[0].dtype.ir_name}>"
        return f"{out}\n   = {name}( {val_str(e.inputs[0])} );"
    if isinstance(e, BinaryOp):
        return f"{out}\n   = {e.op.value}( {val_str(e.inputs[0])},\n        {val_str(e.inputs[1])} );"
    if isinstance(e, WhereOp):
        a, b, c = (val_str(i) for i in e.inputs)
        return f"{out}\n   = where( {a},\n        {b},\n        {c} );"
    if isinstance(e, LoadStoreOp):
        kind = "" if e.load_kind.value == "set" else f", load = {e.load_kind.value}"
        op = "segment_set" if isinstance(e, SegmentSetOp) else "set"
        return f"{out}\n   = {op}( {val_str(e.inputs[0])}{kind} );"
    if isinstance(e, BroadcastOp):
        flags = "".join("b" if f else "." for f in e.is_broadcast_dim)
        return f"{out}\n   = broadcast( {val_str(e.inputs[0])}, flags = {flags} );"
    if isinstance(e, ExpandOp):
        return f"{out}\n   = expand( {val_str(e.inputs[0])} );"
    if isinstance(e, SqueezeOp):
        flags = "".join("s" if f else "." for f in e.is_squeezed)
        of = f", of {e.reduction.value}" if e.reduction is not None else ""
        return f"{out}\n   = squeeze( {val_str(e.inputs[0])}, flags = {flags}{of} );"
    if isinstance(e, ReshapeOp):
        return f"{out}\n   = reshape( {val_str(e.inputs[0])} );"
    if isinstance(e, ReductionOp):
        return (f"{out}\n   = reduction( {val_str(e.inputs[0])}, op = {e.op.value}, "
                f"initial value = {S.scalar_str(e.init)} );")
    if isinstance(e, MatmulOp):
        a, b = (val_str(i) for i in e.inputs)
        return f"{out}\n   = matmul( {a},\n        {b} );"
    if isinstance(e, LinearOp):
        args = ",\n        ".join(val_str(i) for i in e.inputs)
        return f"{out}\n   = linear( {args} );"
    if isinstance(e, FullOp):
        return f"{out}\n   = full( {val_str(e.inputs[0])} );"
    if isinstance(e, IotaOp):
        start, step = (val_str(i) for i in e.inputs)
        return f"{out}\n   = iota( start = {start}, step = {step} );"
    if isinstance(e, ScanOp):
        return f"{out}\n   = scan( {val_str(e.inputs[0])}, op = {e.op}, dim = {e.dim} );"
    if isinstance(e, TopKOp):
        which = "largest" if e.largest else "smallest"
        k = e.k if e.k is not None else val_str(e.inputs[1])
        return (f"{out},\n     {val_str(e.outputs[1])}\n   = topk( {val_str(e.inputs[0])}, "
                f"k = {k}, dim = {e.dim}, {which} );")
    if isinstance(e, RandOp):
        seed, offset, a, b = (val_str(i) for i in e.inputs)
        params = f"low = {a}, high = {b}" if e.dist == "uniform" else f"mean = {a}, std = {b}"
        return (f"{out}\n   = {e.dist}( {params}, seed = {seed}, offset = {offset}, "
                f"stream = {e.stream} );")
    if isinstance(e, ScatterOp):
        into = val_str(e.x) if e.x is not None else "zeros"
        return (f"{out}\n   = {e.what}( {into},\n        {val_str(e.index)},\n        "
                f"{val_str(e.src)}, dim = {e.dim}, {e.op} );")
    if isinstance(e, IndexCheckOp):
        return (f"{out}\n   = check_index( {val_str(e.index)}, 0 <= i < "
                f"{val_str(e.extent)}, {e.what} dim {e.dim} );")
    if isinstance(e, GatherOp):
        # src_dims: the out dim each src dim is read at ("i": the index's value).
        at = ", ".join("i" if k is None else str(k) for k in e.src_dims)
        return (f"{out}\n   = {e.what}( {val_str(e.src)},\n        {val_str(e.index)}, "
                f"dim = {e.dim}, src at [{at}] );")
    return f"{out}\n   = {type(e).__name__}( {', '.join(val_str(i) for i in e.inputs)} );"


def fusion_str(fusion) -> str:
    lines = ["Inputs:"]
    lines += [f"  {val_str(v)}" for v in fusion.inputs]
    lines.append("Outputs:")
    lines += [f"  {val_str(v)}" for v in fusion.outputs]
    lines.append("")
    lines.append("%kernel_math {")
    for e in fusion.exprs():
        lines.append(expr_str(e))
    lines.append("} // %kernel_math")
    return "\n".join(lines)


def tv_transforms_str(tv: TensorView) -> str:
    d = tv.domain
    lines = [f"T{tv.name}_{tv.memory_type.value}_{tv.dtype.ir_name}"]
    if d.root is not None:
        lines.append(f"  root domain : ({', '.join(id_str(i) for i in d.root)})")
    lines.append(f"  logical domain : ({', '.join(id_str(i) for i in d.logical)})")
    if d.allocation is not None or tv.memory_type.value != "g":
        alloc = tv.allocation_domain
        contig = "".join("t" if c else ("n" if c is None else "f") for c in tv.allocation_contiguity)
        lines.append(f"  allocation domain : ({', '.join(id_str(i) for i in alloc)})"
                     f" contiguity: {contig}")
    for e in id_exprs_between(d.maybe_root, d.logical + d.maybe_allocation + d.loop):
        lines.append(f"  {e!r}")
    lines.append(f"  loop domain : ({', '.join(id_str(i) for i in d.loop)})")
    return "\n".join(lines)


def transforms_str(fusion) -> str:
    return "\n".join(tv_transforms_str(tv) for tv in fusion.tensors())

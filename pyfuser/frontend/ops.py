"""fd.ops: tensor operations with torch's type promotion and definition-time shape checks."""
from __future__ import annotations

from ..ir import arith
from ..ir import scalar as S
from ..ir.dtype import DataType, PromotionError, default_scalar_type, parse_dtype, result_type
from ..ir.exprs import BinaryOpType as B
from ..ir.exprs import DimWindow, ReductionOpType, UnaryOpType as U
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView
from . import indexing, resize


class FusionDefinitionError(ValueError):
    pass


_FLOAT_UNARY = {
    "exp": U.Exp, "exp2": U.Exp2, "log": U.Log, "sqrt": U.Sqrt, "rsqrt": U.Rsqrt,
    "reciprocal": U.Reciprocal, "tanh": U.Tanh, "sigmoid": U.Sigmoid, "erf": U.Erf,
    "silu": U.Silu,
}
_ARITH_BINARY = {"add": B.Add, "sub": B.Sub, "mul": B.Mul, "pow": B.Pow, "maximum": B.Max,
                 "minimum": B.Min}
# Dtypes whose argmax / argmin is one max reduction of (value, index) keys (32 bits of value,
# 32 of index; runtime/arg_key.py); int64 and float64 values take two reductions.
_ARG_KEY_DTYPES = (DataType.Float, DataType.BFloat16, DataType.Half, DataType.Int32)
_ARG_KEY_INDICES = 2 ** 32
_COMPARE = {"eq": B.Eq, "ne": B.Ne, "lt": B.Lt, "le": B.Le, "gt": B.Gt, "ge": B.Ge}


def _kind(x) -> str:
    if isinstance(x, TensorView):
        return f"T{x.name}"
    if isinstance(x, Scalar):
        return f"scalar {S.scalar_str(x)}"
    return repr(x)


class Ops:
    def __init__(self, fd):
        self._fd = fd
        for name, op in _FLOAT_UNARY.items():
            setattr(self, name, self._make_float_unary(name, op))
        for name, op in _ARITH_BINARY.items():
            setattr(self, name, self._make_binary(name, op))
        for name, op in _COMPARE.items():
            setattr(self, name, self._make_compare(name, op))

    # Operand handling --------------------------------------------------------------------------
    def _operand(self, op: str, k: int, x):
        self._fd._require_defining(f"ops.{op}")
        if isinstance(x, (TensorView, Scalar)):
            if x.fusion is not None and x.fusion is not self._fd.fusion:
                raise FusionDefinitionError(f"{op}: operand {k} ({_kind(x)}) belongs to another fusion")
            return x
        if isinstance(x, (bool, int, float)):
            return Scalar(default_scalar_type(x), x)
        raise FusionDefinitionError(f"{op}: operand {k} has unsupported type {type(x).__name__}; "
                                    "pass a tensor or scalar from this FusionDefinition or a number")

    def _tensor(self, op: str, k: int, x) -> TensorView:
        x = self._operand(op, k, x)
        if not isinstance(x, TensorView):
            raise FusionDefinitionError(f"{op}: operand {k} must be a tensor, got {_kind(x)}")
        return x

    def _promoted(self, op: str, operands) -> DataType:
        tensors = [x.dtype for x in operands if isinstance(x, TensorView)]
        scalars = [x.dtype for x in operands if not isinstance(x, TensorView)]
        try:
            return result_type(tensors, scalars)
        except PromotionError as e:
            raise FusionDefinitionError(f"{op}: {e}") from None

    @staticmethod
    def _refuse_float8(op: str, operands) -> None:
        """float8 tensors are storage (torch has no float8 arithmetic, and promotes float8
        with no other type): an op that computes with one is a definition error that asks for
        the cast, so the user chooses the precision. `operands`: (position, value) pairs."""
        for k, x in operands:
            if isinstance(x, (TensorView, Scalar)) and x.dtype.is_float8:
                raise FusionDefinitionError(
                    f"{op}: operand {k} ({_kind(x)}) is {x.dtype.short_name}, a storage type "
                    f"with no arithmetic (as in torch); cast it first: fd.ops.cast(x, "
                    f"DataType.Float)")

    def _align_ranks(self, op: str, operands):
        """Right-align tensor ranks as torch broadcasting does, inserting broadcast dims."""
        ranks = [len(x.domain.logical_no_reductions) for x in operands if isinstance(x, TensorView)]
        if not ranks:
            return operands
        r = max(ranks)
        self._check_static_sizes(op, operands, r)
        out = []
        for x in operands:
            if isinstance(x, TensorView):
                n = len(x.domain.logical_no_reductions)
                if n < r:
                    x = arith.broadcast(x, [True] * (r - n) + [False] * n)
            out.append(x)
        return out

    def _check_static_sizes(self, op: str, operands, r: int) -> None:
        """Static sizes of right-aligned dims must agree (or be 1); name both operands if not."""
        seen: dict = {}
        for k, x in enumerate(operands):
            if not isinstance(x, TensorView):
                continue
            ids = x.domain.logical_no_reductions
            for d, i in enumerate(ids):
                size = i.extent.value if not i.is_broadcast else None
                if size is None:
                    continue
                out_dim = r - len(ids) + d
                if out_dim in seen and seen[out_dim][2] != size:
                    k0, d0, s0, x0 = seen[out_dim]
                    raise FusionDefinitionError(
                        f"{op}: operand {k0} ({_kind(x0)}) dim {d0} has size {s0} but operand {k} "
                        f"({_kind(x)}) dim {d} has size {size}; they do not broadcast")
                seen.setdefault(out_dim, (k, d, size, x))

    def _wrap(self, op: str, fn):
        try:
            return fn()
        except arith.ShapeError as e:
            msg = str(e)
            raise FusionDefinitionError(msg if msg.startswith(op) else f"{op}: {msg}") from None

    # Unary -------------------------------------------------------------------------------------
    def _make_float_unary(self, name, op):
        def fn(x):
            x = self._operand(name, 0, x)
            self._refuse_float8(name, [(0, x)])
            dt = x.dtype if x.dtype.is_floating else DataType.Float
            if isinstance(x, Scalar):
                out = Scalar(dt)
                from ..ir.exprs import UnaryOp
                UnaryOp(op, out, x)
                return out
            return arith.unary(op, x, dt)
        fn.__name__ = name
        fn.__doc__ = f"{name}(x); integer and bool inputs give float32, as in torch."
        return fn

    def _unary_same(self, name, op, x, allow_bool=False):
        x = self._tensor(name, 0, x)
        self._refuse_float8(name, [(0, x)])
        if x.dtype.is_boolean and not allow_bool:
            raise FusionDefinitionError(f"{name}: operand 0 ({_kind(x)}) is bool; {name} is not "
                                        "defined for bool")
        return arith.unary(op, x, x.dtype)

    def neg(self, x):
        return self._unary_same("neg", U.Neg, x)

    def abs(self, x):
        return self._unary_same("abs", U.Abs, x)

    def relu(self, x):
        return self._unary_same("relu", U.Relu, x)

    def gelu(self, x, approximate: str = "none"):
        if approximate not in ("none", "tanh"):
            raise FusionDefinitionError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        x = self._tensor("gelu", 0, x)
        self._refuse_float8("gelu", [(0, x)])
        dt = x.dtype if x.dtype.is_floating else DataType.Float
        return arith.unary(U.GeluTanh if approximate == "tanh" else U.GeluErf, x, dt)

    def logical_not(self, x):
        x = self._tensor("logical_not", 0, x)
        self._refuse_float8("logical_not", [(0, x)])
        return arith.unary(U.Not, x, DataType.Bool)

    def cast(self, x, dtype):
        x = self._operand("cast", 0, x)
        dt = parse_dtype(dtype)
        if isinstance(x, Scalar):
            if dt.is_float8:
                raise FusionDefinitionError(f"cast: {_kind(x)} to {dt.short_name}: float8 is a "
                                            "tensor storage type; a scalar stays in float32")
            from ..ir.exprs import UnaryOp
            out = Scalar(dt)
            UnaryOp(U.Cast, out, x)
            return out
        if x.dtype == dt:
            return x
        return arith.unary(U.Cast, x, dt)

    def set(self, x):
        x = self._tensor("set", 0, x)
        return arith.set_op(x)

    def segment_set(self, x):
        """A copy of `x` that ends a segment: the plan computes `x` in one segment and its
        consumers in others (nvFuser's segment_set)."""
        x = self._tensor("segment_set", 0, x)
        return arith.segment_set(x)

    # Binary ------------------------------------------------------------------------------------
    def _binary(self, name, op, a, b, out_dtype=None):
        a, b = self._operand(name, 0, a), self._operand(name, 1, b)
        self._refuse_float8(name, [(0, a), (1, b)])
        for k, x in enumerate((a, b)):
            if name == "sub" and x.dtype.is_boolean:
                raise FusionDefinitionError(f"sub: operand {k} ({_kind(x)}) is bool; torch "
                                            "forbids bool subtraction, use logical_not or ne")
        dt = out_dtype or self._promoted(name, [a, b])
        if name == "pow" and dt.is_boolean:
            raise FusionDefinitionError("pow: both operands are bool; pow is not defined for "
                                        "bool (cast to an integer type first)")
        a, b = self._align_ranks(name, [a, b])
        return self._wrap(name, lambda: arith.binary(op, a, b, dt))

    def _make_binary(self, name, op):
        def fn(a, b):
            return self._binary(name, op, a, b)
        fn.__name__ = name
        fn.__doc__ = f"{name}(a, b) with torch type promotion and broadcasting."
        return fn

    def _make_compare(self, name, op):
        def fn(a, b):
            return self._binary(name, op, a, b, DataType.Bool)
        fn.__name__ = name
        fn.__doc__ = f"{name}(a, b) -> bool tensor."
        return fn

    def div(self, a, b):
        """True division: integer operands give float32, as torch.div."""
        a, b = self._operand("div", 0, a), self._operand("div", 1, b)
        self._refuse_float8("div", [(0, a), (1, b)])
        dt = self._promoted("div", [a, b])
        if not dt.is_floating:
            dt = DataType.Float
        a, b = self._align_ranks("div", [a, b])
        return self._wrap("div", lambda: arith.binary(B.Div, a, b, dt))

    truediv = div

    def logical_and(self, a, b):
        return self._binary("logical_and", B.And, a, b, DataType.Bool)

    def logical_or(self, a, b):
        return self._binary("logical_or", B.Or, a, b, DataType.Bool)

    def where(self, cond, a, b):
        cond = self._operand("where", 0, cond)
        if not cond.dtype.is_boolean:
            raise FusionDefinitionError(f"where: operand 0 ({_kind(cond)}) must be bool, got "
                                        f"{cond.dtype.short_name}")
        a, b = self._operand("where", 1, a), self._operand("where", 2, b)
        # A selection, no arithmetic: float8 operands are taken (as torch.where takes them),
        # a number converted to float8 as a cast converts it.
        dt = self._promoted("where", [a, b])
        cond, a, b = self._align_ranks("where", [cond, a, b])
        if not any(isinstance(x, TensorView) for x in (cond, a, b)):
            raise FusionDefinitionError("where: at least one operand must be a tensor")
        return self._wrap("where", lambda: arith.where(cond, a, b, dt))

    # Shape ops ---------------------------------------------------------------------------------
    def broadcast(self, x, is_broadcast_dim):
        x = self._tensor("broadcast", 0, x)
        return self._wrap("broadcast", lambda: arith.broadcast(x, list(is_broadcast_dim)))

    def broadcast_in_dim(self, x, shape, broadcast_dims):
        """Place x's dims at `broadcast_dims` of a tensor of `shape`; other dims broadcast.
        Sizes in `shape` other than -1 or 1 expand the broadcast dims."""
        x = self._tensor("broadcast_in_dim", 0, x)
        src = x.domain.logical_no_reductions
        bd = list(broadcast_dims)
        if len(bd) != len(src):
            raise FusionDefinitionError(f"broadcast_in_dim: {len(bd)} broadcast_dims for "
                                        f"{_kind(x)} of rank {len(src)}")
        if sorted(bd) != bd or len(set(bd)) != len(bd) or (bd and not 0 <= bd[-1] < len(shape)):
            raise FusionDefinitionError(f"broadcast_in_dim: broadcast_dims {bd} must increase "
                                        f"and lie in 0..{len(shape) - 1}")
        flags = [k not in bd for k in range(len(shape))]
        out = self._wrap("broadcast_in_dim", lambda: arith.broadcast(x, flags))
        sizes = []
        need_expand = False
        for k, s in enumerate(shape):
            sv = S.const_value(s)
            i = out.domain.logical[k]
            if i.is_broadcast and sv not in (None, -1, 1):
                need_expand = True
                sizes.append(s)
            elif i.is_broadcast and isinstance(s, Scalar) and sv is None:
                need_expand = True
                sizes.append(s)
            else:
                if (not i.is_broadcast and sv not in (None, -1) and i.extent.value is not None
                        and sv != i.extent.value):
                    raise FusionDefinitionError(f"broadcast_in_dim: dim {k} has size "
                                                f"{i.extent.value}, shape asks {sv}")
                sizes.append(-1)
        if need_expand:
            out = self._wrap("broadcast_in_dim", lambda: arith.expand(out, sizes))
        return out

    def expand(self, x, shape):
        x = self._tensor("expand", 0, x)
        return self._wrap("expand", lambda: arith.expand(x, list(shape)))

    def squeeze(self, x, dims):
        x = self._tensor("squeeze", 0, x)
        dims = [dims] if isinstance(dims, int) else list(dims)
        return self._wrap("squeeze", lambda: arith.squeeze(x, dims))

    def reshape(self, x, shape):
        x = self._tensor("reshape", 0, x)
        sizes = list(shape)
        dims = x.domain.logical_no_reductions
        if (sizes and all(S.const_value(s) == 1 for s in sizes)
                and any(not i.is_broadcast and S.const_value(i.extent) is None for i in dims)):
            # To all ones from symbolic sizes (one element at run time): as torch, a tensor of
            # size-1 dims that broadcast. A reshape would keep the symbolic extent in one dim,
            # which broadcasts nowhere; its element is the window [0, 1) of every dim instead
            # (the run-time element count is checked to be 1).
            total = S.product(i.user_extent for i in dims)
            windows = [None if i.is_broadcast else DimWindow(0, 1) for i in dims]
            one = resize.window(self, x, windows, [1] * len(dims), resize.zero_of(x.dtype))
            self._fd.fusion.extent_equalities.append((total, S.as_scalar(1, DataType.Int),
                                                      "reshape element count"))
            x = one
        return self._wrap("reshape", lambda: arith.reshape(x, sizes))

    def permute(self, x, dims):
        x = self._tensor("permute", 0, x)
        n = len(x.domain.logical_no_reductions)
        dims = [d + n if d < 0 else d for d in dims]
        if sorted(dims) != list(range(n)):
            raise FusionDefinitionError(f"permute: {list(dims)} is not a permutation of 0..{n - 1}")
        return arith.permute(x, dims)

    def stride_order(self, x, stride_order):
        """A copy of x laid out in memory by `stride_order` (nvFuser's spelling, as in
        define_tensor): stride_order[k] is the stride rank of dim k, rank-1 outermost and 0
        innermost. [3, 0, 2, 1] of an NCHW tensor is channels-last (C innermost). The copy is
        dense in that order; as a fusion output it is allocated and written so (its allocation
        domain). An empty order is a plain copy."""
        x = self._tensor("stride_order", 0, x)
        order = list(stride_order)
        out = arith.set_op(x)
        if not order:
            return out
        n = len(out.domain.logical)
        if len(order) != n:
            raise FusionDefinitionError(f"stride_order: {len(order)} entries for {_kind(x)} of "
                                        f"rank {n}; give one stride rank per dim")
        if sorted(order) != list(range(n)):
            raise FusionDefinitionError(f"stride_order: {order} is not a permutation of "
                                        f"0..{n - 1}")
        ids = out.domain.logical
        by_rank = sorted(range(n), key=lambda k: -order[k])
        if by_rank != list(range(n)):
            out.domain.allocation = [ids[k] for k in by_rank]
            out.domain.contiguity = [None if i.is_broadcast else True
                                     for i in out.domain.allocation]
        return out

    # Library ops -------------------------------------------------------------------------------
    _LIBRARY_DTYPES = (DataType.Float, DataType.Half, DataType.BFloat16)

    def _library_operands(self, op: str, names: list[str], operands: list, ranks: list):
        """The tensor operands of a library op: one floating dtype among them (bf16, fp16 or
        fp32; the result has it) and ranks in `ranks[k]` (a range of allowed ranks)."""
        tvs = [self._tensor(op, k, x) for k, x in enumerate(operands)]
        for k, (name, x, allowed) in enumerate(zip(names, tvs, ranks)):
            if x.dtype not in self._LIBRARY_DTYPES:
                raise FusionDefinitionError(
                    f"{op}: {name} ({_kind(x)}) is {x.dtype.short_name}; {op} takes bf16, fp16 "
                    "or fp32 tensors (cast it first)")
            r = len(x.domain.logical_no_reductions)
            if r not in allowed:
                want = (f"{allowed.start}" if len(allowed) == 1
                        else f"at least {allowed.start}" if allowed.stop > 64
                        else f"{allowed.start} to {allowed.stop - 1}")
                raise FusionDefinitionError(f"{op}: {name} ({_kind(x)}) has rank {r}; {op} "
                                            f"needs rank {want} there")
        first = tvs[0]
        for name, x in zip(names[1:], tvs[1:]):
            if x.dtype != first.dtype:
                raise FusionDefinitionError(
                    f"{op}: {names[0]} ({_kind(first)}) is {first.dtype.short_name} but {name} "
                    f"({_kind(x)}) is {x.dtype.short_name}; cast them to one dtype")
        return tvs

    def matmul(self, a, b):
        """torch.matmul(a, b): a [..., M, K] or [K], b [..., K, N] or [K], batch dims broadcast;
        bf16, fp16 or fp32 operands of one dtype, the result in that dtype, accumulated in
        fp32. Runs as a library segment (cuBLAS through torch), not in a generated kernel."""
        any_rank = range(1, 1 << 16)
        a, b = self._library_operands("matmul", ["operand 0", "operand 1"], [a, b],
                                      [any_rank, any_rank])
        return self._wrap("matmul", lambda: arith.matmul(a, b))

    def linear(self, x, w, bias=None):
        """torch.nn.functional.linear(x, w, bias): x [..., K], w [N, K], bias [N] or None; one
        dtype (bf16, fp16 or fp32), the result [..., N] in it, accumulated in fp32. Runs as a
        library segment (cuBLAS through torch), not in a generated kernel."""
        names, operands = ["input", "weight"], [x, w]
        ranks = [range(1, 1 << 16), range(2, 3)]
        if bias is not None:
            names.append("bias")
            operands.append(bias)
            ranks.append(range(1, 2))
        tvs = self._library_operands("linear", names, operands, ranks)
        x, w = tvs[0], tvs[1]
        b = tvs[2] if bias is not None else None
        return self._wrap("linear", lambda: arith.linear(x, w, b))

    # Reductions --------------------------------------------------------------------------------
    def _dims(self, name, x, dims):
        n = len(x.domain.logical_no_reductions)
        if dims is None:
            dims = list(range(n))
        dims = [dims] if isinstance(dims, int) else list(dims)
        out = []
        for d in dims:
            dd = d + n if d < 0 else d
            if not 0 <= dd < n:
                raise FusionDefinitionError(f"{name}: dim {d} is out of range for {_kind(x)} of rank {n}")
            if dd in out:
                raise FusionDefinitionError(f"{name}: dim {d} appears twice in {dims}")
            out.append(dd)
        return sorted(out)

    @staticmethod
    def _one_dim(op: str, rank: int, dim) -> int:
        """`dim` (an int, negative from the end) of a tensor of `rank` dims, as 0..rank-1."""
        if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
            raise FusionDefinitionError(f"{op}: dim {dim!r} out of range for rank {rank}")
        return dim % rank

    @staticmethod
    def _check_sizes(op: str, shape) -> None:
        """A new tensor's sizes: positive ints or int scalars."""
        for k, s in enumerate(shape):
            v = S.const_value(s)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise FusionDefinitionError(f"{op}: size {s!r} of dim {k} must be a positive int")

    def _keep(self, out, dims, n):
        return arith.broadcast(out, [k in dims for k in range(n)])

    def _reduce(self, name, op, x, dims, keepdim, dtype):
        x = self._tensor(name, 0, x)
        self._refuse_float8(name, [(0, x)])
        dims = self._dims(name, x, dims)
        n = len(x.domain.logical_no_reductions)
        if dtype is not None:
            dt = parse_dtype(dtype)
        elif op == ReductionOpType.Sum and not x.dtype.is_floating:
            dt = DataType.Int
        else:
            dt = x.dtype
        if op == ReductionOpType.Sum:
            init = 0.0 if dt.is_floating else (False if dt.is_boolean else 0)
        else:
            if x.dtype.is_boolean:
                raise FusionDefinitionError(f"{name}: bool tensors have no {name}; cast first")
            # The identity of max / min in the result's own type: the lowest / highest int32
            # for an int32 max (an int64 bound converted to int32 would be 0).
            bits = 8 * dt.size - 1
            init = (float("-inf") if op == ReductionOpType.Max else float("inf")) if dt.is_floating else (
                -(2 ** bits) if op == ReductionOpType.Max else 2 ** bits - 1)
        reduced = dims
        src = x.domain.logical_no_reductions
        size_one = [d for d in dims if src[d].is_broadcast and src[d].expanded_extent is None]
        if size_one:
            # Reducing a size-1 dim leaves its one element: squeeze it instead, so that no
            # kernel reduces over a broadcast ID.
            x = arith.squeeze(x, size_one)
            src = x.domain.logical_no_reductions
            dims = [d - sum(1 for s in size_one if s < d) for d in dims if d not in size_one]
        # An expanded dim (stride 0) holds E copies of one element: no kernel reduces over it
        # either (a persistent row would have to hold the copies, in registers whose loops
        # iterate the expanded extent). The other dims are reduced, the expanded ones are
        # kept through the reduction as the broadcasts they are and squeezed from its result,
        # which is E times their element for a sum, their element for max and min.
        copies = [d for d in dims if src[d].expanded_extent is not None]
        dims = [d for d in dims if d not in copies]
        copies_of = (S.product(src[d].expanded_extent for d in copies)
                     if copies and op == ReductionOpType.Sum and not dt.is_boolean else None)
        acc_dt = DataType.Float if dt.is_reduced_float else dt
        if not dims:
            acc = x
        else:
            if dt.is_reduced_float:
                # A reduction to a 16-bit float accumulates in float32 and rounds once at the
                # end, as torch does: cast(reduce(cast(x, float)), dt). Kernels then hold float
                # accumulators, partials and workspaces, never 16-bit ones.
                if x.dtype != dt:
                    x = arith.unary(U.Cast, x, dt)     # torch first casts the input to `dtype`
                x = arith.unary(U.Cast, x, DataType.Float)
            acc = arith.reduction(op, x, dims, acc_dt, init)
        if copies:
            # Positions among the result's dims (the reduced ones are gone).
            acc = arith.squeeze(acc, [c - sum(1 for d in dims if d < c) for c in copies],
                                reduction=op)
        if copies_of is not None:
            if acc.dtype != acc_dt:
                if dt.is_reduced_float and acc.dtype != dt:
                    acc = arith.unary(U.Cast, acc, dt)
                acc = arith.unary(U.Cast, acc, acc_dt)
            acc = self._times(acc, copies_of)
        out = acc if acc.dtype == dt else arith.unary(U.Cast, acc, dt)
        return self._keep(out, reduced, n) if keepdim else out

    def _times(self, acc: TensorView, count) -> TensorView:
        """acc * count (an integer extent) in acc's dtype."""
        if acc.dtype.is_floating:
            factor = self._as_float(count)
            if not isinstance(factor, Scalar):
                factor = Scalar(DataType.Double, factor)
        else:
            factor = count if count.value is None else Scalar(DataType.Int, count.value)
        return arith.binary(B.Mul, acc, factor, acc.dtype)

    def sum(self, x, dims=None, keepdim: bool = False, dtype=None):
        return self._reduce("sum", ReductionOpType.Sum, x, dims, keepdim, dtype)

    def max(self, x, dims=None, keepdim: bool = False):
        return self._reduce("max", ReductionOpType.Max, x, dims, keepdim, None)

    def min(self, x, dims=None, keepdim: bool = False):
        return self._reduce("min", ReductionOpType.Min, x, dims, keepdim, None)

    def cumsum(self, x, dim: int, dtype=None):
        """torch.cumsum: running sums along `dim` (int64 for integer and bool inputs unless
        `dtype` says; 16-bit floats are summed in float32 and each result rounded, as torch
        does). A block-scan kernel (the `scan` scheduler) with the element-wise ops around it,
        or torch.cumsum as a library op where no kernel takes it."""
        return self._scan("cumsum", "sum", x, dim, dtype)

    def cumprod(self, x, dim: int, dtype=None):
        """torch.cumprod: running products along `dim`, as cumsum."""
        return self._scan("cumprod", "prod", x, dim, dtype)

    def _scan(self, name: str, op: str, x, dim, dtype):
        x = self._tensor(name, 0, x)
        self._refuse_float8(name, [(0, x)])
        rank = len(x.domain.logical_no_reductions)
        dim = self._one_dim(name, max(rank, 1), dim)   # rank 0 takes 0 or -1, as torch
        dt = parse_dtype(dtype) if dtype is not None else (
            x.dtype if x.dtype.is_floating else DataType.Int)
        source = x
        if dt != x.dtype:
            x = self.cast(x, dt)
        if rank == 0 or x.domain.logical_no_reductions[dim].is_broadcast:
            # A scan over one element is that element (torch's dtype rules above still apply).
            return self.set(x) if x is source else x
        if dt.is_reduced_float:
            # torch accumulates 16-bit scans in float32 and rounds each result once.
            return self.cast(arith.scan(self.cast(x, DataType.Float), dim, op, DataType.Float), dt)
        return arith.scan(x, dim, op, dt)

    def topk(self, x, k, dim: int = -1, largest: bool = True, sorted: bool = True):
        """torch.topk: (values, indices) of the k largest (smallest with largest=False)
        elements of x along `dim`, indices int64. A library op: torch.topk runs it (a segment
        of its own in the plan)."""
        x = self._tensor("topk", 0, x)
        self._refuse_float8("topk", [(0, x)])
        dim = self._one_dim("topk", len(x.domain.logical_no_reductions), dim)
        if x.dtype.is_boolean:
            raise FusionDefinitionError("topk: bool tensors have no order; cast first")
        kv = S.const_value(k)
        if isinstance(k, Scalar) and kv is None:
            if not k.dtype.is_integral or k.dtype.is_boolean:
                raise FusionDefinitionError(f"topk: k must be an int, got {_kind(k)}")
        elif not isinstance(kv, int) or isinstance(kv, bool) or kv < 0:
            raise FusionDefinitionError(f"topk: k {k!r} must be an int >= 0")
        n = S.const_value(x.domain.logical_no_reductions[dim].user_extent)
        if kv is not None and n is not None and kv > n:
            raise FusionDefinitionError(f"topk: k {kv} is more than dim {dim}'s {n} elements")
        return arith.topk(x, k, dim, bool(largest), bool(sorted))

    # Index reductions -----------------------------------------------------------------------
    def argmax(self, x, dim=None, keepdim: bool = False):
        """torch.argmax: the index (int64) of the first largest element along `dim`, or of the
        flattened tensor when dim is None; a NaN counts as the largest (the first NaN's
        index), as in torch. Built as the max, then the least index where x is the max or NaN:
        the row kernel of a normalization."""
        return self._arg_extreme("argmax", ReductionOpType.Max, x, dim, keepdim)

    def argmin(self, x, dim=None, keepdim: bool = False):
        """torch.argmin: as argmax, of the first smallest element."""
        return self._arg_extreme("argmin", ReductionOpType.Min, x, dim, keepdim)

    def _arg_extreme(self, name, op, x, dim, keepdim):
        x = self._tensor(name, 0, x)
        self._refuse_float8(name, [(0, x)])
        if x.dtype.is_boolean:
            raise FusionDefinitionError(f"{name}: bool tensors have no {name}; cast first")
        rank = len(x.domain.logical_no_reductions)
        if dim is None:
            # Of the flattened tensor; keepdim keeps every dim as size 1 (torch's shape).
            if rank == 0:
                index = arith.full([], 0, DataType.Int)
            else:
                flat = x if rank == 1 else self.reshape(x, [-1])
                index = self._arg_extreme(name, op, flat, 0, False)
            return arith.broadcast(index, [True] * rank) if keepdim and rank else index
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise FusionDefinitionError(f"{name}: dim must be an int or None, got {dim!r}")
        d, = self._dims(name, x, dim)
        n = x.domain.logical_no_reductions[d].user_extent
        nv = S.const_value(n)
        if x.dtype in _ARG_KEY_DTYPES and (nv is None or nv <= _ARG_KEY_INDICES):
            # One pass: the max of each element's (value, index) key (BinaryOpType.ArgMaxKey).
            # A 32-bit value leaves 32 bits for the index: larger dims are refused at run time.
            if nv is None:
                limit = S.as_scalar(_ARG_KEY_INDICES, DataType.Int)
                self._fd.fusion.extent_limits.append((n, limit, (
                    f"{name}: its dim {d} (the one-pass {name} of a {x.dtype.short_name} tensor "
                    "indexes at most 2^32 elements)")))
            index = resize.dim_index(self, n, d, rank, DataType.Int)
            key_op = B.ArgMaxKey if op == ReductionOpType.Max else B.ArgMinKey
            key = arith.binary(key_op, x, index, DataType.Int)
            best = self._reduce(name, ReductionOpType.Max, key, [d], keepdim, None)
            return arith.unary(U.ArgKeyIndex, best, DataType.Int)
        best = self._reduce(name, op, x, [d], True, None)
        hit = self.eq(x, best)
        if x.dtype.is_floating:
            # max and min propagate NaN: where there is one, `best` is NaN and x != x marks it.
            hit = self.logical_or(hit, self.ne(x, x))
        index = resize.dim_index(self, n, d, rank, DataType.Int)
        # Elsewhere the dim's size, past every index (an extent is an int64 scalar).
        return self._reduce(name, ReductionOpType.Min, self.where(hit, index, n), [d],
                            keepdim, None)

    def _count(self, x, dims):
        src = x.domain.logical_no_reductions
        return S.product(src[d].user_extent for d in dims)

    def mean(self, x, dims=None, keepdim: bool = False):
        x = self._tensor("mean", 0, x)
        self._refuse_float8("mean", [(0, x)])
        if not x.dtype.is_floating:
            raise FusionDefinitionError(f"mean: operand 0 ({_kind(x)}) is {x.dtype.short_name}; "
                                        "mean needs a floating tensor (cast it first)")
        dims = self._dims("mean", x, dims)
        if x.dtype.is_reduced_float:
            # Sum and divide in float, round once (torch's mean of a 16-bit tensor).
            s = self.sum(self.cast(x, DataType.Float), dims, keepdim)
            return self.cast(self.div(s, self._count_as_float(x, dims)), x.dtype)
        s = self.sum(x, dims, keepdim)
        return self.div(s, self._count_as_float(x, dims))

    def _count_as_float(self, x, dims):
        return self._as_float(self._count(x, dims))

    def _as_float(self, n):
        """An integer extent as a floating operand: a number, or a cast of the runtime extent."""
        if n.value is not None:
            return float(n.value)
        from ..ir.exprs import UnaryOp
        f = Scalar(DataType.Double)
        UnaryOp(U.Cast, f, n)
        return f

    def var_mean(self, x, dims=None, correction: int = 1, keepdim: bool = False):
        """(var, mean) with the two-pass formula sum((x - mean)^2) / max(N - correction, 0)."""
        x = self._tensor("var_mean", 0, x)
        self._refuse_float8("var_mean", [(0, x)])
        if not x.dtype.is_floating:
            raise FusionDefinitionError(f"var_mean: operand 0 ({_kind(x)}) must be floating")
        dims = self._dims("var_mean", x, dims)
        if x.dtype.is_reduced_float:
            # torch computes a 16-bit var_mean in float and rounds the results once: squares
            # summed in 16 bits overflow (65536 fp16 squares of N(0, 1) values pass 65504).
            var, mean = self.var_mean(self.cast(x, DataType.Float), dims, correction, keepdim)
            return self.cast(var, x.dtype), self.cast(mean, x.dtype)
        mean_keep = self.mean(x, dims, keepdim=True)
        d = self.sub(x, mean_keep)
        sq = self.mul(d, d)
        ssum = self.sum(sq, dims, keepdim)
        count = self._count(x, dims)
        # torch divides by max(N - correction, 0): no more rows than corrections gives inf, or
        # nan over no elements (0 / 0), never a negative variance.
        denom_i = S.sub(count, correction)
        if correction > 0:
            denom_i = S.smax(denom_i, 0)
        if denom_i.value is not None:
            denom = float(denom_i.value)
        else:
            from ..ir.exprs import UnaryOp
            denom = Scalar(DataType.Double)
            UnaryOp(U.Cast, denom, denom_i)
        var = self.div(ssum, denom)
        if keepdim:
            return var, mean_keep
        mean = self.squeeze(mean_keep, dims) if dims else mean_keep
        return var, mean

    def var(self, x, dims=None, correction: int = 1, keepdim: bool = False):
        return self.var_mean(x, dims, correction, keepdim)[0]

    # Creation ----------------------------------------------------------------------------------
    def full(self, shape, fill_value, dtype=None):
        self._fd._require_defining("ops.full")
        dt = parse_dtype(dtype) if dtype is not None else (
            fill_value.dtype if isinstance(fill_value, Scalar) else default_scalar_type(fill_value))
        if dt == DataType.Double and not isinstance(fill_value, Scalar) and dtype is None:
            dt = DataType.Float
        if dt.is_float8:
            # torch.full refuses a value float8 cannot hold; a cast of a float32 full says
            # what happens to one (it saturates, or rounds).
            raise FusionDefinitionError(f"full: dtype {dt.short_name} is a storage type; fill "
                                        "in float32 and cast")
        self._check_sizes("full", shape)
        return arith.full(list(shape), fill_value, dt)

    # Slicing and concatenation (windows of their sources: frontend/resize.py) ----------------
    def slice(self, x, start_indices, end_indices, strides=None):
        """x[start:end:stride] along every dim (nvFuser's signature; lists of one entry per dim,
        ints or int scalars). Indices follow Python: negative ones count from the end, both
        are clamped to the dim (an empty range gives a dim of size 0), and None is the dim's
        start or end."""
        x = self._tensor("slice", 0, x)
        dims = x.domain.logical_no_reductions
        strides = [1] * len(dims) if strides is None else list(strides)
        for what, v in (("start_indices", start_indices), ("end_indices", end_indices),
                        ("strides", strides)):
            if len(v) != len(dims):
                raise FusionDefinitionError(f"slice: {len(v)} {what} for {_kind(x)} of rank "
                                            f"{len(dims)}")
        windows, extents = [], []
        for k, (i, s, e, step) in enumerate(zip(dims, start_indices, end_indices, strides)):
            if not isinstance(step, int) or isinstance(step, bool) or step < 1:
                raise FusionDefinitionError(f"slice: stride {step!r} of dim {k} must be an int "
                                            ">= 1")
            n = i.user_extent
            s = 0 if s is None else self._slice_index("slice", k, s, n)
            e = n if e is None else self._slice_index("slice", k, e, n)
            if S.const_value(s) == 0 and S.same_value(e, n) and step == 1:
                windows.append(None)
                extents.append(n)
                continue
            windows.append(DimWindow(s, step))
            extents.append(S.smax(0, S.ceil_div(S.sub(e, s), step)))
        if all(w is None for w in windows):
            return self.set(x)
        return resize.window(self, x, windows, extents, 0)

    def _slice_index(self, op: str, k: int, v, n):
        """A Python-style index into a dim of extent n, normalized: n + v where v < 0, then
        clamped to [0, n]."""
        if isinstance(v, Scalar):
            if not v.dtype.is_integral:
                raise FusionDefinitionError(f"{op}: index {_kind(v)} of dim {k} must be an int")
            if v.value is None:
                return v if v is n else S.smax(0, S.smin(v, n))    # taken as >= 0
            v = v.value
        if not isinstance(v, int) or isinstance(v, bool):
            raise FusionDefinitionError(f"{op}: index {v!r} of dim {k} must be an int")
        nv = S.const_value(n)
        if nv is not None:
            return max(0, min(v + nv if v < 0 else v, nv))
        if v == 0:
            return 0
        # Extents are >= 0: a non-negative index needs no max, a negative one no min.
        return S.smin(v, n) if v > 0 else S.smax(0, S.add(n, v))

    def pad(self, x, pad_widths, value=None):
        """x padded with `value` (0 by default), torch.nn.functional.pad's order: pad_widths =
        [left, right] of the last dim, then of the one before it, ... Negative widths crop."""
        x = self._tensor("pad", 0, x)
        dims = x.domain.logical_no_reductions
        widths = list(pad_widths)
        if len(widths) % 2 or len(widths) // 2 > len(dims):
            raise FusionDefinitionError(f"pad: {len(widths)} pad widths for {_kind(x)} of rank "
                                        f"{len(dims)}; give pairs, at most one per dim")
        for w in widths:
            if not isinstance(w, int) or isinstance(w, bool):
                raise FusionDefinitionError(f"pad: width {w!r} must be an int")
        value = self._operand("pad", 2, resize.zero_of(x.dtype) if value is None else value)
        if isinstance(value, TensorView):
            raise FusionDefinitionError("pad: value must be a number or a scalar")
        windows, extents = [None] * len(dims), [i.user_extent for i in dims]
        for p in range(len(widths) // 2):
            k = len(dims) - 1 - p
            left, right = widths[2 * p], widths[2 * p + 1]
            n = dims[k].user_extent
            extent = S.add(n, left + right)
            if S.const_value(extent) is not None and S.const_value(extent) < 0:
                raise FusionDefinitionError(f"pad: widths {left}, {right} leave dim {k} of size "
                                            f"{S.const_value(n)} with a negative size")
            if left == 0 and right == 0:
                continue
            guards = ((-left, 1, 0, n),) if left > 0 or right > 0 else ()
            windows[k] = DimWindow(-left, 1, guards)
            extents[k] = extent
        if all(w is None for w in windows):
            return self.set(x)
        return resize.window(self, x, windows, extents, self._scalar_of(value, x.dtype))

    def _scalar_of(self, x: Scalar, dt: DataType) -> Scalar:
        """Scalar x as one of dtype dt: a constant converted here, a symbolic one cast."""
        if x.dtype == dt:
            return x
        if x.value is None:
            return self.cast(x, dt)
        return Scalar(dt, float(x.value) if dt.is_floating else x.value)

    def cat(self, tensors, dim: int):
        """torch.cat: the tensors one after another along `dim`, every other dim equal
        (frontend/resize.concat)."""
        xs = [self._tensor("cat", k, t) for k, t in enumerate(tensors)]
        if not xs:
            raise FusionDefinitionError("cat: no tensors")
        rank = len(xs[0].domain.logical_no_reductions)
        if any(len(t.domain.logical_no_reductions) != rank for t in xs):
            raise FusionDefinitionError("cat: tensors of different ranks "
                                        f"{[len(t.domain.logical_no_reductions) for t in xs]}")
        dim = self._one_dim("cat", rank, dim)
        dt = self._promoted("cat", xs)
        xs = [self.cast(t, dt) if t.dtype != dt else t for t in xs]
        if len(xs) == 1:
            return self.set(xs[0])
        return resize.concat(self, xs, dim)

    def chunk(self, x, chunks: int, dim: int = 0):
        """torch.chunk: slices of x along `dim` of ceil(n / chunks) elements each, the last
        shorter (`chunks` empty ones of an empty dim, as torch gives; a static extent only)."""
        x, dim, n = self._static_dim("chunk", x, dim)
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise FusionDefinitionError(f"chunk: chunks {chunks!r} must be an int >= 1")
        size = -(-n // chunks)
        return self._sections(x, dim, [min(size, n - s) for s in range(0, n, size)]
                              if n else [0] * chunks)

    def split(self, x, split_size_or_sections, dim: int = 0):
        """torch.split: slices of x along `dim`, of `split_size_or_sections` elements each (an
        int: the last may be shorter) or of the sizes it lists (they must add up to the dim's
        size; a static extent only)."""
        x, dim, n = self._static_dim("split", x, dim)
        sizes = split_size_or_sections
        if isinstance(sizes, bool) or not isinstance(sizes, (int, list, tuple)):
            raise FusionDefinitionError(f"split: split_size_or_sections {sizes!r} must be an int "
                                        "or a list of ints")
        if isinstance(sizes, int):
            if sizes < 1:
                raise FusionDefinitionError(f"split: split size {sizes} must be >= 1")
            sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
        elif (any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in sizes)
              or sum(sizes) != n):
            raise FusionDefinitionError(f"split: sections {list(sizes)} must be ints >= 0 that add "
                                        f"up to the dim's size {n}")
        return self._sections(x, dim, sizes)

    def _static_dim(self, what: str, x, dim: int):
        """(x as a tensor, dim in range, its static size) for chunk and split."""
        x = self._tensor(what, 0, x)
        dims = x.domain.logical_no_reductions
        dim = self._one_dim(what, len(dims), dim)
        n = S.const_value(dims[dim].user_extent)
        if n is None:
            raise FusionDefinitionError(f"{what}: the dim must have a static size "
                                        "(from_pytorch(t, static_sizes=True), or slice)")
        return x, dim, n

    def _sections(self, x, dim: int, sizes: list) -> list:
        """Slices of x along `dim` of `sizes` elements, one after another."""
        dims = x.domain.logical_no_reductions
        out, start = [], 0
        for k in sizes:
            starts = [0] * len(dims)
            ends = [i.user_extent for i in dims]
            starts[dim], ends[dim] = start, start + k
            out.append(self.slice(x, starts, ends))
            start += k
        return out

    # Random numbers (RandOp; runtime/philox.py defines the stream) -------------------------
    def uniform(self, minval, maxval, shape, rng_seed=None, rng_offset=None,
                dtype=DataType.Float):
        """Random numbers in [minval, maxval) of `shape` (nvFuser's signature), from the
        Philox stream of `rng_seed` and `rng_offset` (int scalars, fusion inputs or constants;
        None: both drawn from torch's generator on each execute)."""
        return self._random("uniform", minval, maxval, shape, rng_seed, rng_offset, dtype)

    def normal(self, mean, std, shape, rng_seed=None, rng_offset=None, dtype=DataType.Float):
        """Normally distributed random numbers of `shape` (Box-Muller on the Philox stream)."""
        return self._random("normal", mean, std, shape, rng_seed, rng_offset, dtype)

    def rand_like(self, x, rng_seed=None, rng_offset=None):
        """torch.rand_like: uniform in [0, 1), x's shape and (floating) dtype."""
        x = self._tensor("rand_like", 0, x)
        return self._random("rand_like", 0.0, 1.0, self._shape_of(x), rng_seed, rng_offset,
                            x.dtype)

    def randn_like(self, x, rng_seed=None, rng_offset=None):
        """torch.randn_like: standard normal, x's shape and (floating) dtype."""
        x = self._tensor("randn_like", 0, x)
        return self._random("randn_like", 0.0, 1.0, self._shape_of(x), rng_seed, rng_offset,
                            x.dtype)

    @staticmethod
    def _shape_of(x) -> list:
        return [1 if i.is_broadcast and i.expanded_extent is None else i.user_extent
                for i in x.domain.logical_no_reductions]

    def _random(self, op: str, a, b, shape, seed, offset, dtype):
        self._fd._require_defining(f"ops.{op}")
        dt = parse_dtype(dtype)
        if not dt.is_floating or dt.is_float8:
            raise FusionDefinitionError(f"{op}: dtype must be floating (bf16, fp16, fp32 or "
                                        f"fp64), got {dt.short_name}")
        self._check_sizes(op, shape)
        params = []
        for name, v in (("the first parameter", a), ("the second parameter", b)):
            v = self._operand(op, name, v)
            if isinstance(v, TensorView) or (isinstance(v, Scalar) and v.dtype.is_boolean):
                raise FusionDefinitionError(f"{op}: {name} must be a number, got {_kind(v)}")
            params.append(self._scalar_of(v, DataType.Double) if isinstance(v, Scalar)
                          else float(v))
        if (seed is None) != (offset is None):
            raise FusionDefinitionError(f"{op}: give both rng_seed and rng_offset, or neither")
        if seed is None:
            seed, offset = self._fd._implicit_rng_state()
        for name, v in (("rng_seed", seed), ("rng_offset", offset)):
            if isinstance(v, bool) or not (isinstance(v, int) or (
                    isinstance(v, Scalar) and v.dtype.is_integral and not v.dtype.is_boolean)):
                raise FusionDefinitionError(f"{op}: {name} must be an int scalar, got "
                                            f"{_kind(v) if isinstance(v, Scalar) else repr(v)}")
        dist = "normal" if op in ("normal", "randn_like") else "uniform"
        return arith.rand(list(shape), dist, params[0], params[1], seed, offset, dt)

    # Indexing (GatherOp: src read at an index tensor's values) -------------------------------
    def take_along_axis(self, x, index, dim: int):
        """x's elements at `index` along `dim` (torch.take_along_dim, nvFuser's
        take_along_axis): index has x's rank; along the other dims its sizes equal x's, or are
        broadcast (1) and take x's. out[..., j, ...] = x[..., index[..., j, ...], ...]."""
        x, index, dim = self._indexing_operands("take_along_axis", x, index, dim, same_rank=True)
        rank = len(x.domain.logical_no_reductions)
        return self._gather("take_along_axis", x, index, dim, range(rank), broadcast=True)

    def gather(self, x, index, dim: int):
        """torch.gather: out has index's shape; out[..., j, ...] = x[..., index[..., j, ...],
        ...]; along the other dims the index's sizes are at most x's."""
        x, index, dim = self._indexing_operands("gather", x, index, dim, same_rank=True)
        rank = len(x.domain.logical_no_reductions)
        return self._gather("gather", x, index, dim, range(rank), broadcast=False)

    def index_select(self, x, index, dim: int):
        """torch.index_select: the slices of x at the 1-D `index`'s values along `dim`; out is x
        with dim's size len(index)."""
        x, index, dim = self._indexing_operands("index_select", x, index, dim, same_rank=False)
        if len(index.domain.logical_no_reductions) != 1:
            raise FusionDefinitionError("index_select: index must be 1-D, got rank "
                                        f"{len(index.domain.logical_no_reductions)}")
        rank = len(x.domain.logical_no_reductions)
        flags = [k != dim for k in range(rank)]
        index = self._wrap("index_select", lambda: arith.broadcast(index, flags))
        return self._gather("index_select", x, index, dim, range(rank), broadcast=True)

    def embedding(self, input, weight):
        """torch.nn.functional.embedding(input, weight): the rows of the 2-D `weight` at the
        integer ids `input`; out is input's shape + [weight's row size]."""
        weight, ids, _ = self._indexing_operands("embedding", weight, input, 0, same_rank=False,
                                                 positions=(1, 0))
        if len(weight.domain.logical_no_reductions) != 2:
            raise FusionDefinitionError("embedding: weight must be 2-D [rows, size], got rank "
                                        f"{len(weight.domain.logical_no_reductions)}")
        rank = len(ids.domain.logical_no_reductions)
        ids = self._wrap("embedding", lambda: arith.broadcast(ids, [False] * rank + [True]))
        return self._gather("embedding", weight, ids, 0, (None, rank), broadcast=True)

    # Scatters (frontend/indexing.py: one-hot compares, ScatterOp) -----------------------------
    def scatter(self, x, index, src, dim: int):
        """torch.scatter(x, dim, index, src) in nvFuser's argument order: x with src's elements
        (or the number `src`) written at index's values along `dim`: out[.., index[.., j, ..],
        ..] = src[.., j, ..] for every element j of index (of equal indices, one write wins, as
        in torch). Where index has one element along dim and its other dims are x's (a one-hot:
        cross-entropy's dlogits), it is element-wise, out[.., j, ..] = (j == index[.., 0, ..]) ?
        src : x, in the kernel of the ops around it; other scatters run as torch.scatter (a
        library segment)."""
        x, index, dim = self._indexing_operands("scatter", x, index, dim, same_rank=True)
        src = self._operand("scatter", 2, src)
        self._check_scatter_source("scatter", x, src, scalar_ok=True)
        return self._wrap("scatter", lambda: indexing.scatter(self, x, index, src, dim))

    def scatter_add(self, x, dim: int, index, src):
        """torch.scatter_add(x, dim, index, src): x plus src's elements added at index's values
        along `dim` (out[.., index[.., j, ..], ..] += src[.., j, ..]; equal indices add up).
        index, src and x have one rank; src is read at index's positions. Atomic adds into
        zeros (float32 sums for 16-bit floats) in any order: float sums vary in their last
        bits from run to run; x, unless it is zeros, is added to them after."""
        x, index, dim = self._indexing_operands("scatter_add", x, index, dim, same_rank=True)
        src = self._tensor("scatter_add", 3, src)
        self._check_scatter_source("scatter_add", x, src)

        def build():
            fitted = indexing._fit_to_index(self, "scatter_add", src, index)
            return indexing.scatter_add(self, "scatter_add", x, index, fitted, dim, exact=False)
        return self._wrap("scatter_add", build)

    def index_add(self, x, dim: int, index, src, alpha=1):
        """torch.index_add(x, dim, index, src, alpha=alpha): x plus src (times alpha) added
        along `dim` at the 1-D index's values: out[.., index[i], ..] += alpha * src[.., i, ..]
        (an embedding's backward: dweight[ids[i], :] += dy[i, :]). src has x's sizes but
        len(index) along dim. Accumulated as scatter_add is."""
        x, index, dim = self._indexing_operands("index_add", x, index, dim, same_rank=False)
        src = self._tensor("index_add", 3, src)
        if len(index.domain.logical_no_reductions) != 1:
            raise FusionDefinitionError("index_add: index must be 1-D, got rank "
                                        f"{len(index.domain.logical_no_reductions)}")
        self._check_scatter_source("index_add", x, src)
        if len(src.domain.logical_no_reductions) != len(x.domain.logical_no_reductions):
            raise FusionDefinitionError(
                f"index_add: source of rank {len(src.domain.logical_no_reductions)} for an "
                f"input of rank {len(x.domain.logical_no_reductions)}; they must have one rank")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or (
                isinstance(alpha, float) and not x.dtype.is_floating):
            raise FusionDefinitionError(f"index_add: alpha {alpha!r} must be a number (an int "
                                        "for an integer input)")
        rank = len(x.domain.logical_no_reductions)

        def build():
            s = src if alpha == 1 else self.mul(src, alpha)
            idx = arith.broadcast(index, [k != dim for k in range(rank)])
            return indexing.scatter_add(self, "index_add", x, idx, s, dim, exact=True)
        return self._wrap("index_add", build)

    def _check_scatter_source(self, op: str, x, src, scalar_ok: bool = False) -> None:
        """src of x's dtype (torch refuses another), a tensor of x's rank; no float8 adds."""
        if isinstance(src, Scalar):
            if not scalar_ok:
                raise FusionDefinitionError(f"{op}: src must be a tensor, got {_kind(src)}")
            if src.value is None:
                raise FusionDefinitionError(f"{op}: src {_kind(src)} must be a tensor or a "
                                            "number")
            return
        if src.dtype != x.dtype:
            raise FusionDefinitionError(f"{op}: src {_kind(src)} is {src.dtype.short_name} but "
                                        f"the input {_kind(x)} is {x.dtype.short_name}; they "
                                        "must have one dtype (as torch)")
        if len(src.domain.logical_no_reductions) != len(x.domain.logical_no_reductions):
            raise FusionDefinitionError(
                f"{op}: source of rank {len(src.domain.logical_no_reductions)} for an input of "
                f"rank {len(x.domain.logical_no_reductions)}; they must have one rank")
        if op != "scatter":
            self._refuse_float8(op, [(0, x), (3, src)])

    def _indexing_operands(self, op: str, x, index, dim, same_rank: bool, positions=(0, 1)):
        x, index = self._tensor(op, positions[0], x), self._tensor(op, positions[1], index)
        if not index.dtype.is_integral or index.dtype.is_boolean:
            raise FusionDefinitionError(f"{op}: index must be an integer tensor, got "
                                        f"{_kind(index)}")
        rank = len(x.domain.logical_no_reductions)
        dim = self._one_dim(op, rank, dim)
        irank = len(index.domain.logical_no_reductions)
        if same_rank and irank != rank:
            raise FusionDefinitionError(f"{op}: index of rank {irank} for an input of rank "
                                        f"{rank}; they must have one rank")
        return x, index, dim

    def _gather(self, op: str, x, index, dim: int, out_dims, broadcast: bool):
        src_dims = [None if d == dim else k for d, k in enumerate(out_dims)]
        return self._wrap(op, lambda: indexing.gather(x, index, dim, src_dims, broadcast, op))

    def iota(self, length, start=None, step=None, dtype=DataType.Int):
        """The 1-D tensor start, start + step, ... of `length` values (torch.arange(length) *
        step + start): its values come from the index, no memory is read."""
        self._fd._require_defining("ops.iota")
        dt = parse_dtype(dtype)
        if dt.is_boolean or dt.is_float8:
            raise FusionDefinitionError(f"iota: dtype must be an integer or floating type (not "
                                        f"float8), got {dt.short_name}")
        v = S.const_value(length)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise FusionDefinitionError(f"iota: length {length!r} must be a positive int")
        if v is None and not (isinstance(length, Scalar) and length.dtype.is_integral):
            raise FusionDefinitionError(f"iota: length {_kind(length)} must be an int scalar")
        ends = []
        for name, x, default in (("start", start, 0), ("step", step, 1)):
            x = default if x is None else self._operand("iota", name, x)
            if isinstance(x, TensorView) or (isinstance(x, Scalar) and x.dtype.is_boolean):
                raise FusionDefinitionError(f"iota: {name} must be a number, got {_kind(x)}")
            if isinstance(x, Scalar) and x.dtype.is_floating and dt.is_integral:
                raise FusionDefinitionError(f"iota: {name} {_kind(x)} is floating but dtype is "
                                            f"{dt.short_name}")
            ends.append(self._scalar_of(x, dt) if isinstance(x, Scalar) else x)
        return arith.iota(length, ends[0], ends[1], dt)

    def triu(self, x, diagonal: int = 0):
        """x with the elements below the `diagonal`-th diagonal of its last two dims set to 0
        (torch.triu): keeps x[..., i, j] where j - i >= diagonal. The mask is built from iota
        in the kernel."""
        return self._triangle("triu", x, diagonal)

    def tril(self, x, diagonal: int = 0):
        """x with the elements above the `diagonal`-th diagonal of its last two dims set to 0
        (torch.tril): keeps x[..., i, j] where j - i <= diagonal."""
        return self._triangle("tril", x, diagonal)

    def _triangle(self, op: str, x, diagonal):
        x = self._tensor(op, 0, x)
        dims = x.domain.logical_no_reductions
        if len(dims) < 2:
            raise FusionDefinitionError(f"{op}: {_kind(x)} has rank {len(dims)}; it needs 2 dims "
                                        "or more")
        if not isinstance(diagonal, int) or isinstance(diagonal, bool):
            raise FusionDefinitionError(f"{op}: diagonal must be an int, got {diagonal!r}")
        n_rows, n_cols = (i.user_extent for i in dims[-2:])
        dt = resize.index_dtype(n_rows, n_cols, diagonal)
        rows, cols = (self.iota(n, dtype=dt) for n in (n_rows, n_cols))
        offset = self.sub(self.broadcast(cols, [True, False]), self.broadcast(rows, [False, True]))
        keep = self.ge(offset, diagonal) if op == "triu" else self.le(offset, diagonal)
        return self.where(keep, x, Scalar(x.dtype, resize.zero_of(x.dtype)))

    def zeros(self, shape, dtype=DataType.Float):
        return self.full(shape, 0, dtype)

    def ones(self, shape, dtype=DataType.Float):
        return self.full(shape, 1, dtype)

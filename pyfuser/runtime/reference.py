"""The reference evaluator: runs any fusion with torch ops, on any device.

It is the oracle of every test (with `promote_to_double=True` every floating value is computed in
float64) and the fallback for fusions no scheduler takes. It follows the fusion expression by
expression; each value is a torch tensor shaped like its logical domain without reduction IDs.
"""
from __future__ import annotations


import math

import torch

from ..ir import scalar as S
from ..ir.dtype import DataType, from_torch, to_torch
from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, IotaOp,
                        LoadStoreOp, ReductionOp, ReductionOpType, ReshapeOp, SqueezeOp, UnaryOp,
                        UnaryOpType, WhereOp, WindowOp, GatherOp, IndexCheckOp, RandOp,
                        ScatterOp, TopKOp)
from ..ir.iter_domain import Split, id_exprs_between
from ..ir.scalar import Scalar, ScalarOp
from ..ir.tensor import TensorView
from . import library
from . import lse_key
from .arg_key import arg_key, arg_key_index, topk_in_order
from .float8 import to_float8


# logsumexp keys (ReductionOpType.LogSumExp's operand and result; runtime/lse_key.py).
_LSE_UNARY = {UnaryOpType.LseKey: lse_key.lse_key, UnaryOpType.LseMax: lse_key.lse_max,
              UnaryOpType.LseSum: lse_key.lse_sum}


# Both gelus in forms without cancellation: 0.5 x (1 + tanh(u)) is x * sigmoid(2u), and
# 0.5 x (1 + erf(x / sqrt 2)) is 0.5 x erfc(-x / sqrt 2). ATen's forms lose every digit of a
# negative x's tiny result (1 + tanh(u) is 0 in float64 below x = -7.6), while the device's
# float32 gelu_tanh keeps them: a float64 reference must be the more accurate of the two (GPU
# fuzz 2701:131, gelu_tanh(-8) = -3.2e-21 judged against ATen's 0).
def _gelu_tanh(x):
    w = x if x.dtype == torch.float64 else x.float()
    u = 0.7978845608028654 * (w + 0.044715 * w * w * w)
    return (w * torch.sigmoid(2.0 * u)).to(x.dtype)


def _gelu_erf(x):
    w = x if x.dtype == torch.float64 else x.float()
    return (0.5 * w * torch.special.erfc(w * -0.7071067811865476)).to(x.dtype)


_UNARY = {
    UnaryOpType.Neg: torch.neg,
    UnaryOpType.Abs: torch.abs,
    UnaryOpType.Exp: torch.exp,
    UnaryOpType.Exp2: torch.exp2,
    UnaryOpType.Log: torch.log,
    UnaryOpType.Sqrt: torch.sqrt,
    UnaryOpType.Rsqrt: torch.rsqrt,
    UnaryOpType.Reciprocal: torch.reciprocal,
    UnaryOpType.Tanh: torch.tanh,
    UnaryOpType.Sigmoid: torch.sigmoid,
    UnaryOpType.Erf: torch.erf,
    UnaryOpType.Relu: torch.relu,
    UnaryOpType.Silu: torch.nn.functional.silu,
    UnaryOpType.GeluTanh: _gelu_tanh,
    UnaryOpType.GeluErf: _gelu_erf,
    UnaryOpType.Not: torch.logical_not,
}

_BINARY = {
    BinaryOpType.Add: torch.add,
    BinaryOpType.Sub: torch.sub,
    BinaryOpType.Mul: torch.mul,
    BinaryOpType.Div: torch.true_divide,
    BinaryOpType.Pow: torch.pow,
    BinaryOpType.Max: torch.maximum,
    BinaryOpType.Min: torch.minimum,
    BinaryOpType.Eq: torch.eq,
    BinaryOpType.Ne: torch.ne,
    BinaryOpType.Lt: torch.lt,
    BinaryOpType.Le: torch.le,
    BinaryOpType.Gt: torch.gt,
    BinaryOpType.Ge: torch.ge,
    BinaryOpType.And: torch.logical_and,
    BinaryOpType.Or: torch.logical_or,
}

_PY_BINARY = {
    BinaryOpType.Add: lambda a, b: a + b,
    BinaryOpType.Sub: lambda a, b: a - b,
    BinaryOpType.Mul: lambda a, b: a * b,
    BinaryOpType.Div: lambda a, b: a / b,
    BinaryOpType.Pow: lambda a, b: a ** b,
    BinaryOpType.Max: max,
    BinaryOpType.Min: min,
    BinaryOpType.Eq: lambda a, b: a == b,
    BinaryOpType.Ne: lambda a, b: a != b,
    BinaryOpType.Lt: lambda a, b: a < b,
    BinaryOpType.Le: lambda a, b: a <= b,
    BinaryOpType.Gt: lambda a, b: a > b,
    BinaryOpType.Ge: lambda a, b: a >= b,
    BinaryOpType.And: lambda a, b: bool(a) and bool(b),
    BinaryOpType.Or: lambda a, b: bool(a) or bool(b),
}


class ReferenceEvaluator:
    def __init__(self, fusion, promote_to_double: bool = False):
        self.fusion = fusion
        self.promote = promote_to_double

    def _dtype(self, dtype: DataType):
        if self.promote and dtype.is_floating:
            return torch.float64
        return to_torch(dtype)

    def run(self, inputs: list, extent_bindings: dict | None = None) -> list[torch.Tensor]:
        env: dict = {}
        bindings = dict(extent_bindings or {})
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        self.device = device
        for v, x in zip(self.fusion.inputs, inputs):
            if isinstance(v, TensorView):
                env[v] = x.to(self._dtype(v.dtype)) if self.promote and v.dtype.is_floating else x
                for i, size in zip(v.domain.logical, x.shape):
                    if i.extent.value is None and i.extent.definition is None:
                        bindings.setdefault(i.extent, int(size))
                    if i.expanded_extent is not None and i.expanded_extent.value is None:
                        bindings.setdefault(i.expanded_extent, int(size))
            else:
                env[v] = float(x) if self.promote and v.dtype.is_floating else x
                bindings[v] = x
        self.bindings = bindings
        for e in self.fusion.exprs():
            self._eval(e, env)
        return [self._laid_out(o, env[o]) for o in self.fusion.outputs]

    def _laid_out(self, o: TensorView, r):
        """An output in the memory order its allocation domain asks (fd.ops.stride_order), as
        the executor allocates it (an expanded dim with stride 0: fuzz 20261404:885)."""
        if o.domain.allocation is None or not isinstance(r, torch.Tensor):
            return r
        from .inputs import lay_out
        return lay_out(o, r, r.dtype)

    def _value(self, v, env):
        if isinstance(v, TensorView):
            return env[v]
        if isinstance(v, Scalar):
            if v in env:
                return env[v]
            if v.value is not None:
                return v.value
            if v.definition is None or isinstance(v.definition, ScalarOp):
                return S.evaluate(v, self.bindings)
            self._eval(v.definition, env)
            return env[v]
        return v

    def _window(self, e: WindowOp, src, fill):
        """Each out element gathered from src at its window's index, `fill` where a guard fails
        (the index is clamped there, its value unused)."""
        out = e.outputs[0]
        shape = [self._extent(i.user_extent) for i in out.domain.logical]
        rank = len(shape)
        index, valid = [], torch.ones(shape, dtype=torch.bool, device=self.device)
        for k, (w, n) in enumerate(zip(e.windows, shape)):
            j = torch.arange(n, device=self.device)
            if w is not None:
                for a, b, lo, hi in w.guards:
                    v = self._extent(a) + b * j
                    ok = (v >= self._extent(lo)) & (v < self._extent(hi))
                    valid &= ok.view([1] * k + [n] + [1] * (rank - k - 1))
                j = self._extent(w.offset) + w.step * j
            j = j.clamp(0, max(src.shape[k] - 1, 0))
            index.append(j.view([1] * k + [n] + [1] * (rank - k - 1)))
        if src.dtype.is_floating_point and from_torch(src.dtype).is_float8:
            # Converted as a cast converts (torch.tensor(500.0, dtype=float8) refuses it).
            fill = to_float8(torch.tensor(float(fill)), from_torch(src.dtype))
        fill = torch.as_tensor(fill, dtype=src.dtype).to(self.device)
        if src.numel() == 0:
            return fill.expand(shape).clone()
        return torch.where(valid, src[tuple(index)], fill)

    def _random(self, e: RandOp, seed, offset, a, b):
        """The op's stream (runtime/philox.py) at every row-major index of out, computed in
        float32 and rounded to out's dtype as the kernels do, whatever precision the evaluator
        runs in: random numbers are data, like an input's."""
        import torch

        from ..ir.dtype import to_torch
        from .philox import draw
        out = e.outputs[0]
        shape = [self._extent(i.user_extent) for i in out.domain.logical]
        index = torch.arange(math.prod(shape), dtype=torch.int64).numpy()
        values = draw(e.dist, out.dtype.value[0], index, int(seed), int(offset), e.stream,
                      float(a), float(b))
        return torch.from_numpy(values).reshape(shape).to(to_torch(out.dtype)).to(self.device)

    def _gather(self, e: GatherOp, src, index):
        """src at index's values along e.dim, at out's own index along the other dims (a dim
        src broadcasts reads its one element); IndexOutOfRange for a value outside the dim."""
        import torch

        from .index_check import IndexOutOfRange, index_error_message
        out = e.outputs[0]
        shape = [self._extent(i.user_extent) for i in out.domain.logical]
        rank = len(shape)
        idx = index.to(torch.int64).expand(shape)
        n = src.shape[e.dim]
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            value = int(idx[bad].flatten()[0])
            raise IndexOutOfRange(index_error_message(e.what, e.dim, value, n))
        where = []
        for d, k in enumerate(e.src_dims):
            if k is None:
                where.append(idx)
            elif src.shape[d] == 1:
                where.append(torch.zeros([1] * rank, dtype=torch.int64, device=self.device))
            else:
                j = torch.arange(shape[k], device=self.device)
                where.append(j.view([1] * k + [shape[k]] + [1] * (rank - k - 1)))
        if 0 in shape:
            return torch.empty(shape, dtype=src.dtype, device=self.device)
        return src[tuple(where)].expand(shape)

    def _check_index(self, e: IndexCheckOp, index, n: int):
        """index itself; IndexOutOfRange for a value outside [0, n), as the kernel reports."""
        from .index_check import IndexOutOfRange, index_error_message
        bad = (index < 0) | (index >= n)
        if bad.any():
            raise IndexOutOfRange(index_error_message(e.what, e.dim,
                                                      int(index[bad].flatten()[0]), n))
        return index

    def _extent(self, s) -> int:
        return int(S.evaluate(s, self.bindings))

    def _eval(self, e, env) -> None:
        out = e.outputs[0]
        ins = [self._value(i, env) for i in e.inputs]
        if isinstance(out, Scalar):
            env[out] = self._eval_scalar(e, ins)
            return
        od = self._dtype(out.dtype)
        if isinstance(e, UnaryOp):
            x = ins[0]
            if e.op in (UnaryOpType.Cast, UnaryOpType.Set):
                r = x.to(od)
            elif e.op == UnaryOpType.ArgKeyIndex:
                r = arg_key_index(x)
            elif e.op in _LSE_UNARY:
                r = _LSE_UNARY[e.op](x)
            else:
                r = _UNARY[e.op](x.to(self._compute_dtype(x, od)))
        elif isinstance(e, BinaryOp):
            a, b = ins
            if e.op.is_arg_key:
                r = arg_key(a, b, e.op == BinaryOpType.ArgMaxKey)
            elif e.op.is_comparison or e.op.is_logical:
                r = _BINARY[e.op](*self._common(a, b))
            else:
                # 16-bit floats compute in float32 and round once, as torch (and kernels) do;
                # a Python scalar operand is not rounded to 16 bits first.
                cd = torch.float32 if od in (torch.float16, torch.bfloat16) else od
                a, b = self._as_operands(a, b, cd)
                r = _BINARY[e.op](a, b)
        elif isinstance(e, WhereOp):
            c, a, b = ins
            a, b = self._as_operands(a, b, od)
            r = torch.where(c if isinstance(c, torch.Tensor) else torch.tensor(bool(c)), a, b)
        elif isinstance(e, LoadStoreOp):
            r = ins[0]
            if out.domain.root is not None:
                root = out.domain.root
                perm = [root.index(i) for i in out.domain.logical]
                r = r.permute(perm)
        elif isinstance(e, BroadcastOp):
            r = ins[0]
            for k, new in enumerate(e.is_broadcast_dim):
                if new:
                    r = r.unsqueeze(k)
        elif isinstance(e, ExpandOp):
            sizes = [self._extent(i.user_extent) for i in out.domain.logical]
            r = ins[0].expand(sizes)
        elif isinstance(e, SqueezeOp):
            r = ins[0]
            for k in reversed([k for k, f in enumerate(e.is_squeezed) if f]):
                if r.shape[k] == 0:
                    # An expanded dim of size 0 (a sum over it, the frontend's squeeze times
                    # its extent 0): no element to keep; any finite value gives the sum's 0.
                    r = r.new_zeros(r.shape[:k] + r.shape[k + 1:])
                else:
                    # A size-1 dim, or an expanded one (stride 0): its first element.
                    r = r.select(k, 0)
        elif isinstance(e, ReshapeOp):
            sizes = [self._extent(i.user_extent) for i in out.domain.logical]
            r = ins[0].reshape(sizes)
        elif isinstance(e, ReductionOp):
            r = self._reduce(e, ins[0], od)
        elif isinstance(e, FullOp):
            sizes = [self._extent(i.user_extent) for i in out.domain.logical]
            r = torch.full(sizes, ins[0], dtype=od, device=self.device)
        elif isinstance(e, WindowOp):
            r = self._window(e, ins[0], ins[1])
        elif isinstance(e, GatherOp):
            r = self._gather(e, ins[0], ins[1])
        elif isinstance(e, RandOp):
            r = self._random(e, *ins)
        elif isinstance(e, IotaOp):
            n = self._extent(out.domain.logical[0].user_extent)
            wide = torch.float64 if out.dtype.is_floating else torch.int64
            r = torch.arange(n, dtype=wide, device=self.device) * ins[1] + ins[0]
        elif isinstance(e, IndexCheckOp):
            r = self._check_index(e, ins[0], int(ins[1]))
        elif isinstance(e, ScatterOp):
            def size(i):
                return self._extent(i.maybe_expanded_extent)
            r = library.scatter_values(e, ins[0], ins[1], ins[2] if len(ins) > 2 else None,
                                       [size(i) for i in out.domain.logical],
                                       [size(i) for i in out.domain.maybe_root], od)
        elif isinstance(e, TopKOp):
            # The kernel's order (ties by index), which torch.topk leaves open.
            k = e.k if e.k is not None else int(ins[1])
            r, env[e.outputs[1]] = topk_in_order(ins[0], k, e.dim, e.largest)
        elif type(e) in library.IMPLEMENTATIONS:
            # What the plans' library segments run (float64 operands with promote_to_double).
            r, *more = library.run_library_op(e, ins)
            for o, v in zip(e.outputs[1:], more):      # topk's indices
                env[o] = v
        else:
            raise NotImplementedError(f"reference evaluator: no rule for {type(e).__name__}")
        if isinstance(r, torch.Tensor) and out.dtype.is_float8 and (self.promote or r.dtype != od):
            # A float8 value is rounded to float8 wherever it is made, in the float64 run too:
            # its rounding (e4m3's saturation at 448) is the value, not an error to measure.
            r = to_float8(r, out.dtype).to(od)
        elif isinstance(r, torch.Tensor) and r.dtype != od:
            r = r.to(od)
        env[out] = r

    def _compute_dtype(self, x, od):
        if od.is_floating_point:
            return od if not x.dtype.is_floating_point or x.dtype.itemsize < od.itemsize else x.dtype
        return x.dtype

    def _as_operands(self, a, b, od):
        """Operands of an arithmetic op in the output's dtype (torch's promotion already chose it)."""
        def conv(x):
            if isinstance(x, torch.Tensor):
                return x.to(od)
            if od.is_floating_point and from_torch(od).is_float8:
                # As a cast converts it (torch.tensor(500.0, dtype=float8) refuses it).
                return to_float8(torch.tensor(float(x)), from_torch(od)).to(self.device)
            return torch.tensor(x, dtype=od, device=self.device)
        return conv(a), conv(b)

    def _common(self, a, b):
        """Operands of a comparison or logical op in torch's result type of the pair (a Python
        scalar only lifts the category: bool_tensor == 3 compares in int64, not bool)."""
        dt = torch.result_type(a, b)

        def conv(x):
            if isinstance(x, torch.Tensor):
                return x.to(dt)
            return torch.tensor(x, dtype=dt, device=self.device)
        return conv(a), conv(b)

    def _reduce(self, e: ReductionOp, x, od):
        out = e.outputs[0]
        root = out.domain.maybe_root
        if out.domain.root is not None and out.domain.logical != out.domain.root:
            # An rfactor's partial reduction: its logical domain splits/merges the root.
            x = self._transform(x, out.domain.root, out.domain.logical, self._value(e.init, {}))
            root = out.domain.logical
        dims = [k for k, i in enumerate(root) if i.is_reduction]
        # A reduction over an expanded broadcast dim sees the expanded size.
        if e.op == ReductionOpType.LogSumExp:
            r = lse_key.lse_reduce(x, dims)
        elif e.op == ReductionOpType.Sum:
            acc = od if od.is_floating_point else torch.int64
            if x.dtype.is_floating_point and x.dtype.itemsize < 4 and not self.promote:
                acc = torch.float32
            r = torch.sum(x.to(acc), dim=dims) if dims else x.to(acc)
        elif any(x.shape[k] == 0 for k in dims):
            # A max or min of no elements is its start value (-inf / +inf), as in the kernels;
            # check_inputs refuses inputs where such a value would reach an output element.
            kept = [s for k, s in enumerate(x.shape) if k not in dims]
            r = torch.full(kept, self._value(e.init, {}), dtype=x.dtype, device=x.device)
        elif e.op == ReductionOpType.Max:
            r = torch.amax(x, dim=dims) if dims else x
        else:
            r = torch.amin(x, dim=dims) if dims else x
        return r.to(od)

    def _transform(self, x, start: list, target: list, pad_value):
        """x (dims = `start` IDs) laid out along `target` IDs by replaying the Split/Merge exprs
        between them; the padding of a non-divisible split holds `pad_value`."""
        ids = list(start)
        for t in id_exprs_between(start, target):
            if isinstance(t, Split):
                k = ids.index(t.in_id)
                size, f = x.shape[k], self._extent(t.factor)
                n = -(-size // f)
                outer, inner = (n, f) if t.inner_split else (f, n)
                if outer * inner != size:
                    pad_shape = list(x.shape)
                    pad_shape[k] = outer * inner - size
                    x = torch.cat([x, torch.full(pad_shape, pad_value, dtype=x.dtype,
                                                 device=x.device)], dim=k)
                x = x.reshape(*x.shape[:k], outer, inner, *x.shape[k + 1:])
                ids[k:k + 1] = [t.outer, t.inner]
            else:
                ko, ki = ids.index(t.outer), ids.index(t.inner)
                perm = [d for d in range(len(ids)) if d != ki]
                perm.insert(perm.index(ko) + 1, ki)
                x = x.permute(perm)
                ids = [ids[d] for d in perm]
                k = ids.index(t.outer)
                x = x.reshape(*x.shape[:k], x.shape[k] * x.shape[k + 1], *x.shape[k + 2:])
                ids[k:k + 2] = [t.out]
        return x.permute([ids.index(i) for i in target])

    def _eval_scalar(self, e, ins):
        if isinstance(e, ScalarOp):
            # Integer extent math (e.g. the element count i0 * i2 of a mean over two dims).
            return S.evaluate(e.outputs[0], self.bindings)
        if isinstance(e, BinaryOp):
            return _PY_BINARY[e.op](*ins)
        if isinstance(e, UnaryOp):
            x = ins[0]
            if e.op == UnaryOpType.Cast:
                dt = e.outputs[0].dtype
                return float(x) if dt.is_floating else (bool(x) if dt.is_boolean else int(x))
            t = torch.tensor(x, dtype=torch.float64)
            return float(_UNARY[e.op](t)) if e.op != UnaryOpType.Set else x
        raise NotImplementedError(f"reference evaluator: scalar {type(e).__name__}")


def evaluate(fusion, inputs: list, promote_to_double: bool = False,
             extent_bindings: dict | None = None, *, all_outputs: bool = False) -> list[torch.Tensor]:
    """Outputs of `fusion` on `inputs`, computed with torch (float64 if asked).

    As execute does, in-place outputs (fd.add_output(t, alias_input=x)) are written into their
    inputs and only the returned outputs are returned. With `all_outputs`, nothing is written:
    every entry of fusion.outputs is returned, in-place ones included (what plans compute, and
    what tests compare the updated inputs with)."""
    outs = ReferenceEvaluator(fusion, promote_to_double).run(inputs, extent_bindings)
    if all_outputs or not fusion.output_aliases:
        return outs
    from .output_aliases import write_aliased_outputs
    return write_aliased_outputs(fusion, inputs, outs)



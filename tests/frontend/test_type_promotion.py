"""Type promotion at definition time matches torch.result_type, checked on real tensors."""
import itertools

import pytest
import torch

from pyfuser import DataType, FusionDefinition, FusionDefinitionError
from pyfuser.ir.dtype import to_torch

DTYPES = [DataType.Bool, DataType.Int32, DataType.Int, DataType.Half, DataType.BFloat16,
          DataType.Float, DataType.Double]
SCALARS = [True, 3, -2.5, 0.1]
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow,
          "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
          "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or}


def _rand(dtype, shape=(3, 5)):
    t = torch.randn(*shape) * 3
    if dtype == DataType.Bool:
        return t > 0
    if dtype.is_integral:
        return t.round().to(to_torch(dtype))
    return t.to(to_torch(dtype))


def _torch_or_none(fn):
    try:
        return fn()
    except RuntimeError:
        return None


def _assert_values(got, want, scalar=None, op=None):
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype in (torch.float16, torch.bfloat16) and scalar is not None:
        # torch itself rounds a Python scalar to 16 bits in some ops (add) and not in others
        # (mul), and computes x ** 3 in 16 bits; pyfuser computes in float32 with the scalar
        # unrounded and rounds once, as its kernels do: allow one rounding step.
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, equal_nan=True)
    elif op == "pow" and scalar is not None and got.dtype.is_floating_point:
        # torch computes x ** 3 as x * x * x (two roundings); pyfuser calls pow.
        torch.testing.assert_close(got, want, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("op", list(BINARY))
def test_tensor_tensor_all_dtype_pairs(op):
    for a, b in itertools.product(DTYPES, DTYPES):
        ta, tb = _rand(a), _rand(b)
        want = _torch_or_none(lambda: BINARY[op](ta, tb))
        with FusionDefinition() as fd:
            x, y = fd.define_tensor([-1, -1], dtype=a), fd.define_tensor([-1, -1], dtype=b)
            if want is None:
                with pytest.raises(FusionDefinitionError, match=rf"^{op}: "):
                    getattr(fd.ops, op)(x, y)
                fd.add_output(fd.ops.set(x))
                continue
            out = getattr(fd.ops, op)(x, y)
            fd.add_output(out)
        if op in ("add", "sub", "mul", "maximum", "minimum", "pow"):
            assert want.dtype == torch.result_type(ta, tb)
        assert to_torch(out.dtype) == want.dtype, (op, a, b)
        (got,) = fd.execute([ta, tb])
        _assert_values(got, want)


def _div(a, b):
    if isinstance(a, torch.Tensor):
        return a / b
    # Python's 2.5 / t is t.reciprocal() * 2.5 in torch (two roundings): divide in torch's
    # result type (float32 for 16-bit floats) instead.
    out = torch.result_type(b, a)
    if not out.is_floating_point:
        out = torch.get_default_dtype()
    ct = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    return (torch.as_tensor(a, dtype=ct) / b.to(ct)).to(out)


def _logical_and(a, b):
    return torch.logical_and(torch.as_tensor(a), torch.as_tensor(b))


SCALAR_MIX = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
              "div": lambda a, b: _div(a, b), "pow": lambda a, b: a ** b, "eq": lambda a, b: a == b,
              "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b, "logical_and": _logical_and}


@pytest.mark.parametrize("op", list(SCALAR_MIX))
def test_tensor_scalar_mixes(op):
    for a, s, reverse in itertools.product(DTYPES, SCALARS, (False, True)):
        if op == "pow" and a == DataType.Bool and s is True and not reverse:
            continue  # torch quirk: bool_tensor ** True is bool, bool ** bool tensors raise
        ta = _rand(a)
        want = _torch_or_none(lambda: SCALAR_MIX[op](s, ta) if reverse else SCALAR_MIX[op](ta, s))
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=a)
            fn = getattr(fd.ops, op)
            if want is None:
                with pytest.raises(FusionDefinitionError, match=rf"^{op}: "):
                    fn(s, x) if reverse else fn(x, s)
                fd.add_output(fd.ops.set(x))
                continue
            out = fn(s, x) if reverse else fn(x, s)
            fd.add_output(out)
        assert to_torch(out.dtype) == want.dtype, (op, a, s, reverse)
        (got,) = fd.execute([ta])
        _assert_values(got, want, s, op)


@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("sdtype, value", [(DataType.Double, 1.5), (DataType.Int, 2),
                                           (DataType.Bool, True)])
def test_tensor_with_runtime_scalar_input(a, sdtype, value):
    ta = _rand(a)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=a)
        s = fd.define_scalar(dtype=sdtype)
        out = fd.ops.mul(x, s)
        fd.add_output(out)
    want = ta * value
    assert to_torch(out.dtype) == want.dtype == torch.result_type(ta, value)
    (got,) = fd.execute([ta, value])
    _assert_values(got, want, value)


FLOAT_UNARY = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
               "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
               "reciprocal": torch.reciprocal, "exp2": torch.exp2}


@pytest.mark.parametrize("op", list(FLOAT_UNARY))
def test_float_unary_ops_promote_integers_to_float32(op):
    for a in DTYPES:
        ta = _rand(a).abs() if a != DataType.Bool else _rand(a)
        want = FLOAT_UNARY[op](ta)
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=a)
            out = getattr(fd.ops, op)(x)
            fd.add_output(out)
        assert to_torch(out.dtype) == want.dtype, (op, a)
        (got,) = fd.execute([ta])
        _assert_values(got, want)


@pytest.mark.parametrize("op, fn", [("neg", torch.neg), ("abs", torch.abs), ("relu", torch.relu),
                                    ("logical_not", torch.logical_not)])
def test_same_type_unary_ops(op, fn):
    for a in DTYPES:
        ta = _rand(a)
        want = _torch_or_none(lambda: fn(ta))
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=a)
            if want is None:
                with pytest.raises(FusionDefinitionError, match=rf"^{op}: operand 0 \(T0\) is "
                                                                r"bool"):
                    getattr(fd.ops, op)(x)
                fd.add_output(fd.ops.set(x))
                continue
            out = getattr(fd.ops, op)(x)
            fd.add_output(out)
        assert to_torch(out.dtype) == want.dtype, (op, a)
        (got,) = fd.execute([ta])
        _assert_values(got, want)


def test_where_promotion():
    cond = torch.randn(3, 5) > 0
    for a, b in itertools.product(DTYPES, DTYPES):
        ta, tb = _rand(a), _rand(b)
        want = torch.where(cond, ta, tb)
        with FusionDefinition() as fd:
            c = fd.define_tensor([-1, -1], dtype=DataType.Bool)
            x, y = fd.define_tensor([-1, -1], dtype=a), fd.define_tensor([-1, -1], dtype=b)
            out = fd.ops.where(c, x, y)
            fd.add_output(out)
        assert to_torch(out.dtype) == want.dtype, (a, b)
        (got,) = fd.execute([cond, ta, tb])
        _assert_values(got, want)
    for a, s in itertools.product(DTYPES, SCALARS):
        ta = _rand(a)
        want = torch.where(cond, ta, s)
        with FusionDefinition() as fd:
            c = fd.define_tensor([-1, -1], dtype=DataType.Bool)
            x = fd.define_tensor([-1, -1], dtype=a)
            out = fd.ops.where(c, s, x)
            fd.add_output(out)
        (got,) = fd.execute([cond, ta])
        _assert_values(got, torch.where(cond, s, ta), s)


def test_sub_with_bool_operand_raises_naming_the_operand():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        m = fd.define_tensor([-1], dtype=DataType.Bool)
        with pytest.raises(FusionDefinitionError, match=r"^sub: operand 1 \(T1\) is bool"):
            fd.ops.sub(x, m)
        with pytest.raises(FusionDefinitionError, match=r"^sub: operand 0 \(scalar true\) is bool"):
            fd.ops.sub(True, x)
        fd.add_output(fd.ops.set(x))


def test_reductions_keep_or_widen_types_as_torch():
    for a in DTYPES:
        ta = _rand(a)
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=a)
            s = fd.ops.sum(x, [1])
            fd.add_output(s)
            if a != DataType.Bool:
                fd.add_output(fd.ops.max(x, [0]))
        outs = fd.execute([ta])
        want = ta.sum(1)
        assert outs[0].dtype == want.dtype, a
        torch.testing.assert_close(outs[0], want, rtol=1e-2 if a.is_reduced_float else 1e-6,
                                   atol=1e-2 if a.is_reduced_float else 1e-6)
        if a != DataType.Bool:
            assert torch.equal(outs[1], ta.amax(0))


@pytest.mark.parametrize("dtype", [DataType.Half, DataType.BFloat16])
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_16_bit_reductions_accumulate_in_float(dtype, op):
    """The reduction itself is float32 (what the kernel's accumulators, partials and workspaces
    hold), between a cast of the input and one rounding of the result, as torch computes it."""
    from pyfuser.ir.exprs import ReductionOp, UnaryOp, UnaryOpType
    ta = _rand(dtype, (6, 300))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        out = getattr(fd.ops, op)(x, [1])
        fd.add_output(out)
    assert out.dtype == dtype
    (red,) = [e for e in fd.fusion.exprs() if isinstance(e, ReductionOp)]
    assert red.outputs[0].dtype == DataType.Float
    src = red.inputs[0].definition
    assert isinstance(src, UnaryOp) and src.op == UnaryOpType.Cast and src.inputs[0] is x
    last = out.definition
    assert isinstance(last, UnaryOp) and last.op == UnaryOpType.Cast     # the one rounding
    want = {"sum": lambda t: t.sum(1), "max": lambda t: t.amax(1), "mean": lambda t: t.mean(1)}[op]
    from pyfuser.runtime.reference import evaluate
    (got,) = evaluate(fd.fusion, [ta])
    assert got.dtype == want(ta).dtype
    torch.testing.assert_close(got, want(ta), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("shape,dims,keepdim", [([-1, 1], [1], False), ([1, -1], [0], True),
                                                ([1, -1, 1], [0, 2], False),
                                                ([1, -1, -1], [0, 2], True)])
def test_reducing_size_1_dims_squeezes_them(op, shape, dims, keepdim):
    """A size-1 (broadcast) dim reduces to its one element: the frontend squeezes it, so no
    ReductionOp runs over a broadcast ID (the schedulers cannot split one); other dims still
    reduce."""
    from pyfuser.ir.exprs import ReductionOp, SqueezeOp
    from pyfuser.runtime.inputs import check_inputs
    from pyfuser.runtime.reference import evaluate
    ta = torch.randn(*[6 if s == -1 else 1 for s in shape])
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape)
        fd.add_output(getattr(fd.ops, op)(x, dims, keepdim=keepdim))
    exprs = fd.fusion.exprs()
    assert isinstance(exprs[0], SqueezeOp) and exprs[0].inputs[0] is x
    for e in exprs:
        if isinstance(e, ReductionOp):
            assert not any(i.is_broadcast for i in e.outputs[0].domain.maybe_root)
    assert any(isinstance(e, ReductionOp) for e in exprs) == (-1 in [shape[d] for d in dims])
    want = {"sum": torch.sum, "max": torch.amax, "mean": torch.mean}[op](ta, dims, keepdim=keepdim)
    (got,) = evaluate(fd.fusion, [ta], extent_bindings=check_inputs(fd.fusion, [ta]))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)

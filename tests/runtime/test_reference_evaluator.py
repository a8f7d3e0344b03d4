"""The reference evaluator against hand-written torch (and torch autograd for the backward
passes), on fresh random inputs each run. The seed is printed, so a failure can be replayed."""
import os

import pytest
import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.runtime.reference import evaluate

EPS = 1e-5
F32 = DataType.Float


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")  # shown by pytest when the test fails
    return torch.Generator().manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _tol(dtype):
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
            torch.float16: dict(rtol=2e-3, atol=2e-3),
            torch.float64: dict(rtol=1e-12, atol=1e-12)}[dtype]


def _dt(torch_dtype):
    return {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
            torch.float16: DataType.Half}[torch_dtype]


# Fusions, written as a user would ------------------------------------------------------------
def _f(fd, t):
    return fd.ops.cast(t, F32)


def rmsnorm_fwd(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        w = fd.define_tensor([-1], dtype=dt)
        eps = fd.define_scalar(dtype=DataType.Double)
        xf = _f(fd, x)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), eps))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(xf, rstd), _f(fd, w)), dt))
    return fd


def rmsnorm_bwd(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        dy = fd.define_tensor([-1, -1], dtype=dt)
        w = fd.define_tensor([-1], dtype=dt)
        rstd = fd.define_tensor([-1, 1], dtype=F32)
        xhat = fd.ops.mul(_f(fd, x), rstd)
        g = fd.ops.mul(_f(fd, dy), _f(fd, w))
        c = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
        dx = fd.ops.mul(fd.ops.sub(g, fd.ops.mul(xhat, c)), rstd)
        dw = fd.ops.sum(fd.ops.mul(_f(fd, dy), xhat), [0])
        fd.add_output(fd.ops.cast(dx, dt))
        fd.add_output(fd.ops.cast(dw, dt))
    return fd


def layernorm_fwd(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        w = fd.define_tensor([-1], dtype=dt)
        b = fd.define_tensor([-1], dtype=dt)
        xf = _f(fd, x)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
        y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), _f(fd, w)), _f(fd, b))
        fd.add_output(fd.ops.cast(y, dt))
        fd.add_output(mean)
        fd.add_output(rstd)
    return fd


def layernorm_bwd(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        dy = fd.define_tensor([-1, -1], dtype=dt)
        w = fd.define_tensor([-1], dtype=dt)
        mean = fd.define_tensor([-1, 1], dtype=F32)
        rstd = fd.define_tensor([-1, 1], dtype=F32)
        xhat = fd.ops.mul(fd.ops.sub(_f(fd, x), mean), rstd)
        dyf = _f(fd, dy)
        g = fd.ops.mul(dyf, _f(fd, w))
        c1 = fd.ops.mean(g, [1], keepdim=True)
        c2 = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
        dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(g, c1), fd.ops.mul(xhat, c2)), rstd)
        fd.add_output(fd.ops.cast(dx, dt))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), dt))
        fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), dt))
    return fd


def softmax(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        xf = _f(fd, x)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), dt))
    return fd


def gelu_chain(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        b = fd.define_tensor([-1], dtype=dt)
        h = fd.ops.add(_f(fd, x), _f(fd, b))
        y = fd.ops.mul(fd.ops.gelu(h, approximate="tanh"), fd.ops.sigmoid(h))
        z = fd.ops.sub(fd.ops.gelu(y), fd.ops.mul(fd.ops.tanh(h), 0.5))
        fd.add_output(fd.ops.cast(z, dt))
    return fd


# Hand-written torch ---------------------------------------------------------------------------
def t_rmsnorm_fwd(x, w, eps, math=torch.float32):
    xf = x.to(math)
    return [(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.to(math))]


def t_softmax(x, math=torch.float32):
    return [torch.softmax(x.to(math), -1)]


def t_gelu_chain(x, b, math=torch.float32):
    h = x.to(math) + b.to(math)
    y = F.gelu(h, approximate="tanh") * torch.sigmoid(h)
    return [F.gelu(y) - torch.tanh(h) * 0.5]


def t_layernorm_fwd(x, w, b, math=torch.float32):
    xf = x.to(math)
    var, mean = torch.var_mean(xf, -1, correction=0, keepdim=True)
    y = F.layer_norm(xf, (x.shape[-1],), w.to(math), b.to(math), EPS)
    return [y, mean, torch.rsqrt(var + EPS)]


def autograd_rmsnorm_bwd(x, dy, w, math=torch.float32):
    """dx, dw of y = x * rstd * w by autograd; rstd as the forward saved it."""
    xf = x.to(math).requires_grad_()
    wf = w.to(math).requires_grad_()
    y = t_rmsnorm_fwd(xf, wf, 0.0, math)[0]
    y.backward(dy.to(math))
    rstd = torch.rsqrt(x.to(math).pow(2).mean(-1, keepdim=True))
    return [xf.grad, wf.grad], rstd


def autograd_layernorm_bwd(x, dy, w, math=torch.float32):
    xf = x.to(math).requires_grad_()
    wf = w.to(math).requires_grad_()
    bf = torch.zeros_like(wf).requires_grad_()
    y = F.layer_norm(xf, (x.shape[-1],), wf, bf, EPS)
    y.backward(dy.to(math))
    var, mean = torch.var_mean(x.to(math), -1, correction=0, keepdim=True)
    return [xf.grad, wf.grad, bf.grad], mean, torch.rsqrt(var + EPS)


def _close(outs, wants, dtype):
    assert len(outs) == len(wants)
    for k, (o, w) in enumerate(zip(outs, wants)):
        assert o.shape == w.shape, (k, o.shape, w.shape)
        tol = _tol(o.dtype) if o.dtype == dtype else _tol(torch.float32)
        torch.testing.assert_close(o, w.to(o.dtype), **tol, msg=lambda m: f"output {k}: {m}")


SHAPES = [(16, 64), (7, 33), (1, 129)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_fwd(gen, shape, dtype):
    x, w = _randn(gen, *shape, dtype=dtype), _randn(gen, shape[1], dtype=dtype)
    fd = rmsnorm_fwd(_dt(dtype))
    outs = evaluate(fd.fusion, [x, w, 1e-6])
    assert outs[0].dtype == dtype
    _close(outs, t_rmsnorm_fwd(x, w, 1e-6), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_bwd_vs_autograd(gen, shape, dtype):
    x, dy = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
    w = _randn(gen, shape[1], dtype=dtype)
    wants, rstd = autograd_rmsnorm_bwd(x, dy, w)
    outs = evaluate(rmsnorm_bwd(_dt(dtype)).fusion, [x, dy, w, rstd])
    _close(outs, wants, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_fwd(gen, shape, dtype):
    x, w, b = (_randn(gen, *shape, dtype=dtype), _randn(gen, shape[1], dtype=dtype),
               _randn(gen, shape[1], dtype=dtype))
    outs = evaluate(layernorm_fwd(_dt(dtype)).fusion, [x, w, b])
    _close(outs, t_layernorm_fwd(x, w, b), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_bwd_vs_autograd(gen, shape, dtype):
    x, dy = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
    w = _randn(gen, shape[1], dtype=dtype)
    wants, mean, rstd = autograd_layernorm_bwd(x, dy, w)
    outs = evaluate(layernorm_bwd(_dt(dtype)).fusion, [x, dy, w, mean, rstd])
    _close(outs, wants, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
def test_softmax(gen, shape, dtype):
    x = _randn(gen, *shape, dtype=dtype) * 4
    outs = evaluate(softmax(_dt(dtype)).fusion, [x])
    _close(outs, t_softmax(x), dtype)
    torch.testing.assert_close(outs[0].float().sum(-1), torch.ones(shape[0]), **_tol(dtype))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_chain(gen, shape, dtype):
    x, b = _randn(gen, *shape, dtype=dtype), _randn(gen, shape[1], dtype=dtype)
    outs = evaluate(gelu_chain(_dt(dtype)).fusion, [x, b])
    _close(outs, t_gelu_chain(x, b), dtype)


# promote_to_double: every floating value in float64 ---------------------------------------------
def test_promote_to_double_norms_and_softmax(gen):
    M, N = 9, 70
    f64 = torch.float64
    x, dy = _randn(gen, M, N), _randn(gen, M, N)
    w, b = _randn(gen, N), _randn(gen, N)
    cases = [
        (rmsnorm_fwd(F32), [x, w, 1e-6], t_rmsnorm_fwd(x, w, 1e-6, f64)),
        (softmax(F32), [x], t_softmax(x, f64)),
        (gelu_chain(F32), [x, b], t_gelu_chain(x, b, f64)),
        (layernorm_fwd(F32), [x, w, b], t_layernorm_fwd(x, w, b, f64)),
    ]
    wants, rstd = autograd_rmsnorm_bwd(x, dy, w, f64)
    cases.append((rmsnorm_bwd(F32), [x, dy, w, rstd.float()], None))
    wants_ln, mean, rstd_ln = autograd_layernorm_bwd(x, dy, w, f64)
    cases.append((layernorm_bwd(F32), [x, dy, w, mean.float(), rstd_ln.float()], None))
    for k, (fd, inputs, want) in enumerate(cases):
        outs = evaluate(fd.fusion, inputs, promote_to_double=True)
        assert all(o.dtype == f64 for o in outs), k
        outs32 = evaluate(fd.fusion, inputs)
        assert all(o.dtype == torch.float32 for o in outs32), k
        if want is None:
            continue
        for o, w_ in zip(outs, want):
            torch.testing.assert_close(o, w_, rtol=1e-12, atol=1e-12)
    # Backward passes: the float64 run of the fusion, fed float32 rstd/mean, against float64
    # autograd fed the same rounded statistics (dx depends on them linearly).
    fd = rmsnorm_bwd(F32)
    r32 = rstd.float()
    dx, dw = evaluate(fd.fusion, [x, dy, w, r32], promote_to_double=True)
    xhat = x.double() * r32.double()
    g = dy.double() * w.double()
    torch.testing.assert_close(dx, (g - xhat * (g * xhat).mean(1, keepdim=True)) * r32.double(),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, (dy.double() * xhat).sum(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, wants[0], rtol=1e-5, atol=1e-5)


def test_promote_to_double_is_more_exact_than_float32(gen):
    # A sum whose float32 rounding is visible: float64 evaluation matches float64 torch exactly.
    x = _randn(gen, 4, 4096) * 1000 + 1
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [1]))
    (out64,) = evaluate(fd.fusion, [x], promote_to_double=True)
    torch.testing.assert_close(out64, (x.double() ** 2).sum(1), rtol=1e-14, atol=0)


def test_runtime_scalar_and_symbolic_count(gen):
    x = _randn(gen, 5, 6, 7)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(fd.ops.mean(t, [0, 2]), s))
    (out,) = evaluate(fd.fusion, [x, 3.0])
    torch.testing.assert_close(out, x.mean((0, 2)) * 3.0)


@pytest.mark.parametrize("sizes, expanded, new", [
    ([15, 4], [False, True], [60]), ([15, 4], [False, True], [-1, 12]),
    ([5, 3, 4], [True, False, False], [-1, 6]), ([4, 3], [True, True], [2, -1])])
def test_reshape_of_expanded_dims(gen, sizes, expanded, new):
    """A reshape that merges an expanded (stride-0) dim holds its expanded size of elements
    (the output shape was the unexpanded one: "shape '[15]' is invalid for input of size 60")."""
    from pyfuser.runtime.inputs import check_inputs
    x = _randn(gen, *[1 if e else s for s, e in zip(sizes, expanded)]).expand(sizes)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(sizes), expanded=expanded)
        fd.add_output(fd.ops.mul(fd.ops.reshape(t, new), 2.0))
    (out,) = evaluate(fd.fusion, [x], extent_bindings=check_inputs(fd.fusion, [x]))
    torch.testing.assert_close(out, x.reshape(new) * 2.0)


@pytest.mark.parametrize("name", catalogue.names())
@pytest.mark.parametrize("shape", [(8, 64), (5, 37)])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_catalogue_fusion_vs_its_torch_reference(name, shape, dtype):
    entry = catalogue.get(name)
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, *shape, dtype=dtype)  # fresh seed each run
    outs = evaluate(fd.fusion, inputs)
    wants = entry.torch_reference(inputs, 1e-6)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    assert len(outs) == len(wants) == len(fd.fusion.outputs)
    for o, w in zip(outs, wants):
        assert o.dtype == w.dtype == tdtype and o.shape == w.shape
        if dtype == "bf16":
            # Both compute in float32 and round to bf16; summation order may differ by a unit.
            torch.testing.assert_close(o, w, rtol=1.6e-2, atol=5e-2)
        else:
            torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-4)
    # And the float64 run agrees with both within float32 error.
    outs64 = evaluate(fd.fusion, inputs, promote_to_double=True)
    for o64, w in zip(outs64, wants):
        assert o64.dtype == torch.float64
        torch.testing.assert_close(o64, w.double(), rtol=3e-2 if dtype == "bf16" else 1e-4,
                                   atol=1e-1 if dtype == "bf16" else 1e-4)


def test_an_ordered_output_with_an_expanded_dim():
    """An output laid out by stride_order whose dim 0 is expanded (stride 0, one element for
    all its positions, as the executor allocates it): the reference lays it out so too, where a
    copy into the stride-0 tensor failed (fuzz 20261404:885)."""
    from pyfuser import FusionDefinition
    x = torch.randint(0, 4, (1, 4, 5, 8))
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        both = fd.ops.logical_and(fd.ops.le(fd.ops.expand(t, [8, -1, -1, -1]), 0),
                                  fd.ops.lt(t, 2))
        fd.add_output(fd.ops.stride_order(both, [1, 0, 2, 3]))
    out, = evaluate(fd.fusion, [x])
    want = ((x <= 0) & (x < 2)).expand(8, -1, -1, -1)
    assert torch.equal(out, want) and out.stride(0) == 0

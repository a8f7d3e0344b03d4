"""float8 e4m3fn / e5m2 on the CPU: the reference evaluator's casts against torch's, bit for bit
(every float8 bit pattern, float32 specials, boundaries and rounding ties), and the kernel-IR
interpreter against the reference at odd sizes (the device library's conversions are compiled
in tests/codegen/test_float8_codegen.py; runtime/float8.py states the rules they share)."""
import math
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.dtype import to_torch
from pyfuser.runtime.reference import evaluate

E4M3, E5M2 = DataType.Float8_e4m3fn, DataType.Float8_e5m2
FLOAT8 = (E4M3, E5M2)
F32, BF16, F16, F64 = DataType.Float, DataType.BFloat16, DataType.Half, DataType.Double

ALL_BITS = torch.arange(256, dtype=torch.int32).to(torch.uint8)

# float32 values where a conversion into float8 can go wrong: signed zeros and infinities, NaN
# of both signs, e4m3fn's largest finite value and the values past it (464 is the tie between
# 448 and the NaN pattern, 480 e4m3fn's first value out of range), e5m2's largest finite value,
# the tie 61440 that rounds to inf and the values around it, subnormal ties (2^-10 halfway
# between 0 and e4m3fn's least subnormal, 3 * 2^-10 between two subnormals: to the even one),
# normal ties (1 + 2^-4 to 1, 1 + 3 * 2^-4 to 1.25 in e4m3fn), e5m2's subnormals, float32
# subnormals and values far out of range.
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 448.0, -448.0, 449.0, 463.99,
            464.0, -464.0, 464.01, 479.99, 480.0, 1e6, -1e30, 57344.0, 57345.0, 61439.99, 61440.0,
            -61440.0, 65536.0, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -9, -(2.0 ** -10) * 1.0001,
            1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4, -(1 + 2.0 ** -4), 2.0 ** -16, 2.0 ** -17,
            3 * 2.0 ** -17, 1.5 * 2.0 ** -16, 1e-40, -1e-40, 0.1, -0.3, 3.14159, 240.0, 250.0,
            2.0 ** -6, 0.875 * 2.0 ** -6]


def _bits(t: torch.Tensor) -> list:
    """A float8 tensor's bit patterns, a wider float tensor's values with NaN as 'nan' (so that
    lists compare NaN positions and every other value exactly)."""
    if t.element_size() == 1:
        return t.view(torch.uint8).flatten().tolist()
    return ["nan" if math.isnan(v) else v for v in t.double().flatten().tolist()]


def _casts(src: torch.Tensor, targets) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.from_pytorch(src)
        for dt in targets:
            fd.add_output(fd.ops.cast(x, dt))
    return fd


def _interpreted(fd, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no fallback to the reference
        outs = fd.execute(inputs, options={"enable": ["interpret"]})
    assert (fd.last_run.kind, fd.last_run.backend) == ("kernels", "interpreter")
    return outs


def test_torch_saturates_e4m3fn_and_overflows_e5m2_to_inf():
    """The semantics every path mirrors, as this torch has them (torch 2.13: e4m3fn saturates
    out-of-range values and inf to +-448; older releases gave NaN)."""
    x = torch.tensor([500.0, math.inf, -1e6, 61440.0, 61439.0, math.nan, -math.nan])
    assert _bits(x.to(torch.float8_e4m3fn)) == [0x7e, 0x7e, 0xfe, 0x7e, 0x7e, 0x7f, 0xff]
    assert _bits(x.to(torch.float8_e5m2)) == [0x60, 0x7c, 0xfc, 0x7c, 0x7b, 0x7f, 0xff]


@pytest.mark.parametrize("promote", [False, True])
@pytest.mark.parametrize("src", FLOAT8)
def test_every_float8_bit_pattern_widens_as_torch(src, promote):
    x = ALL_BITS.view(to_torch(src))
    fd = _casts(x, [F32, BF16, F16, F64])
    for dt, out in zip([F32, BF16, F16, F64], evaluate(fd.fusion, [x], promote_to_double=promote)):
        want = x.to(to_torch(dt))
        assert _bits(out) == _bits(want), dt
    # NaN keeps its sign into float32 (0xff is -NaN): a round trip gives the same bits.
    back = evaluate(_casts(x.float(), [src]).fusion, [x.float()])[0]
    assert _bits(back) == list(range(256)) if src == E4M3 else _bits(back) == _bits(
        x.float().to(to_torch(src)))


@pytest.mark.parametrize("promote", [False, True])
@pytest.mark.parametrize("src", [F32, BF16, F16, F64])
def test_casts_into_float8_are_torch_bit_for_bit(src, promote):
    x = torch.tensor(SPECIALS, dtype=torch.float64).to(to_torch(src))
    fd = _casts(x, FLOAT8)
    for dt, out in zip(FLOAT8, evaluate(fd.fusion, [x], promote_to_double=promote)):
        want = x.to(to_torch(dt))
        got = out.to(to_torch(dt)) if promote else out
        assert out.dtype == (torch.float64 if promote else to_torch(dt))
        assert _bits(got) == _bits(want), (src, dt)


def test_the_float64_run_rounds_float8_values():
    # In the float64 oracle a float8 value is rounded (and saturated) where it is made: pads
    # with an out-of-range value and sums of float8 data cast to float see float8 values.
    x = torch.tensor([1.0, 300.0, 0.3, -1000.0])
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        q = fd.ops.cast(fd.ops.mul(t, 2.0), E4M3)
        fd.add_output(fd.ops.pad(q, [1, 0], 1000.0))
        fd.add_output(fd.ops.sum(fd.ops.cast(q, F32)))
    padded, total = evaluate(fd.fusion, [x], promote_to_double=True)
    assert padded.tolist() == [448.0, 2.0, 448.0, 0.625, -448.0]
    assert total.item() == 2.0 + 448.0 + 0.625 - 448.0


ODD_SHAPES = [(37, 129), (3, 1021), (1, 7)]


@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("src", [F32, BF16, F16])
def test_interpreter_casts_into_float8_equal_the_reference(src, shape):
    x = torch.randn(shape) * 200
    flat = x.view(-1)
    flat[:len(SPECIALS)] = torch.tensor(SPECIALS)[:flat.numel()]
    x = x.to(to_torch(src))
    fd = _casts(x, FLOAT8)
    for dt, out, ref in zip(FLOAT8, _interpreted(fd, [x]), evaluate(fd.fusion, [x])):
        assert out.dtype == to_torch(dt)
        assert _bits(out) == _bits(ref) == _bits(x.to(to_torch(dt))), (src, dt)


@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("src", FLOAT8)
def test_interpreter_widens_float8_as_the_reference(src, shape):
    n = math.prod(shape)
    x = ALL_BITS.repeat(n // 256 + 1)[:n].reshape(shape).view(to_torch(src))
    targets = [F32, BF16, F16, F64] + [dt for dt in FLOAT8 if dt != src]
    fd = _casts(x, targets)
    for dt, out, ref in zip(targets, _interpreted(fd, [x]), evaluate(fd.fusion, [x])):
        assert _bits(out) == _bits(ref), (src, dt)


@pytest.mark.parametrize("dt", FLOAT8)
def test_float8_data_moves_through_kernels(dt):
    """Copies, a transpose, windows (slice, pad, cat), a gather and where keep float8 bits:
    each is a plain read of one-byte elements, vectorized where the layout allows."""
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(33, 48, generator=gen) * 8).to(to_torch(dt))
    b = (torch.randn(33, 48, generator=gen) * 8).to(to_torch(dt))
    idx = torch.randint(0, 33, (5,), generator=gen)
    mask = torch.rand(33, 48, generator=gen) < 0.5
    with FusionDefinition() as fd:
        ta, tb, ti, tm = (fd.from_pytorch(t) for t in (a, b, idx, mask))
        fd.add_output(fd.ops.permute(ta, [1, 0]))
    with FusionDefinition() as fd2:
        ta, tb, ti, tm = (fd2.from_pytorch(t) for t in (a, b, idx, mask))
        fd2.add_output(fd2.ops.cat([fd2.ops.slice(ta, [0, 3], [33, 48]), tb], 1))
        fd2.add_output(fd2.ops.pad(tb, [2, 1], 500.0))
        fd2.add_output(fd2.ops.where(tm, ta, tb))
    with FusionDefinition() as fd3:
        ta, ti = fd3.from_pytorch(a), fd3.from_pytorch(idx)
        fd3.add_output(fd3.ops.index_select(ta, ti, 0))
    for f, inputs in ((fd, [a, b, idx, mask]), (fd2, [a, b, idx, mask]), (fd3, [a, idx])):
        outs = _interpreted(f, inputs)
        refs = evaluate(f.fusion, inputs)
        for out, ref in zip(outs, refs):
            assert out.dtype == to_torch(dt) and out.shape == ref.shape
            assert _bits(out) == _bits(ref)
    # The pad's fill converts as a cast does: 500 saturates in e4m3fn, rounds to 512 in e5m2.
    assert refs is not None
    pad = evaluate(fd2.fusion, [a, b, idx, mask])[1]
    assert pad[0, 0].item() == (448.0 if dt == E4M3 else 512.0)


def test_quantization_with_amax_equals_torch_bit_for_bit():
    """The fp8 recipe (amax, scale, clamp, cast: FUSIONS.md's fp8_quant) on the interpreter
    equals torch's float32 computation of it, bit for bit."""
    x = (torch.randn(29, 257) * 3).bfloat16()
    with FusionDefinition() as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        amax = fd.ops.max(fd.ops.abs(xf))
        y = fd.ops.mul(xf, fd.ops.div(448.0, amax))
        y = fd.ops.minimum(fd.ops.maximum(y, -448.0), 448.0)
        fd.add_output(fd.ops.cast(y, E4M3))
        fd.add_output(amax)
    q, amax = _interpreted(fd, [x])
    xf = x.float()
    want_amax = xf.abs().amax()
    want = (xf * (448.0 / want_amax)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    assert amax.item() == want_amax.item()
    assert _bits(q) == _bits(want)
    assert q.float().abs().max().item() == 448.0

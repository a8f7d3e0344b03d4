"""Factories: iota (fd.ops.iota, nvFuser's signature) and the triu/tril masks built from it.

The reference evaluator against torch; generated kernels on the interpreter against the float64
reference on odd sizes, with every output element written once; definition errors; the causal
softmax compiled for sm_90a with its ptxas report read."""
import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import IotaOp
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


@pytest.mark.parametrize("dtype, tdtype, start, step", [
    (DataType.Int, torch.int64, 0, 1), (DataType.Int32, torch.int32, 7, -3),
    (DataType.Float, torch.float32, 2.5, 0.25), (DataType.Double, torch.float64, -1.0, 1e-3),
    (DataType.Half, torch.float16, 0.0, 0.5), (DataType.BFloat16, torch.bfloat16, 1.0, 2.0)])
def test_iota_is_arange_times_step_plus_start(dtype, tdtype, start, step):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.iota(37, start, step, dtype=dtype))
    want = (torch.arange(37, dtype=torch.float64) * step + start).to(tdtype)
    got = evaluate(fd.fusion, [])[0]
    assert got.dtype == tdtype and torch.equal(got, want)
    run_and_check(fd, [], scheduler="pointwise", options=INTERPRET)
    assert isinstance(fd.fusion.outputs[0].definition, IotaOp)


def test_iota_of_a_symbolic_length_beside_a_tensor():
    """The length is x's dim: the iota's dim is x's, indexed from the kernel's loops."""
    x = torch.randn(5, 131)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.Float)
        i = fd.ops.iota(tx.domain.logical[1].extent, 3, 2, dtype=DataType.Float)
        fd.add_output(fd.ops.mul(tx, fd.ops.broadcast(i, [True, False])))
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)
    got = fd.execute([x], options=INTERPRET)[0]
    torch.testing.assert_close(got, x * (torch.arange(131) * 2 + 3))


def test_iota_of_length_one_holds_start():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, fd.ops.broadcast(fd.ops.iota(1, 4.0, 9.0, DataType.Float),
                                                     [True, False])))
    x = torch.randn(6, 1)
    run_and_check(fd, [x], options=INTERPRET)
    torch.testing.assert_close(fd.execute([x], options=INTERPRET)[0], x + 4)


@pytest.mark.parametrize("op", ["triu", "tril"])
@pytest.mark.parametrize("diagonal", [-3, 0, 2, 40])
@pytest.mark.parametrize("shape", [(9, 13), (2, 17, 5), (3, 1, 7, 7)])
def test_triu_and_tril_match_torch(op, diagonal, shape):
    x = torch.randn(shape)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1] * len(shape), dtype=DataType.Float)
        fd.add_output(getattr(fd.ops, op)(tx, diagonal))
    torch.testing.assert_close(evaluate(fd.fusion, [x])[0], getattr(torch, op)(x, diagonal))
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)


def _causal_softmax(dtype=DataType.BFloat16):
    """softmax over the last dim of x [..., S, S] with the elements above the diagonal masked
    to -inf, the mask made in the kernel from two iotas."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        rows, cols = (fd.ops.iota(i.extent, dtype=DataType.Int32) for i in x.domain.logical[2:])
        keep = fd.ops.le(fd.ops.broadcast(cols, [True, False]),
                         fd.ops.broadcast(rows, [False, True]))
        xm = fd.ops.where(keep, xf, float("-inf"))
        e = fd.ops.exp(fd.ops.sub(xm, fd.ops.max(xm, [3], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [3], keepdim=True)), dtype))
    return fd


@pytest.mark.parametrize("shape", [(2, 3, 67, 67), (1, 2, 5, 300)])
def test_causal_softmax_with_the_mask_built_in_the_kernel(shape):
    x = torch.randn(shape).bfloat16()
    fd = _causal_softmax()
    run_and_check(fd, [x], scheduler="inner_persistent", options=INTERPRET)
    s = x.float().masked_fill(torch.ones(shape[2:], dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(fd.execute([x], options=INTERPRET)[0].float(),
                               torch.softmax(s, -1), atol=1e-2, rtol=1e-2)


def test_causal_softmax_compiles_without_spills():
    fd = _causal_softmax()
    x = torch.empty(4, 32, 2048, 2048, dtype=torch.bfloat16, device="meta")
    seg, = fd.explain([x], device="h100", compile=True).segments
    assert (seg.kind, seg.name) == ("kernel", "inner_persistent")
    assert re.search(r"\d+ registers, .*0 B stack, 0 B spill stores, 0 B spill loads",
                     seg.kernel.ptxas), seg.kernel.ptxas


@pytest.mark.parametrize("call, message", [
    (lambda fd: fd.ops.iota(0), "length 0 must be a positive int"),
    (lambda fd: fd.ops.iota(4, dtype=DataType.Bool), "dtype must be an integer or floating"),
    (lambda fd: fd.ops.iota(4, 0.5, dtype=DataType.Int), "start"),
    (lambda fd: fd.ops.iota(fd.define_scalar(1.5)), "length 1.5 must be a positive int"),
    (lambda fd: fd.ops.iota(fd.define_scalar(dtype=DataType.Float)), "must be an int scalar"),
    (lambda fd: fd.ops.triu(fd.define_tensor([-1], dtype=DataType.Float)), "rank 1"),
    (lambda fd: fd.ops.tril(fd.define_tensor([-1, -1], dtype=DataType.Float), 0.5),
     "diagonal must be an int"),
])
def test_factory_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd)

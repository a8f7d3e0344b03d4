"""argmax and argmin (fd.ops.argmax / argmin, built as a max or min and the least index where x
holds it or is NaN): the reference evaluator and the generated kernels on the interpreter equal
torch exactly, on ties, NaN, inf, bf16 and int32 inputs, any dim, None (the flattened tensor)
and keepdim; a row argmax is one normalization kernel; definition errors."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
NAN, INF = float("nan"), float("inf")


def _inputs():
    ties = (torch.randn(37, 1001) * 2).round()          # many equal values per row
    special = torch.tensor([[1.0, NAN, 3.0, NAN], [2.0, 5.0, 5.0, 1.0],
                            [-INF, -INF, -INF, -INF], [INF, 0.0, INF, -0.0]])
    return {
        "float_ties": ties,
        "nan_inf": special,
        "bf16": ties.bfloat16(),
        "int32": ties.to(torch.int32),
        "transposed": ties.t(),
    }


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dim, keepdim", [(1, False), (0, True), (-1, True), (None, False),
                                          (None, True)])
@pytest.mark.parametrize("kind", list(_inputs()))
def test_matches_torch_exactly(name, dim, keepdim, kind):
    x = _inputs()[kind]
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), dim, keepdim))
    want = (getattr(torch, name)(x, keepdim=keepdim) if dim is None
            else getattr(torch, name)(x, dim, keepdim=keepdim))
    assert torch.equal(evaluate(fd.fusion, [x])[0], want)
    run_and_check(fd, [x], kernels=0, options=INTERPRET)
    assert fd.last_run.kind == "kernels"
    out, = fd.execute([x], options=INTERPRET)
    assert out.dtype == torch.int64 and torch.equal(out, want)


def test_a_row_argmax_is_one_normalization_kernel():
    x = torch.randn(33, 2049).bfloat16()
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x), 1))
    run_and_check(fd, [x], scheduler="inner_persistent", options=INTERPRET)


def test_a_rank_0_tensor_has_index_0():
    x = torch.tensor(3.0)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x)))
    assert torch.equal(evaluate(fd.fusion, [x])[0], torch.argmax(x))


def test_an_empty_dim_is_an_error_as_in_torch():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.define_tensor([-1, -1]), 1))
    with pytest.raises(InputError, match="of no elements has no value"):
        fd.execute([torch.randn(5, 0)], options=INTERPRET)


@pytest.mark.parametrize("call, message", [
    (lambda fd, x: fd.ops.argmax(fd.ops.gt(x, 0.0), 1), "bool tensors have no argmax"),
    (lambda fd, x: fd.ops.argmin(x, [0, 1]), "dim must be an int or None"),
    (lambda fd, x: fd.ops.argmax(x, 2), "dim 2 is out of range"),
])
def test_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7]))

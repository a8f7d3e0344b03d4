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


@pytest.mark.parametrize("cols, refused", [(128256, True), (32000, False)])
def test_long_rows_of_an_argmax_are_read_twice_not_held_in_a_cluster(cols, refused):
    """Rows split over a cluster of 4 or more blocks only to feed reductions (every output is
    per row) are refused by the inner persistent heuristic, and the plan becomes two reduction
    kernels that read the rows again (1824 against 1149 GB/s on the H200 at 128256 bf16); a
    row held by one block or a cluster of 2 keeps the persistent kernel, and so does a
    softmax of long rows (its output runs along the row)."""
    x = torch.empty(64, cols, dtype=torch.bfloat16, device="meta")
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x), 1))
    seg, = fd.explain([x], device="h100").segments
    assert seg.name == "inner_persistent" and bool(seg.refused) == refused, seg.refused
    if refused:
        assert "only to feed reductions" in seg.refused
        assert [(s.kind, s.name) for s in seg.again.segments] == [("kernel", "reduction")] * 2
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    seg, = fd.explain([x], device="h100").segments
    assert seg.name == "inner_persistent" and not seg.refused
